//! Integration tests: the real gRPC server on a loopback port, a fresh SQLite file per
//! test, the generated client (and the real grpcurl in `grpcurl`).

mod helpers;

mod agents;
mod backup;
mod bounds;
mod cli;
mod damaged;
mod docs;
mod eval;
mod export;
mod extender;
mod faults;
mod fetch_data;
mod grpcurl;
mod health;
mod hostile;
mod import;
mod kace;
mod kubernetes_watch;
mod lifecycle;
mod limits;
mod logging;
mod model_report;
mod ncu;
mod occupancy;
mod operations;
mod place;
mod ports;
mod predict;
mod profiles;
mod readonly;
mod progress;
mod rank;
mod report;
mod restart;
mod schema;
mod sim;
mod starter;
mod train;
mod trust;
mod undo;
mod upload;
mod walk_through;
mod worker;
mod workloads;
