-- Re-profiles queued because stored runs contradict a profile's exclusive throughput (a
-- suspect profile: at least 3 runs above it beyond the 10 % noise margin, docs/api.md
-- "Trustworthy defaults"). One row per (workload, GPU model, the suspect profile's
-- measured_at_ms): a suspect profile queues its re-profile once, not on every run or
-- retraining that finds it suspect again; a new profile, if it too is suspect, may queue one.
CREATE TABLE reprofile_requests (
    workload_id            INTEGER NOT NULL REFERENCES workloads (id) ON DELETE CASCADE,
    gpu                    TEXT    NOT NULL,
    profile_measured_at_ms INTEGER NOT NULL,
    requested_at_ms        INTEGER NOT NULL,
    PRIMARY KEY (workload_id, gpu, profile_measured_at_ms)
);
