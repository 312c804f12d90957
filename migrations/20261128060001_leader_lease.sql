-- Leadership among the servers sharing one database (docs/replicas.md): one row, the lease.
-- `holder` names the server holding it, `expires_at_ms` is on the database's clock (never a
-- server's), and `token`, the fencing token, grows by one each time the lease changes hands
-- (or is taken again after it ran out), so that a deposed leader's late write, checked
-- against it in the same transaction, is refused. Portable SQL; the PostgreSQL twin is
-- migrations/postgres/20261128060001_leader_lease.sql.
CREATE TABLE leader_lease (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    holder        TEXT    NOT NULL,
    token         BIGINT  NOT NULL CHECK (token >= 1),
    acquired_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT  NOT NULL
);
