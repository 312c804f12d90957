-- One row the store rewrites while its writes fail, to notice by itself when they succeed
-- again (store/health.rs).
CREATE TABLE write_probe (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    written_at_ms INTEGER NOT NULL
);
