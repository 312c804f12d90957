-- The runs the observer formed from the cluster's timeline, as
-- migrations/20261128030001_observer_runs.sql keeps them on SQLite (same columns and checks):
-- one row per window, keyed by the GPU, the pods' UIDs and the window.
CREATE TABLE observer_runs (
    run_key         TEXT    PRIMARY KEY,
    kind            TEXT    NOT NULL CHECK (kind IN ('colocated', 'solo')),
    gpu             TEXT    NOT NULL,
    gpu_id          TEXT    NOT NULL,
    window_start_ms BIGINT  NOT NULL,
    window_end_ms   BIGINT  NOT NULL,
    observation_id  BIGINT,
    workload        TEXT,
    throughput      DOUBLE PRECISION,
    recorded_at_ms  BIGINT  NOT NULL
);
CREATE INDEX observer_runs_by_workload ON observer_runs (gpu, workload, window_end_ms);
