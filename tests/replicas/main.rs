//! Replicas sharing one database: the leader's lease and its fencing token on both engines
//! (`lease`: a real SQLite file and a fresh database on the real PostgreSQL server), and
//! three `coloc serve` processes on loopback sharing one PostgreSQL database (`processes`:
//! a killed leader replaced, a paused leader's late writes refused, a promotion reaching
//! every replica; `rolling`: readiness and a rolling restart under Rank calls), and
//! `occupancy`: two replicas' stores under 10,000 concurrent AssignJob attempts on one
//! database of either engine, never double-booking; `coloc bench` measuring two
//! in-process replicas (`bench`).
//!
//! PostgreSQL: 127.0.0.1:5432, trust auth, database `test` for the administration
//! (`COLOC_TEST_POSTGRES` names another server); each test creates its own database and
//! drops it. Skipped with a message where no server answers, except under CI
//! (`CI` set), where that fails.

#[path = "../common/free_port.rs"]
mod free_port;
mod bench;
mod lease;
mod occupancy;
mod pg;
mod processes;
mod rolling;
