//! `coloc simulate`'s smoke run, as CI sees it: the real binary on the first 200 one-GPU pods
//! of the Alibaba trace, every policy, two seeds, JSON and plots.

use std::process::Command;

#[test]
fn simulate_runs_every_policy_on_a_slice_of_the_trace_and_writes_json_and_plots() {
    let dir = tempfile::TempDir::new().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["simulate", "--max-pods", "200", "--seeds", "3,4", "--json"])
        .arg("--plots")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["setup"]["jobs"], 200);
    assert_eq!(report["setup"]["measured_sets"], 1598);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6 * 2);
    for run in runs {
        assert_eq!(run["jobs"], 200, "{run}");
        assert!(run["makespan_h"].as_f64().unwrap() > 0.0, "{run}");
        let (p50, p95) = (run["p50_jct_h"].as_f64(), run["p95_jct_h"].as_f64());
        assert!(p50 <= p95, "{run}");
    }
    let policy = |name: &str| {
        report["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["policy"] == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .clone()
    };
    // One job per GPU is the baseline of every cut; it never shares or hurts a job.
    let baseline = policy("one-per-gpu");
    assert_eq!(baseline["makespan_cut"]["mean"], 0.0);
    assert_eq!(baseline["jobs_per_busy_gpu"]["max"], 1.0);
    assert_eq!(baseline["capped_jobs_below_cap"]["max"], 0.0);
    // Policies that check memory never run out of it.
    for name in ["smallest-memory", "kace-linear", "coloc", "oracle"] {
        assert_eq!(policy(name)["oom_events"]["max"], 0.0, "{name}");
    }
    assert!(
        policy("coloc")["place_us_per_call"]["mean"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    for plot in ["sim_jct_cdf.png", "sim_busy_gpus.png"] {
        let bytes = std::fs::read(dir.path().join(plot)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{plot}");
    }
}
