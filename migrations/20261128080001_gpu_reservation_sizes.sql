-- What a hold takes on its GPU as HAMi will account it once the pod is bound (the pod's
-- nvidia.com/gpumem in MiB and nvidia.com/gpucores, HAMi's own reading of them;
-- src/extender/binding/hami.rs): a live hold counts as one more container of that size, so
-- that two pods decided before either is bound are never both sent to a GPU HAMi can fit
-- only one of. 0 for holds that carry no HAMi request (DRA, older rows).
ALTER TABLE gpu_reservations ADD COLUMN mem_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpu_reservations ADD COLUMN cores BIGINT NOT NULL DEFAULT 0;
