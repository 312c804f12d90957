-- The cluster's occupancy, as schedulers tell coloc through AssignJob and ReleaseJob, so that
-- Place can answer against it without the whole cluster in each request (README,
-- "Occupancy").
--
-- A GPU is known from its first job on; it keeps its node and GPU model for good and stays
-- (empty) when its last job is released.
CREATE TABLE cluster_gpus (
    -- The scheduler's opaque id of one physical GPU.
    id   TEXT PRIMARY KEY,
    node TEXT NOT NULL DEFAULT '',
    -- The GPU model's name, as profiles and models name it (no foreign key: a GPU of a
    -- model coloc knows nothing of yet is still occupied).
    gpu  TEXT NOT NULL
);

-- One running job. The workload is named, not referenced: deleting a workload does not
-- free the GPUs its jobs still occupy. A job with a lease (expires_at_ms) that nobody
-- renewed or released expires by itself: it is ignored from that moment and deleted with
-- the next write.
CREATE TABLE cluster_jobs (
    job_id         TEXT    PRIMARY KEY,
    gpu_id         TEXT    NOT NULL REFERENCES cluster_gpus (id),
    workload       TEXT    NOT NULL,
    assigned_at_ms INTEGER NOT NULL,
    -- NULL = no lease: the job stays until released.
    expires_at_ms  INTEGER
);
CREATE INDEX cluster_jobs_by_gpu ON cluster_jobs (gpu_id);

-- A reported colocated run may name the GPU it ran on (cluster_gpus.id), so that
-- occupancy and training data agree; '' when the reporter did not say.
ALTER TABLE observations ADD COLUMN gpu_id TEXT NOT NULL DEFAULT '';
