//! A free loopback port for a test's server, shared by the test binaries that start
//! `coloc serve` processes (each includes this file with `#[path]`).

use std::hash::{BuildHasher, Hasher};

/// Ports below the ephemeral range that [`free_port`] picks among at most.
const SPAN: u16 = 12_000;

/// A loopback port nothing listens on right now, picked at random below the kernel's
/// ephemeral range. A port from `bind(0)` is in that range, where an outgoing connection
/// (to PostgreSQL, or a client's) can take it as its local port before the server binds
/// it: the replicas test once failed so ("Address already in use").
pub fn free_port() -> u16 {
    let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let low = ephemeral_low.saturating_sub(SPAN).max(1_024);
    let span = ephemeral_low.saturating_sub(low);
    for _ in 0..1_000 {
        let port = if span == 0 {
            0
        } else {
            let random = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            low + (random % u64::from(span)) as u16
        };
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return listener.local_addr().unwrap().port();
        }
    }
    panic!("no free loopback port below {ephemeral_low}");
}
