-- The occupancy's version, bumped by every transaction that changes cluster_gpus or
-- cluster_jobs. Each writer of the occupancy (one per server, several servers on one
-- database) checks it inside its write transaction: a version other than the one its copy
-- was read at means another server wrote, and the copy is read again before any
-- assignment is decided, so two servers never book the same job or the same GPU's last
-- place twice.
CREATE TABLE occupancy_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT INTO occupancy_version (id, version) VALUES (1, 0);
