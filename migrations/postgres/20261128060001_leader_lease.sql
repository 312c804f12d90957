-- Leadership among the servers sharing one database, as
-- migrations/20261128060001_leader_lease.sql keeps it on SQLite (same columns and checks):
-- one row; the holder, the fencing token (one more at every change of holder) and the
-- expiry on the database's clock.
CREATE TABLE leader_lease (
    id            BIGINT  PRIMARY KEY CHECK (id = 1),
    holder        TEXT    NOT NULL,
    token         BIGINT  NOT NULL CHECK (token >= 1),
    acquired_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT  NOT NULL
);
