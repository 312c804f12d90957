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
    // kube-scheduler's queue is the default.
    assert_eq!(report["setup"]["queue"], "k8s");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 7 * 2);
    for run in runs {
        assert_eq!(run["jobs"], 200, "{run}");
        // Job-time by set size: shares of one whole; the pairs oracle never runs three.
        let shares: Vec<f64> = run["job_time_share_by_set_size"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{run}");
        if run["policy"] == "one-per-gpu" {
            assert_eq!(shares, [1.0, 0.0, 0.0, 0.0], "{run}");
        }
        if run["policy"] == "oracle-pairs" {
            assert_eq!(shares[2..], [0.0, 0.0], "{run}");
            assert!(run["max_jobs_on_a_gpu"].as_u64().unwrap() <= 2, "{run}");
        }
        assert!(run["makespan_h"].as_f64().unwrap() > 0.0, "{run}");
        let (p50, p95) = (run["p50_jct_h"].as_f64(), run["p95_jct_h"].as_f64());
        assert!(p50 <= p95, "{run}");
        assert!(p95 <= run["p99_jct_h"].as_f64(), "{run}");
        let waited = |field: &str| run[field].as_f64().unwrap();
        assert!(
            waited("mean_queueing_h") <= waited("max_queueing_h"),
            "{run}"
        );
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
    for name in [
        "smallest-memory",
        "kace-linear",
        "coloc",
        "oracle",
        "oracle-pairs",
    ] {
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
    for seed in [3, 4] {
        the_readmes_claims_hold_for_coloc(runs, seed);
    }
}

/// What docs/simulation.md states of the `coloc` policy on the default setup, checked on one
/// seed of the 200-pod slice: no OOM event and no LS job below its cap (while a policy that
/// packs by memory alone leaves many below theirs), a mean JCT below `fraction-pack`'s (653
/// against 1,154 h over seeds 1-5) and cut by at least the target's 30 % against one job per
/// GPU (57.3 % over seeds 1-5), and GPUs shared (1.36 jobs per busy GPU). On the default
/// setup its makespan is 8.4 % shorter than one job per GPU's; this slice is too short to
/// show it. Under the corrected truth (docs/decisions/036-corrected-truth.md) coloc's
/// makespan on seeds 3 and 4 of the slice is 5.1 % longer and 1.8 % shorter, its JCT cut 51
/// and 43 %, 1.12 and 1.10 jobs per busy GPU (under the recorded truth 1.4 % longer and 4.5 %
/// shorter, 52 and 51 %, 1.11 and 1.09).
fn the_readmes_claims_hold_for_coloc(runs: &[serde_json::Value], seed: u64) {
    let run = |policy: &str| {
        runs.iter()
            .find(|r| r["policy"] == policy && r["seed"] == seed)
            .unwrap_or_else(|| panic!("no {policy} run of seed {seed}"))
    };
    let figure = |policy: &str, field: &str| {
        run(policy)[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{policy} {field}: {}", run(policy)))
    };
    let coloc = run("coloc");
    assert_eq!(coloc["oom_events"], 0, "{coloc}");
    assert_eq!(coloc["capped_jobs_below_cap"], 0, "{coloc}");
    let capped = figure("coloc", "capped_jobs");
    assert!(capped >= 50.0, "too few LS jobs to judge caps: {coloc}");
    // The caps are a constraint that binds: packing by memory alone breaks them.
    let memory_only = figure("smallest-memory", "capped_jobs_below_cap");
    assert!(
        memory_only >= 0.2 * capped,
        "seed {seed}: {memory_only} of {capped}"
    );

    let jct = |policy: &str| figure(policy, "mean_jct_h");
    assert!(
        jct("coloc") < jct("fraction-pack"),
        "seed {seed}: coloc {} h, fraction-pack {} h",
        jct("coloc"),
        jct("fraction-pack")
    );
    let jct_cut = 1.0 - jct("coloc") / jct("one-per-gpu");
    assert!(
        jct_cut >= 0.3,
        "seed {seed}: coloc's mean JCT cut {jct_cut}"
    );
    let sharing = figure("coloc", "jobs_per_busy_gpu");
    assert!(sharing > 1.05, "seed {seed}: {sharing} jobs per busy GPU");
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
    for caps in [&["--caps", "point"][..], &[][..]] {
        let mut extra = vec![
            "--gpus",
            "1",
            "--ls-cap",
            "1",
            "--policies",
            "kace-linear,coloc,oracle,oracle-pairs",
        ];
        extra.extend(caps);
        let report = simulate_pods(&pods, &extra);
        let point = !caps.is_empty();
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
    assert_eq!(runs.len(), 7);
    for run in runs {
        assert_eq!(run["capped_jobs"], 0, "{run}");
        assert_eq!(run["worst_share_of_cap"], 1.0, "{run}");
    }
}

#[test]
fn under_break_even_a_short_job_starts_beside_two_long_ones_that_gain_would_make_it_wait_for() {
    // Seed 1 gives the whole-GPU pods b, h and y the same training workload,
    // bert-base-cased_batch2-train (the assignment rule's hash). Its measured speeds
    // (kace-v100/pairs.csv, kace-3way/runs.csv; members of one workload averaged): two
    // together keep 0.6081 each (Σ 1.2162), three 0.4022 (Σ 1.2067 >= 1 but below the pair's).
    let (pair, three) = (
        (0.592_828_461 + 0.623_371_398) / 2.0,
        (0.373_246_858 + 0.373_356_801 + 0.460_124_586) / 3.0,
    );
    let pods = [("b", 0, 1000), ("h", 0, 1000), ("y", 0, 10)];
    let base = ["--gpus", "1", "--ls-cap", "0", "--policies", "oracle"];
    let oracle = |rule: &[&str]| {
        let mut extra = base.to_vec();
        extra.extend(rule);
        let report = simulate_pods(&pods, &extra);
        (report["setup"].clone(), report["runs"][0].clone())
    };
    let seconds = |run: &serde_json::Value, field: &str| run[field].as_f64().unwrap() * 3600.0;

    // Under break-even y starts at once beside b and h and ends at 10 / 0.4022 s; b and h,
    // 10 s of work done each, run the other 990 s as a pair.
    let (setup, run) = oracle(&["--rule", "break-even"]);
    assert_eq!(setup["place_rule"], "break-even");
    assert_eq!(run["max_jobs_on_a_gpu"], 3, "{run}");
    assert_eq!(seconds(&run, "mean_queueing_h"), 0.0, "{run}");
    let short = 10.0 / three;
    let long = short + 990.0 / pair;
    let expected = (2.0 * long + short) / 3.0;
    assert!(
        (seconds(&run, "mean_jct_h") - expected).abs() < 0.01,
        "{run} {expected}"
    );
    assert!((seconds(&run, "makespan_h") - long).abs() < 0.01, "{run}");

    // Under fair-share (the default) each of the three keeps 0.4022, above its third: y
    // starts at once as well. Under gain y would shrink Σ: it waits until b and h end at
    // 1000 / 0.6081 s.
    let (setup, run) = oracle(&[]);
    assert_eq!(setup["place_rule"], "fair-share");
    assert_eq!(run["max_jobs_on_a_gpu"], 3, "{run}");
    let (setup, run) = oracle(&["--rule", "gain"]);
    assert_eq!(setup["place_rule"], "gain");
    assert_eq!(run["max_jobs_on_a_gpu"], 2, "{run}");
    let long = 1000.0 / pair;
    assert!(
        (seconds(&run, "mean_queueing_h") - long / 3.0).abs() < 0.01,
        "{run}"
    );
    let expected = (3.0 * long + 10.0) / 3.0;
    assert!(
        (seconds(&run, "mean_jct_h") - expected).abs() < 0.01,
        "{run} {expected}"
    );
}

#[test]
fn simulate_records_the_fifo_queue_when_asked_and_refuses_an_unknown_queue() {
    let pods = [("a", 0, 100), ("b", 10, 100)];
    let report = simulate_pods(&pods, &["--gpus", "1", "--queue", "fifo"]);
    assert_eq!(report["setup"]["queue"], "fifo");
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["simulate", "--queue", "lifo"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--queue") && stderr.contains("k8s"),
        "{stderr}"
    );
}
