-- The catalog's version: bumped by every statement that changes workloads, profiles or
-- GPU models, whatever wrote it (a server, `coloc import`). Each server reads it every
-- `leader.model_poll_ms` and, when it moved, reads the profiles again, so a workload
-- registered or profiled through one replica is served by all of them (docs/replicas.md).
-- The twin of migrations/20261128100001_catalog_version.sql; statement-level triggers here.
CREATE TABLE catalog_version (
    id      BIGINT PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO catalog_version (id, version) VALUES (1, 0);

CREATE FUNCTION bump_catalog_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE catalog_version SET version = version + 1 WHERE id = 1;
    RETURN NULL;
END;
$$;

CREATE TRIGGER workloads_changed AFTER INSERT OR UPDATE OR DELETE ON workloads
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
CREATE TRIGGER profiles_changed AFTER INSERT OR UPDATE OR DELETE ON profiles
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
CREATE TRIGGER gpus_changed AFTER INSERT OR UPDATE ON gpus
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalog_version();
