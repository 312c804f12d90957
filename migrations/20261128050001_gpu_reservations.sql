-- GPU slots held between the scheduler extender's decision and the pod's bind (extender.binding
-- hami or dra; docs/stacks/): one row per slot, keyed by the GPU, the version of its resident
-- set the decision saw and how many live holds it saw there before (ordinal), so that two
-- deciders (two replicas, or two pods back to back) that saw the same state compete for one
-- key and the store picks one. A row counts while it has not expired and its version is the
-- GPU's current one. Portable SQL: migrations/postgres/ carries the same table.
CREATE TABLE gpu_reservations (
    node             TEXT    NOT NULL,
    gpu_id           TEXT    NOT NULL,
    resident_version TEXT    NOT NULL,
    ordinal          BIGINT  NOT NULL CHECK (ordinal >= 0),
    -- Who holds it: the pod (namespace/name, or the admission request's uid when the pod
    -- has no name yet) and the workload it runs.
    holder           TEXT    NOT NULL,
    workload         TEXT    NOT NULL,
    reserved_at_ms   BIGINT  NOT NULL,
    expires_at_ms    BIGINT  NOT NULL,
    PRIMARY KEY (node, gpu_id, resident_version, ordinal)
);
CREATE INDEX gpu_reservations_by_expiry ON gpu_reservations (expires_at_ms);
