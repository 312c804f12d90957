-- Re-profiles queued for suspect profiles, as migrations/20261128040001_reprofile_requests.sql
-- keeps them on SQLite (same columns and key): one row per (workload, GPU model, the suspect
-- profile's measured_at_ms), so that a suspect profile queues its re-profile once.
CREATE TABLE reprofile_requests (
    workload_id            BIGINT NOT NULL REFERENCES workloads (id) ON DELETE CASCADE,
    gpu                    TEXT   NOT NULL,
    profile_measured_at_ms BIGINT NOT NULL,
    requested_at_ms        BIGINT NOT NULL,
    PRIMARY KEY (workload_id, gpu, profile_measured_at_ms)
);
