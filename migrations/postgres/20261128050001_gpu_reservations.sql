-- GPU slots held between the scheduler extender's decision and the pod's bind, as
-- migrations/20261128050001_gpu_reservations.sql keeps them on SQLite (same columns, key and
-- checks).
CREATE TABLE gpu_reservations (
    node             TEXT    NOT NULL,
    gpu_id           TEXT    NOT NULL,
    resident_version TEXT    NOT NULL,
    ordinal          BIGINT  NOT NULL CHECK (ordinal >= 0),
    holder           TEXT    NOT NULL,
    workload         TEXT    NOT NULL,
    reserved_at_ms   BIGINT  NOT NULL,
    expires_at_ms    BIGINT  NOT NULL,
    PRIMARY KEY (node, gpu_id, resident_version, ordinal)
);
CREATE INDEX gpu_reservations_by_expiry ON gpu_reservations (expires_at_ms);
