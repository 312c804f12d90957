//! coloc: a GPU colocation advisor. It keeps per-workload profiles (KACE's kernel and
//! system metrics) in SQLite, fits a model of colocated throughput from reported runs, and
//! answers schedulers' Rank requests over gRPC from memory.
//!
//! This library is the service and what its tools share; the command line is the `coloc`
//! binary's (`src/bin/coloc/`: the clap tree in `args`, one file or folder per family of
//! commands: `serve`, `data` (import, export), `evaluate` over `eval` (the KACE evaluation
//! protocols, baselines, plots; the N-way protocol also through a real server's API),
//! `profiling` (agent, calibrate, ncu), `operator` (the commands that talk gRPC to a running
//! server), `bench` (the load generator) and `sim` (the cluster simulation)). Nothing here
//! imports the binary.
//!
//! A map of the house. The `pub mod` lines below are in layer order: data flows down the
//! list, and a module names (`crate::x`) only modules listed after it (no cycles; checked by
//! `tests/house.rs`, and `docs/layout.md` lists them in the same order):
//!
//! - `startup`: builds the `App` (opens the store, loads the advisor, binds), then serves and
//!   stops in order.
//! - `leader`: leadership among servers sharing one database (the lease, the leader's
//!   tasks) and every replica's copy of the store's champions.
//! - `agent`: `coloc agent`, a profiling agent on a GPU node: the `worker` loop over a gRPC
//!   job queue (`coloc.v1.ProfilingAgents`), and `coloc calibrate` over the same API.
//! - `observer`: learning from what the cluster ran: windows of a GPU's timeline and each
//!   pod's throughput (Prometheus, pushes) turned into runs by itself.
//! - `extender`: the kube-scheduler extender and its cluster watcher, over the advisor.
//! - `api`: the gRPC face: proto ↔ domain conversion, the one error → status table, auth,
//!   per-RPC middleware.
//! - `metrics` (Prometheus) and `http_server` (the one HTTP serve loop of the metrics and
//!   extender endpoints).
//! - Background tasks: `trainer` (retraining) and `worker` (the profiling job loop and its
//!   `JobQueue`: in-process over the advisor, or an agent's over gRPC; the sweep of expired
//!   leases).
//! - Tools beside the service: `import` (loading KACE-format datasets into a store) and
//!   `export` (writing a store's data of one GPU model as a KACE-format dataset, reading the
//!   store read-only).
//! - `advisor`: what each RPC does, in domain terms; the in-memory catalog Rank is served
//!   from; ranking; placement; the model lifecycle.
//! - `cluster`: the one cluster view: which GPUs each node has and who runs on each, fed by
//!   the cluster watcher, the agents' PodResources reports and AssignJob / ReleaseJob.
//! - `profiler`: measuring a workload alone (process runner, NVML sampler, Nsight Compute
//!   parser, backends, calibration).
//! - `store`: SQLite or PostgreSQL access (migrations, workloads, profiles, runs, models,
//!   jobs, occupancy).
//! - `dataset`: KACE-format files read into domain values (import, eval, replay, benches).
//! - `model`: features and model kinds, fitting and scoring.
//! - Leaves: `tokens` (bearer tokens and roles, shared by gRPC auth and the extender),
//!   `telemetry` (logging), `settings` (typed, layered settings), `sync` (poison-tolerant
//!   locks), `progress` (terminal progress bars for the offline tools), `proto` (generated
//!   types), `domain` (validated values).

pub mod startup;
pub mod leader;
pub mod agent;
pub mod observer;
pub mod extender;
pub mod api;
pub mod metrics;
pub mod http_server;
pub mod trainer;
pub mod worker;
pub mod import;
pub mod export;
pub mod advisor;
pub mod cluster;
pub mod profiler;
pub mod store;
pub mod dataset;
pub mod model;
pub mod tokens;
pub mod telemetry;
pub mod settings;
pub mod sync;
pub mod progress;
pub mod proto;
pub mod domain;
