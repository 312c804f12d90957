-- The audit trail of operators' undo calls (DeleteRuns, ForgetGpus, DeleteProfile; docs/
-- operations.md, "Undoing mistakes"): who changed what, when, and how many rows went. Rows
-- are only ever added. Written in portable SQL (no SQLite-only types or functions) so that
-- the PostgreSQL schema can carry the same table (there, id as a generated identity).
CREATE TABLE audit (
    id        INTEGER PRIMARY KEY,
    at_ms     BIGINT  NOT NULL,
    -- The caller's actor, the token's role and the peer address.
    actor     TEXT    NOT NULL,
    action    TEXT    NOT NULL CHECK (action IN ('delete_runs', 'forget_gpus', 'delete_profile')),
    -- The selector and what it matched, for people.
    what      TEXT    NOT NULL,
    row_count BIGINT  NOT NULL CHECK (row_count >= 0),
    -- What the retraining that followed did; '' when none followed.
    retrained TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX audit_by_time ON audit (at_ms);
