//! ReportColocation: runs stored once however often reported, bad reports refused without
//! a trace, timestamps, concurrent reports, and durability across a reopen.

use std::collections::{HashMap, HashSet};

use coloc::proto as pb;
use tonic::Code;

use crate::helpers::{
    database_url, profile, register_request, spawn_app, spawn_app_in, TestApp, GPU,
};

fn member(workload: &str, throughput: f64, job_id: &str) -> pb::ColocatedMember {
    pb::ColocatedMember {
        workload: workload.into(),
        throughput,
        job_id: job_id.into(),
    }
}

fn report(members: Vec<pb::ColocatedMember>) -> pb::ReportColocationRequest {
    pb::ReportColocationRequest {
        sharing_mode: None,
        gpu_id: String::new(),
        gpu: GPU.into(),
        members,
        observed_at: Some(prost_types::Timestamp {
            seconds: 1_750_000_000,
            nanos: 0,
        }),
    }
}

#[tokio::test]
async fn a_reported_run_is_stored_once_even_when_reported_twice() {
    let mut app = spawn_app().await;
    for name in ["a", "b"] {
        app.client
            .register_workload(register_request(name, Some(profile(1, 1.0))))
            .await
            .unwrap();
    }
    let first = app
        .client
        .report_colocation(report(vec![
            member("a", 10.0, "job-1"),
            member("b", 20.0, "job-2"),
        ]))
        .await
        .unwrap()
        .into_inner();
    assert!(first.created);
    // The same run, members in the other order.
    let again = app
        .client
        .report_colocation(report(vec![
            member("b", 20.0, "job-2"),
            member("a", 10.0, "job-1"),
        ]))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created);
    assert_eq!(again.observation_id, first.observation_id);
    assert_eq!(app.count("observations").await, 1);
    assert_eq!(app.count("observation_members").await, 2);

    // Two copies of one workload, and a three-way run, are valid runs.
    app.client
        .report_colocation(report(vec![member("a", 5.0, ""), member("a", 6.0, "")]))
        .await
        .unwrap();
    app.client
        .report_colocation(report(vec![
            member("a", 5.0, ""),
            member("b", 6.0, ""),
            member("b", 7.0, ""),
        ]))
        .await
        .unwrap();
    assert_eq!(app.count("observations").await, 3);
    assert_eq!(app.count("observation_members").await, 7);
}

#[tokio::test]
async fn bad_reports_are_rejected_and_change_nothing() {
    let mut app = spawn_app().await;
    for name in ["a", "b"] {
        app.client
            .register_workload(register_request(name, Some(profile(1, 1.0))))
            .await
            .unwrap();
    }
    let before = app.dump_store().await;
    let mut bad_gpu = report(vec![member("a", 1.0, ""), member("b", 1.0, "")]);
    bad_gpu.gpu = "tab\tin name".into();
    let mut bad_time = report(vec![member("a", 1.0, ""), member("b", 1.0, "")]);
    bad_time.observed_at = Some(prost_types::Timestamp {
        seconds: -5,
        nanos: 0,
    });
    let cases: Vec<(&str, pb::ReportColocationRequest, Code)> = vec![
        (
            "one member",
            report(vec![member("a", 1.0, "")]),
            Code::InvalidArgument,
        ),
        ("no members", report(vec![]), Code::InvalidArgument),
        (
            "NaN throughput",
            report(vec![member("a", f64::NAN, ""), member("b", 1.0, "")]),
            Code::InvalidArgument,
        ),
        (
            "negative throughput",
            report(vec![member("a", -1.0, ""), member("b", 1.0, "")]),
            Code::InvalidArgument,
        ),
        (
            "infinite throughput",
            report(vec![member("a", f64::INFINITY, ""), member("b", 1.0, "")]),
            Code::InvalidArgument,
        ),
        (
            "the same job twice",
            report(vec![member("a", 1.0, "j"), member("b", 1.0, "j")]),
            Code::InvalidArgument,
        ),
        (
            "unknown workload",
            report(vec![member("a", 1.0, ""), member("ghost", 1.0, "")]),
            Code::NotFound,
        ),
        (
            "invalid name",
            report(vec![member("a", 1.0, ""), member("", 1.0, "")]),
            Code::InvalidArgument,
        ),
        (
            "too many members",
            report((0..17).map(|_| member("a", 1.0, "")).collect()),
            Code::InvalidArgument,
        ),
        ("invalid gpu name", bad_gpu, Code::InvalidArgument),
        ("time before 1970", bad_time, Code::InvalidArgument),
        // AssignJob's rule for job ids: no control characters, at most 253 characters.
        (
            "a job id with a control character",
            report(vec![member("a", 1.0, "job\u{7}1"), member("b", 1.0, "")]),
            Code::InvalidArgument,
        ),
        (
            "a job id AssignJob would refuse as too long",
            report(vec![
                member("a", 1.0, &"j".repeat(254)),
                member("b", 1.0, ""),
            ]),
            Code::InvalidArgument,
        ),
    ];
    for (what, request, code) in cases {
        let result = app.client.report_colocation(request).await;
        assert!(
            matches!(&result, Err(s) if s.code() == code),
            "{what}: {result:?}"
        );
    }
    assert_eq!(app.dump_store().await, before);
}

#[tokio::test]
async fn a_report_without_a_time_is_stamped_now() {
    let mut app = spawn_app().await;
    for name in ["a", "b"] {
        app.client
            .register_workload(register_request(name, Some(profile(1, 1.0))))
            .await
            .unwrap();
    }
    let mut request = report(vec![member("a", 1.0, ""), member("b", 2.0, "")]);
    request.observed_at = None;
    app.client.report_colocation(request).await.unwrap();
    let observed_at = app
        .query_i64("SELECT observed_at_ms FROM observations")
        .await;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (now_ms - observed_at).abs() < 60_000,
        "{observed_at} vs {now_ms}"
    );
}

async fn register_a_and_b(app: &mut TestApp) {
    for name in ["a", "b"] {
        app.client
            .register_workload(register_request(name, Some(profile(1, 1.0))))
            .await
            .unwrap();
    }
}

/// The stored runs by id, read straight from the database file: (workload, throughput) of
/// each member, in report order.
async fn stored_runs(app: &TestApp) -> HashMap<i64, Vec<(String, f64)>> {
    let mut connection = crate::store_url::connect(&database_url(&app.dir)).await;
    let rows: Vec<(i64, String, f64)> = sqlx::query_as(
        "SELECT observation_id, workload, throughput FROM observation_members \
         ORDER BY observation_id, position",
    )
    .fetch_all(&mut connection)
    .await
    .unwrap();
    let mut runs: HashMap<i64, Vec<(String, f64)>> = HashMap::new();
    for (id, workload, throughput) in rows {
        runs.entry(id).or_default().push((workload, throughput));
    }
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_reports_get_distinct_ids_each_naming_its_own_run() {
    let mut app = spawn_app().await;
    register_a_and_b(&mut app).await;
    let mut reporters = tokio::task::JoinSet::new();
    for i in 0..200 {
        let mut client = app.client.clone();
        reporters.spawn(async move {
            let answer = client
                .report_colocation(report(vec![
                    member("a", i as f64, ""),
                    member("b", 1.0, ""),
                ]))
                .await
                .unwrap()
                .into_inner();
            (i, answer)
        });
    }
    let mut ids = HashSet::new();
    let mut answers = Vec::new();
    while let Some(joined) = reporters.join_next().await {
        let (i, answer) = joined.unwrap();
        assert!(answer.created, "report {i}");
        assert!(ids.insert(answer.observation_id), "id given twice");
        answers.push((i, answer.observation_id as i64));
    }
    assert_eq!(app.count("observations").await, 200);
    assert_eq!(app.count("observation_members").await, 400);
    // Each reporter was answered with the id of the run it sent, not a neighbour's.
    let stored = stored_runs(&app).await;
    for (i, id) in answers {
        assert_eq!(
            stored[&id],
            vec![("a".to_string(), i as f64), ("b".to_string(), 1.0)],
            "report {i}"
        );
    }
}

#[tokio::test]
async fn an_acknowledged_report_survives_closing_and_reopening_the_store() {
    let mut app = spawn_app().await;
    register_a_and_b(&mut app).await;
    let answer = app
        .client
        .report_colocation(report(vec![
            member("a", 3.0, "job-1"),
            member("b", 4.0, "job-2"),
        ]))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.created);
    // Committed before it was acknowledged: another connection sees it at once.
    assert_eq!(app.count("observations").await, 1);
    let dir = app.stop().await;

    let mut restarted = spawn_app_in(dir).await;
    let stored = stored_runs(&restarted).await;
    assert_eq!(
        stored.get(&(answer.observation_id as i64)),
        Some(&vec![("a".to_string(), 3.0), ("b".to_string(), 4.0)])
    );
    // And it is still recognised as the same run.
    let again = restarted
        .client
        .report_colocation(report(vec![
            member("a", 3.0, "job-1"),
            member("b", 4.0, "job-2"),
        ]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (again.observation_id, again.created),
        (answer.observation_id, false)
    );
}

#[tokio::test]
async fn a_report_without_a_gpu_is_stored_on_the_default_gpu_model_as_readme_says() {
    let mut app = spawn_app().await;
    register_a_and_b(&mut app).await;
    let mut request = report(vec![member("a", 1.0, ""), member("b", 2.0, "")]);
    request.gpu = String::new();
    let answer = app
        .client
        .report_colocation(request)
        .await
        .unwrap()
        .into_inner();
    assert!(answer.created);
    // The only GPU model known is the default.
    let on_default = app
        .query_i64(&format!(
            "SELECT COUNT(*) FROM observations WHERE gpu = '{GPU}'"
        ))
        .await;
    assert_eq!(on_default, 1);
}
