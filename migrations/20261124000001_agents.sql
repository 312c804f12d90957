-- Profiling agents (README, "Profiling agents"): a workload gets one profiling job per GPU
-- model it is to be profiled on, claimed by an agent on a node with that GPU model (or by
-- the in-process worker) under a lease the holder renews while it measures.
--
-- profiling_jobs is rebuilt because its UNIQUE constraint changes from one job per
-- workload to one job per (workload, GPU model); SQLite cannot alter a constraint in
-- place. Every existing job is kept, with gpu = '' ("any GPU model": what it meant before).
CREATE TABLE profiling_jobs_by_gpu (
    id               INTEGER PRIMARY KEY,
    workload_id      INTEGER NOT NULL REFERENCES workloads (id) ON DELETE CASCADE,
    -- The GPU model to profile on; '' = any (the single-machine default).
    gpu              TEXT    NOT NULL DEFAULT '',
    state            TEXT    NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed')),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error       TEXT    NOT NULL DEFAULT '',
    -- The job is not claimed before this time (retry backoff).
    not_before_ms    INTEGER NOT NULL DEFAULT 0,
    created_at_ms    INTEGER NOT NULL,
    updated_at_ms    INTEGER NOT NULL,
    -- Claims so far: the current claim's token. A renewal or submission naming an older
    -- claim comes from a holder that lost the job (its lease expired) and is refused.
    claims           INTEGER NOT NULL DEFAULT 0 CHECK (claims >= 0),
    -- Who holds the running job: an agent id, or 'in-process'; '' when not running.
    claim_holder     TEXT    NOT NULL DEFAULT '',
    -- A running job whose lease expired goes back to pending; 0 = no lease (the
    -- in-process worker: a crash of the server re-queues it at the next start).
    lease_expires_ms INTEGER NOT NULL DEFAULT 0,
    -- The holder's last progress note (RenewLease).
    progress         TEXT    NOT NULL DEFAULT '',
    UNIQUE (workload_id, gpu)
);

INSERT INTO profiling_jobs_by_gpu (id, workload_id, gpu, state, attempts, last_error,
    not_before_ms, created_at_ms, updated_at_ms, claim_holder)
SELECT id, workload_id, '', state, attempts, last_error, not_before_ms, created_at_ms,
    updated_at_ms, CASE WHEN state = 'running' THEN 'in-process' ELSE '' END
FROM profiling_jobs;

DROP TABLE profiling_jobs;
ALTER TABLE profiling_jobs_by_gpu RENAME TO profiling_jobs;
CREATE INDEX profiling_jobs_by_state ON profiling_jobs (state, not_before_ms);

-- Agents that announced themselves. An agent is live while it was seen (announce, claim,
-- renewal, submission) within agents.live_secs; new workloads are routed to the GPU
-- models of live agents.
CREATE TABLE agents (
    id             TEXT    PRIMARY KEY,
    node           TEXT    NOT NULL DEFAULT '',
    gpu            TEXT    NOT NULL,
    gpu_memory_gb  REAL    NOT NULL CHECK (gpu_memory_gb > 0),
    ncu_version    TEXT    NOT NULL DEFAULT '',
    backend        TEXT    NOT NULL DEFAULT '',
    announced_at_ms INTEGER NOT NULL,
    last_seen_ms   INTEGER NOT NULL,
    -- The job in hand; NULL when idle (and when the job's workload was deleted).
    job_id         INTEGER REFERENCES profiling_jobs (id) ON DELETE SET NULL
);
