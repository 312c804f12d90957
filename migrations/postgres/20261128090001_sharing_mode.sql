-- How the GPU was shared during a run: 'mps' (CUDA MPS: kernels of the members run
-- concurrently) or 'time-slicing' (their contexts take turns). Every run stored before this
-- column existed is MPS, as every shipped dataset is (docs/decisions/030-sharing-mode.md).
-- The twin of migrations/20261128090001_sharing_mode.sql.
ALTER TABLE observations ADD COLUMN sharing_mode TEXT NOT NULL DEFAULT 'mps'
    CHECK (sharing_mode IN ('mps', 'time-slicing'));
