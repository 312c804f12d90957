-- The catalog's version: bumped by every change of workloads, profiles or GPU models,
-- whatever wrote it (a server, `coloc import`), by the triggers below. Each server reads it
-- every `leader.model_poll_ms` and, when it moved, reads the profiles again, so a workload
-- registered or profiled through one replica is served by all of them (docs/replicas.md).
-- Portable SQL; the PostgreSQL twin is migrations/postgres/20261128100001_catalog_version.sql.
CREATE TABLE catalog_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT  NOT NULL
);
INSERT INTO catalog_version (id, version) VALUES (1, 0);

CREATE TRIGGER workloads_inserted AFTER INSERT ON workloads
BEGIN UPDATE catalog_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER workloads_updated AFTER UPDATE ON workloads
BEGIN UPDATE catalog_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER workloads_deleted AFTER DELETE ON workloads
BEGIN UPDATE catalog_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER profiles_inserted AFTER INSERT ON profiles
BEGIN UPDATE catalog_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER profiles_updated AFTER UPDATE ON profiles
BEGIN UPDATE catalog_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER profiles_deleted AFTER DELETE ON profiles
BEGIN UPDATE catalog_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER gpus_inserted AFTER INSERT ON gpus
BEGIN UPDATE catalog_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER gpus_updated AFTER UPDATE ON gpus
BEGIN UPDATE catalog_version SET version = version + 1 WHERE id = 1; END;
