//! Profiles that correct themselves: a workload whose stored runs beat its profile's
//! exclusive throughput beyond the noise margin in several runs (a suspect profile) gets a
//! re-profile queued on that GPU model by the next training, once, and only where a
//! profiler can run it (the workload has a launch spec).

use std::sync::Arc;

use coloc::{domain::GpuName, proto as pb, store::JobClaimer};
use tempfile::TempDir;

use crate::helpers::{profile, register_request, report_request, spawn_app_with_config, GPU};

#[tokio::test]
async fn a_suspect_profile_queues_one_reprofile_where_it_can_run_and_none_on_later_trainings() {
    let mut app = spawn_app_with_config(
        Arc::new(TempDir::new().unwrap()),
        "[profiler]\nallowed_programs = [\"/usr/bin/*\"]\n",
    )
    .await;
    let names: Vec<String> = (0..7).map(|i| format!("w{i}")).collect();
    let mut exclusive = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let p = profile(i as u64 + 1, 1.0);
        exclusive.push(p.system.as_ref().unwrap().exclusive_throughput);
        let mut request = register_request(name, Some(p));
        // w0 can be run by a profiler; w1, like an imported profile, cannot.
        if i == 0 {
            request.launch = Some(pb::LaunchSpec {
                program: "/usr/bin/python3".into(),
                args: vec!["w0.py".into()],
                ..Default::default()
            });
        }
        app.client.register_workload(request).await.unwrap();
    }
    // Every pair once: w0 and w1 run at 1.5 x their exclusive throughput in each of their
    // six runs (beyond the 10 % margin), the others at 40 %.
    let speed = |i: usize| exclusive[i] * if i < 2 { 1.5 } else { 0.4 };
    let mut at = 1_700_000_000;
    for i in 0..names.len() {
        for j in i + 1..names.len() {
            at += 60;
            app.client
                .report_colocation(report_request(
                    GPU,
                    &[(&names[i], speed(i)), (&names[j], speed(j))],
                    at,
                ))
                .await
                .unwrap();
        }
    }
    let train = || pb::TrainRequest {
        gpu: GPU.into(),
        kind: String::new(),
    };
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (0, 0, 0, 0)
    );
    app.client.train(train()).await.unwrap();
    let suspects: Vec<String> = app
        .advisor
        .suspect_profiles(&GpuName::parse("gpu", GPU).unwrap())
        .into_iter()
        .map(|s| s.workload)
        .collect();
    assert_eq!(suspects, ["w0", "w1"]);
    // One job: w0's, on the GPU model its runs contradict; none for w1 (no launch spec).
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (1, 0, 0, 0)
    );
    // Another training finds the same suspect profiles and queues nothing more.
    app.client.train(train()).await.unwrap();
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (1, 0, 0, 0)
    );
    // A profiler of that GPU model claims it; a training while it runs leaves it running.
    let gpu = GpuName::parse("gpu", GPU).unwrap();
    let claimed = app
        .advisor
        .store()
        .claim_job(
            &JobClaimer {
                holder: "agent-1",
                gpu: Some(&gpu),
                lease_ms: 60_000,
                max_attempts: 3,
            },
            coloc::domain::now_ms(),
        )
        .await
        .unwrap()
        .expect("the re-profile is claimable by a profiler of its GPU model");
    assert_eq!(claimed.workload.as_str(), "w0");
    assert_eq!(claimed.gpu.as_ref(), Some(&gpu));
    assert!(claimed.launch.is_some());
    app.client.train(train()).await.unwrap();
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (0, 1, 0, 0)
    );
}
