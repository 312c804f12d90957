-- The catalog's version: bumped by every statement that changes workloads, profiles or
-- GPU models, whatever wrote it (a server, `coloc import`). Each server reads it every
-- `leader.model_poll_ms` and, when it moved, reads the profiles again, so a workload
-- registered or profiled through one replica is served by all of them (docs/replicas.md).
-- The twin of migrations/20261128100001_catalog_version.sql: statement-level triggers here,
-- each with its transition table, so a statement that changed no row bumps nothing (as
-- SQLite's row-level triggers do not fire then).
CREATE TABLE catalog_version (
    id      BIGINT PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO catalog_version (id, version) VALUES (1, 0);

CREATE FUNCTION bump_catalog_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A statement that changed no row (a refused delete, say) leaves the version alone.
    IF EXISTS (SELECT 1 FROM changed) THEN
        UPDATE catalog_version SET version = version + 1 WHERE id = 1;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER workloads_inserted AFTER INSERT ON workloads REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
CREATE TRIGGER workloads_updated AFTER UPDATE ON workloads REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
CREATE TRIGGER workloads_deleted AFTER DELETE ON workloads REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
CREATE TRIGGER profiles_inserted AFTER INSERT ON profiles REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
CREATE TRIGGER profiles_updated AFTER UPDATE ON profiles REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
CREATE TRIGGER profiles_deleted AFTER DELETE ON profiles REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
CREATE TRIGGER gpus_inserted AFTER INSERT ON gpus REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
CREATE TRIGGER gpus_updated AFTER UPDATE ON gpus REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
