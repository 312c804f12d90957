-- The runs the observer formed from the cluster's timeline (docs/observer.md): one row per
-- window, keyed by the GPU, the pods' UIDs and the window, so that a restart or a second
-- replica that sees the same window again stores nothing twice. A colocated window names
-- the run it stored (observations.id); a solo window keeps the exclusive throughput it
-- measured. Written in portable SQL, as its PostgreSQL twin.
CREATE TABLE observer_runs (
    run_key         TEXT    PRIMARY KEY,
    kind            TEXT    NOT NULL CHECK (kind IN ('colocated', 'solo')),
    gpu             TEXT    NOT NULL,
    gpu_id          TEXT    NOT NULL,
    window_start_ms BIGINT  NOT NULL,
    window_end_ms   BIGINT  NOT NULL,
    -- The stored run (colocated windows only).
    observation_id  BIGINT,
    -- The workload and its mean throughput alone (solo windows only).
    workload        TEXT,
    throughput      REAL,
    recorded_at_ms  BIGINT  NOT NULL
);
CREATE INDEX observer_runs_by_workload ON observer_runs (gpu, workload, window_end_ms);
