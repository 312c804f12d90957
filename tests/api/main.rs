//! Integration tests: the real gRPC server on a loopback port, a fresh SQLite file per
//! test, the generated client (and the real grpcurl in `grpcurl`).

mod helpers;

mod backup;
mod cli;
mod eval;
mod extender;
mod grpcurl;
mod health;
mod kace;
mod kubernetes_watch;
mod lifecycle;
mod logging;
mod ncu;
mod occupancy;
mod operations;
mod place;
mod predict;
mod profiles;
mod progress;
mod rank;
mod report;
mod restart;
mod train;
mod worker;
mod workloads;
