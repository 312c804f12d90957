//! The worker when the store refuses writes: a job's outcome is retried until it lands or
//! handed back, never left running with no worker.

use super::*;

/// The store refuses writes right after the worker claimed a job (the write lock held by
/// another process, a full disk): the worker keeps retrying the job's outcome until the
/// store takes it, so the job never stays RUNNING with no worker running it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_state_write_after_a_claim_is_retried_until_it_lands() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["ok"]))))
        .await
        .unwrap();
    let store = app.advisor.store().clone();
    let worker = nvml_worker(&app, &fake_ncu(), 3);
    let running = tokio::spawn(async move { worker.run_once(&CancellationToken::new()).await });
    // Claimed: the workload's child processes take tens of milliseconds from here.
    let claimed = std::time::Instant::now();
    while store.job_counts().await.unwrap().1 == 0 {
        assert!(claimed.elapsed() < Duration::from_secs(10), "never claimed");
        tokio::task::yield_now().await;
    }
    store.faults().fail_commits(true);
    let failing = std::time::Instant::now();
    while store.write_health().failures() == 0 {
        assert!(
            failing.elapsed() < Duration::from_secs(10),
            "the worker never tried to write"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Still claimed while the store refuses the outcome.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !running.is_finished(),
        "the worker gave up on the job's outcome"
    );
    store.faults().fail_commits(false);
    let outcome = running.await.unwrap().unwrap();
    assert!(
        matches!(outcome, RunOutcome::Profiled { .. }),
        "{outcome:?}"
    );
    assert_eq!(store.job_counts().await.unwrap(), (0, 0, 1, 0));
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::Profiled
    );
}

/// Another process holds SQLite's write lock for longer than the busy timeout (5 s) right
/// after the worker claimed a job: the worker's write of the outcome fails with "database
/// is locked" and is tried again until the lock is gone; the job ends done, never stranded
/// in RUNNING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_past_the_busy_timeout_delays_the_outcome_but_never_strands_the_job() {
    use sqlx::{Connection, Executor};

    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["ok"]))))
        .await
        .unwrap();
    let store = app.advisor.store().clone();
    let mut holder = sqlx::SqliteConnection::connect(&database_url(&app.dir))
        .await
        .unwrap();
    let worker = nvml_worker(&app, &fake_ncu(), 3);
    let running = tokio::spawn(async move { worker.run_once(&CancellationToken::new()).await });
    let claimed = std::time::Instant::now();
    while store.job_counts().await.unwrap().1 == 0 {
        assert!(claimed.elapsed() < Duration::from_secs(10), "never claimed");
        tokio::task::yield_now().await;
    }
    holder.execute("BEGIN IMMEDIATE").await.unwrap();
    let locked = std::time::Instant::now();
    while store.write_health().failures() == 0 {
        assert!(
            locked.elapsed() < Duration::from_secs(30),
            "the worker's write never timed out on the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !running.is_finished(),
        "the worker gave up on the job's outcome"
    );
    assert_eq!(store.job_counts().await.unwrap().1, 1, "still claimed");
    holder.execute("ROLLBACK").await.unwrap();
    let outcome = running.await.unwrap().unwrap();
    assert!(
        matches!(outcome, RunOutcome::Profiled { .. }),
        "{outcome:?}"
    );
    assert_eq!(store.job_counts().await.unwrap(), (0, 0, 1, 0));
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::Profiled
    );
}

/// Runs one statement on the test's database file, beside the server.
async fn execute_sql(app: &TestApp, statement: &str) {
    let url = crate::helpers::database_url(&app.dir);
    let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
        .execute(&mut connection)
        .await
        .unwrap();
}

/// Makes the store refuse (a constraint of its own, not a storage fault) every update of
/// a job's state that matches `when`.
async fn refuse_job_updates(app: &TestApp, when: &str) {
    execute_sql(
        app,
        "CREATE TABLE IF NOT EXISTS refusals (n INTEGER CHECK (n > 0))",
    )
    .await;
    execute_sql(
        app,
        &format!(
            "CREATE TRIGGER refuse_job_updates AFTER UPDATE OF state ON profiling_jobs \
             WHEN {when} BEGIN INSERT INTO refusals VALUES (0); END"
        ),
    )
    .await;
}

/// The store refuses to mark the job failed: the worker hands the job back (a counted
/// attempt) instead of leaving it RUNNING with nobody running it.
#[tokio::test]
async fn a_job_whose_failure_is_refused_is_handed_back_not_left_running() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["fail"]))))
        .await
        .unwrap();
    refuse_job_updates(&app, "NEW.state = 'failed'").await;
    let worker = nvml_worker(&app, &fake_ncu(), 1);
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        worker.run_once(&CancellationToken::new()),
    )
    .await
    .expect("the worker kept retrying a refused write")
    .unwrap();
    let RunOutcome::HandedBack { reason, .. } = &outcome else {
        panic!("the job was not handed back: {outcome:?}");
    };
    assert!(
        reason.contains("failing the job was refused") && reason.contains("back in the queue"),
        "{reason}"
    );
    let store = app.advisor.store().clone();
    assert_eq!(store.job_counts().await.unwrap(), (1, 0, 0, 0));
    assert_eq!(
        app.query_i64("SELECT attempts FROM profiling_jobs").await,
        1
    );
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::PendingProfile);
    assert_eq!(&w.state_reason, reason);
    // A refusal is no storage fault: health stays as it was.
    assert!(!store.write_health().failing());
}

/// Every change of the running job's state is refused: the worker keeps the job as
/// unsettled and hands it back before it claims anything else, so the job does not stay
/// RUNNING once the store takes writes again.
#[tokio::test]
async fn a_job_left_claimed_by_refused_writes_is_handed_back_before_the_next_claim() {
    let app = app("").await;
    app.client
        .clone()
        .register_workload(register("w", Some(launch(&["fail"]))))
        .await
        .unwrap();
    refuse_job_updates(&app, "OLD.state = 'running'").await;
    let worker = nvml_worker(&app, &fake_ncu(), 1);
    let error = tokio::time::timeout(
        Duration::from_secs(60),
        worker.run_once(&CancellationToken::new()),
    )
    .await
    .expect("the worker kept retrying a refused write")
    .unwrap_err();
    assert!(
        format!("{error:#}").contains("could not be handed back"),
        "{error:#}"
    );
    let store = app.advisor.store();
    assert_eq!(store.job_counts().await.unwrap(), (0, 1, 0, 0));
    // Still refused: the worker claims nothing new while it holds the job.
    assert!(worker.run_once(&CancellationToken::new()).await.is_err());
    assert_eq!(store.job_counts().await.unwrap(), (0, 1, 0, 0));

    execute_sql(&app, "DROP TRIGGER refuse_job_updates").await;
    // Handed back first, then claimed again and failed for good, as it should have been.
    let outcome = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(matches!(outcome, RunOutcome::Failed { .. }), "{outcome:?}");
    assert_eq!(store.job_counts().await.unwrap(), (0, 0, 0, 1));
}
