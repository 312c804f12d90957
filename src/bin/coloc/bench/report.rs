//! What `coloc bench` prints: the setup figures, each scenario's rate, latency and CPU,
//! and the ratios to Health/Check measured in the same run; each rank_N also against its
//! transport floor echo_rank_N (the same bytes moved by the bench's echo service) when
//! both ran.

use std::{collections::BTreeMap, io::Write};

use serde::Serialize;

use super::BenchArgs;

#[derive(Debug, Clone, Serialize)]
pub(super) struct ScenarioResult {
    pub rps: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    /// CPU time per wall second of the server's process (client included in-process).
    pub cpu_cores: f64,
    pub errors: u64,
}

/// What `coloc bench` prints: setup figures, then one entry per scenario.
#[derive(Debug, Default, Serialize)]
pub(super) struct Report {
    pub(super) setup: BTreeMap<String, serde_json::Value>,
    #[serde(flatten)]
    pub(super) scenarios: BTreeMap<String, ScenarioResult>,
}

/// A scenario against Health/Check measured in the same run: (its RPC/s ÷ Health's, its
/// p99 ÷ Health's). The only figures that mean much on a shared machine.
pub(super) fn ratios(result: &ScenarioResult, health: &ScenarioResult) -> (f64, f64) {
    (
        result.rps / health.rps,
        result.p99_us as f64 / health.p99_us as f64,
    )
}

/// Each rank_N scenario that ran beside its echo_rank_N: (N's name, the ratios of rank_N to
/// echo_rank_N as [`ratios`] gives them).
pub(super) fn echo_ratios(report: &Report) -> Vec<(String, (f64, f64))> {
    report
        .scenarios
        .iter()
        .filter_map(|(name, echo)| {
            let rank = name.strip_prefix("echo_")?;
            let own = report.scenarios.get(rank)?;
            Some((rank.to_string(), ratios(own, echo)))
        })
        .collect()
}

pub(super) fn print_report(report: &Report, args: &BenchArgs) -> anyhow::Result<()> {
    if args.json {
        let mut json = serde_json::to_value(report)?;
        for (rank, (rps, p99)) in echo_ratios(report) {
            json["vs_echo"][rank] = serde_json::json!({"rps_ratio": rps, "p99_ratio": p99});
        }
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    for (key, value) in &report.setup {
        writeln!(out, "{key:<24} {value}")?;
    }
    let health = report.scenarios.get("health");
    writeln!(
        out,
        "\n{:<16} {:>10} {:>9} {:>9} {:>10} {:>6} {:>7} {:>12} {:>12}",
        "scenario",
        "rpc/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "cpu",
        "errors",
        "rps/health",
        "p99/health"
    )?;
    for (name, r) in &report.scenarios {
        let (rps_ratio, p99_ratio) = match health.map(|h| ratios(r, h)) {
            Some((rps, p99)) => (format!("{rps:.2}"), format!("{p99:.2}")),
            None => ("-".into(), "-".into()),
        };
        writeln!(
            out,
            "{name:<16} {:>10.0} {:>9} {:>9} {:>10} {:>6.2} {:>7} {rps_ratio:>12} {p99_ratio:>12}",
            r.rps, r.p50_us, r.p99_us, r.p999_us, r.cpu_cores, r.errors
        )?;
    }
    for (rank, (rps, p99)) in echo_ratios(report) {
        writeln!(
            out,
            "{rank} vs echo_{rank} (the same bytes, no work): {rps:.2}x its RPC/s, p99 {p99:.2}x"
        )?;
    }
    for (name, r) in &report.scenarios {
        let Some(peer) = name
            .strip_prefix("peer_")
            .and_then(|own| report.scenarios.get(own).map(|own| (own, r)))
        else {
            continue;
        };
        let (own, peer) = peer;
        writeln!(
            out,
            "coloc vs peer, {}: {:.1}x RPC/s, p99 {:.1}x lower",
            &name[5..],
            own.rps / peer.rps,
            peer.p99_us as f64 / own.p99_us as f64
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(rps: f64, p99_us: u64) -> ScenarioResult {
        ScenarioResult {
            rps,
            p50_us: p99_us / 2,
            p99_us,
            p999_us: p99_us * 2,
            cpu_cores: 1.0,
            errors: 0,
        }
    }

    #[test]
    fn ratios_compare_a_scenario_with_health_in_the_same_run() {
        let health = result(40_000.0, 1_000);
        assert_eq!(ratios(&result(10_000.0, 4_000), &health), (0.25, 4.0));
        assert_eq!(ratios(&health, &health), (1.0, 1.0));
    }

    #[test]
    fn the_json_report_has_the_setup_and_one_key_per_scenario() {
        let mut report = Report::default();
        report.setup.insert("cpus".into(), 2.into());
        report.scenarios.insert("health".into(), result(100.0, 10));
        report.scenarios.insert("rank_100".into(), result(50.0, 30));
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["setup"]["cpus"], 2);
        assert_eq!(json["rank_100"]["p99_us"], 30);
        assert_eq!(json["health"]["rps"], 100.0);
    }

    #[test]
    fn a_rank_scenario_is_read_against_its_echo_floor_when_both_ran() {
        let mut report = Report::default();
        report.scenarios.insert("health".into(), result(400.0, 10));
        report.scenarios.insert("rank_100".into(), result(50.0, 30));
        report
            .scenarios
            .insert("echo_rank_100".into(), result(200.0, 10));
        report
            .scenarios
            .insert("echo_rank_10".into(), result(300.0, 10));
        assert_eq!(
            echo_ratios(&report),
            vec![("rank_100".to_string(), (0.25, 3.0))]
        );
    }
}
