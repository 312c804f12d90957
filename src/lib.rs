//! coloc: a GPU colocation advisor. It keeps per-workload profiles (KACE's kernel and
//! system metrics) in SQLite, fits a model of colocated throughput from reported runs, and
//! answers schedulers' Rank requests over gRPC from memory.

pub mod advisor;
pub mod api;
pub mod cli;
pub mod client;
pub mod dataset;
pub mod domain;
pub mod eval;
pub mod import;
pub mod metrics;
pub mod model;
pub mod profiler;
pub mod proto;
pub mod settings;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod trainer;
pub mod worker;
