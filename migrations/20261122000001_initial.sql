-- The profile datastore of coloc.
--
-- Times are integer milliseconds since the Unix epoch (UTC). Enumerations are lowercase
-- text guarded by CHECK constraints so that a bad value can never be stored, whatever the
-- code above does.

-- A workload is a kind of job (a model, a mode, a batch size), not one running instance.
-- Its name is the key every client uses.
CREATE TABLE workloads (
    id            INTEGER PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    mode          TEXT    NOT NULL CHECK (mode IN ('training', 'inference')),
    model         TEXT    NOT NULL,
    batch_size    INTEGER NOT NULL CHECK (batch_size >= 0),
    -- A JSON object of free-form string labels.
    labels        TEXT    NOT NULL DEFAULT '{}',
    state         TEXT    NOT NULL CHECK (state IN ('pending_profile', 'profiled', 'failed')),
    state_reason  TEXT    NOT NULL DEFAULT '',
    -- How the profiling worker runs the workload (JSON launch spec); NULL when it was
    -- registered without one.
    launch        TEXT,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
);

-- A GPU model ("Tesla V100-SXM2-32GB"): profiles, observations and models are all per GPU
-- model, because the same pair behaves differently on different hardware. The memory is
-- what the memory-fit guard of Rank checks against; it may be unknown until a profile or
-- an import supplies it.
CREATE TABLE gpus (
    name      TEXT PRIMARY KEY,
    memory_gb REAL CHECK (memory_gb IS NULL OR memory_gb > 0)
);

-- One profile per workload and GPU model: the six kernel metrics and four system metrics
-- of the KACE method, measured with the workload running alone. kernel_missing = 1 when
-- Nsight Compute could not run: the kernel columns are then 0 and the profile is kept (its
-- system metrics are real) but not ranked.
CREATE TABLE profiles (
    workload_id            INTEGER NOT NULL REFERENCES workloads (id) ON DELETE CASCADE,
    gpu                    TEXT    NOT NULL REFERENCES gpus (name),
    threads                REAL    NOT NULL CHECK (threads >= 0),
    compute_throughput_pct REAL    NOT NULL CHECK (compute_throughput_pct >= 0),
    dram_throughput_pct    REAL    NOT NULL CHECK (dram_throughput_pct >= 0),
    memory_throughput_pct  REAL    NOT NULL CHECK (memory_throughput_pct >= 0),
    registers              REAL    NOT NULL CHECK (registers >= 0),
    static_shared_memory_bytes REAL NOT NULL CHECK (static_shared_memory_bytes >= 0),
    exclusive_throughput   REAL    NOT NULL CHECK (exclusive_throughput >= 0),
    throughput_unit        TEXT    NOT NULL DEFAULT '',
    sm_busy_pct            REAL    NOT NULL CHECK (sm_busy_pct >= 0),
    mem_busy_pct           REAL    NOT NULL CHECK (mem_busy_pct >= 0),
    memory_gb              REAL    NOT NULL CHECK (memory_gb >= 0),
    source                 TEXT    NOT NULL CHECK (source IN ('imported', 'client_supplied', 'measured', 'replay')),
    measured_at_ms         INTEGER NOT NULL,
    kernel_missing         INTEGER NOT NULL DEFAULT 0 CHECK (kernel_missing IN (0, 1)),
    PRIMARY KEY (workload_id, gpu)
);
CREATE INDEX profiles_by_gpu ON profiles (gpu);

-- A colocated run observed by a scheduler (or imported): the training data of the models.
-- The fingerprint (GPU, time, members and their values) makes a repeated report or a
-- repeated import a no-op instead of a duplicate row.
CREATE TABLE observations (
    id             INTEGER PRIMARY KEY,
    gpu            TEXT    NOT NULL,
    -- 0 when the time of the run is unknown (imported datasets).
    observed_at_ms INTEGER NOT NULL,
    recorded_at_ms INTEGER NOT NULL,
    source         TEXT    NOT NULL CHECK (source IN ('reported', 'imported', 'calibrated')),
    fingerprint    TEXT    NOT NULL UNIQUE,
    -- Set when training found the run outside the robust bound of its GPU model's runs: it
    -- is kept, visibly, but not trained on.
    outlier_reason TEXT,
    -- What the model in use predicted for this set when it was reported (prediction
    -- feedback: the rolling error of the model in use, and drift).
    predicted_sum  REAL,
    predicted_by_version INTEGER
);
CREATE INDEX observations_by_gpu ON observations (gpu, id);

-- Members name their workload, not its row: deleting a workload must not rewrite history,
-- and its runs become usable again if a workload of that name is registered and profiled.
CREATE TABLE observation_members (
    observation_id INTEGER NOT NULL REFERENCES observations (id) ON DELETE CASCADE,
    position       INTEGER NOT NULL CHECK (position >= 0),
    workload       TEXT    NOT NULL,
    throughput     REAL    NOT NULL CHECK (throughput >= 0),
    job_id         TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (observation_id, position)
);

-- Every model fitted for a GPU model, with its verdict. The champion — the one served —
-- is the pinned version if there is a pin, else the newest promoted version.
CREATE TABLE models (
    id            INTEGER PRIMARY KEY,
    gpu           TEXT    NOT NULL,
    version       INTEGER NOT NULL CHECK (version >= 1),
    kind          TEXT    NOT NULL,
    -- The fitted parameters as JSON; the shape depends on kind.
    parameters    TEXT    NOT NULL,
    observations  INTEGER NOT NULL CHECK (observations >= 0),
    r2            REAL    NOT NULL,
    mse           REAL    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('promoted', 'rejected')),
    -- Why it was promoted or rejected, for people.
    reason        TEXT    NOT NULL DEFAULT '',
    -- Cross-validated rank score (vs oracle) and MSE of this model's procedure and of the
    -- champion's on the same folds; NULL when there was nothing to compare.
    cv_score      REAL,
    cv_mse        REAL,
    champion_cv_score REAL,
    champion_cv_mse   REAL,
    -- The training set: the runs with id up to this one (minus outliers).
    last_observation_id INTEGER NOT NULL DEFAULT 0,
    excluded_outliers   INTEGER NOT NULL DEFAULT 0,
    UNIQUE (gpu, version)
);

-- Every training attempt and what came of it, failures included (a failed fit makes no
-- model version but is recorded here with why).
CREATE TABLE training_runs (
    id            INTEGER PRIMARY KEY,
    gpu           TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    -- What started it: 'request' (Train RPC), 'schedule' (new observations), 'drift',
    -- 'import'.
    trigger       TEXT    NOT NULL,
    outcome       TEXT    NOT NULL CHECK (outcome IN ('promoted', 'rejected', 'failed')),
    version       INTEGER,
    reason        TEXT    NOT NULL,
    started_at_ms INTEGER NOT NULL
);
CREATE INDEX training_runs_by_gpu ON training_runs (gpu, id);

-- An operator's pin: serve this version of the GPU model whatever training decides.
CREATE TABLE model_pins (
    gpu     TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    FOREIGN KEY (gpu, version) REFERENCES models (gpu, version)
);

-- Profiling work for the worker: one job per workload registered without a profile. The
-- worker claims the oldest pending job whose not_before has passed; a job found running at
-- startup was cut off by a crash and goes back to pending.
CREATE TABLE profiling_jobs (
    id            INTEGER PRIMARY KEY,
    workload_id   INTEGER NOT NULL UNIQUE REFERENCES workloads (id) ON DELETE CASCADE,
    state         TEXT    NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed')),
    attempts      INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error    TEXT    NOT NULL DEFAULT '',
    -- The job is not claimed before this time (retry backoff).
    not_before_ms INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
CREATE INDEX profiling_jobs_by_state ON profiling_jobs (state, not_before_ms);
