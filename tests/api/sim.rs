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

/// Runs `coloc simulate` on a hand-made trace of `pods` (name, arrival s, lifetime s; all
/// latency-sensitive, whole-GPU requests) and returns the JSON report.
fn simulate_pods(pods: &[(&str, u64, u64)], extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::TempDir::new().unwrap();
    let trace = dir.path().join("pods.csv");
    let mut csv = String::from(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n",
    );
    for (name, arrival, lifetime) in pods {
        let end = arrival + lifetime;
        csv += &format!("{name},1000,1024,1,1000,,LS,Running,{arrival},{end},{arrival}\n");
    }
    std::fs::write(&trace, csv).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["simulate", "--json", "--seeds", "1", "--trace"])
        .arg(&trace)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn with_every_ls_job_capped_at_its_whole_speed_no_policy_that_keeps_caps_shares_a_gpu() {
    // Four LS jobs of 100 s each arrive together on one GPU. A cap of 1 (keep all of your
    // speed) holds in no measured set and, for the model policies, in no prediction: the
    // jobs run one after the other, finishing at 100, 200, 300 and 400 s. kace-linear keeps
    // the caps too, on members estimated from its predicted sum.
    let pods = [("a", 0, 100), ("b", 0, 100), ("c", 0, 100), ("d", 0, 100)];
    for caps in [&[][..], &["--cautious-caps"][..]] {
        let mut extra = vec![
            "--gpus",
            "1",
            "--ls-cap",
            "1",
            "--policies",
            "kace-linear,coloc,oracle",
        ];
        extra.extend(caps);
        let report = simulate_pods(&pods, &extra);
        let point = caps.is_empty();
        assert_eq!(
            report["setup"]["model_policy_caps"]
                .as_str()
                .unwrap()
                .starts_with("point"),
            point
        );
        for run in report["runs"].as_array().unwrap() {
            assert_eq!(run["capped_jobs"], 4, "{run}");
            assert_eq!(run["capped_jobs_below_cap"], 0, "{run}");
            assert_eq!(run["max_jobs_on_a_gpu"], 1, "{run}");
            let hours = |field: &str| run[field].as_f64().unwrap() * 3600.0;
            assert!((hours("makespan_h") - 400.0).abs() < 1e-6, "{run}");
            assert!((hours("mean_jct_h") - 250.0).abs() < 1e-6, "{run}");
        }
    }
}

#[test]
fn with_no_ls_cap_no_job_is_capped_under_any_policy() {
    let pods = [("a", 0, 100), ("b", 10, 100), ("c", 20, 100)];
    let report = simulate_pods(&pods, &["--gpus", "1", "--ls-cap", "0"]);
    assert_eq!(report["setup"]["ls_cap"], 0.0);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6);
    for run in runs {
        assert_eq!(run["capped_jobs"], 0, "{run}");
        assert_eq!(run["worst_share_of_cap"], 1.0, "{run}");
    }
}
