//! Claims, leases and submissions through the agent protocol itself: a slow agent, an agent
//! that dies holding its job, a job that keeps losing its lease, a claim only its holder
//! may act on, a claim handed back.

use super::*;

#[tokio::test]
async fn a_slow_agent_whose_lease_expired_is_refused_and_the_job_is_done_once() {
    let app = app(1).await;
    let mut agents = agents_client(&app);
    for id in ["slow", "fast"] {
        let announced = agents.announce_agent(announce(id, GPU_16)).await.unwrap();
        assert_eq!(announced.into_inner().lease_secs, 1);
    }
    app.client
        .clone()
        .register_workload(register("w", &["ok"], &[GPU_16]))
        .await
        .unwrap();
    let claim = |id: &'static str| {
        let mut agents = agents.clone();
        async move {
            agents
                .claim_profiling_job(pb::ClaimProfilingJobRequest {
                    agent_id: id.into(),
                })
                .await
                .unwrap()
                .into_inner()
                .job
        }
    };
    let slow_job = claim("slow").await.expect("a job for the slow agent");
    assert_eq!(
        (slow_job.workload.as_str(), slow_job.gpu.as_str()),
        ("w", GPU_16)
    );
    // While the slow agent's lease runs, nobody else gets the job.
    assert!(claim("fast").await.is_none());
    // The slow agent does not renew; once its lease ran out, the job is the fast one's.
    let started = Instant::now();
    let fast_job = loop {
        if let Some(job) = claim("fast").await {
            break job;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the fast agent never got the job"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(fast_job.job_id, slow_job.job_id);
    assert_eq!((slow_job.claim, fast_job.claim), (1, 2));

    // The slow agent's late renewal and submissions are refused and change nothing.
    let before = app.dump_store().await;
    let renewal = agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "slow".into(),
            job_id: slow_job.job_id,
            claim: slow_job.claim,
            progress: "still here".into(),
        })
        .await;
    expect_code(renewal, Code::Aborted);
    let late = agents
        .submit_profile(submit("slow", &slow_job, measured_profile(GPU_16, 11.0)))
        .await;
    let message = expect_code(late, Code::Aborted);
    assert!(message.contains("claim 2 of fast holds it"), "{message}");
    let late_failure = agents
        .submit_failure(pb::SubmitFailureRequest {
            agent_id: "slow".into(),
            job_id: slow_job.job_id,
            claim: slow_job.claim,
            kind: pb::JobFailureKind::Final as i32,
            error: "gave up".into(),
            reason: String::new(),
            retry_after_ms: 0,
        })
        .await;
    expect_code(late_failure, Code::Aborted);
    // A profile of another GPU model than the job's is refused.
    let wrong = agents
        .submit_profile(submit("fast", &fast_job, measured_profile(GPU_24, 12.0)))
        .await;
    expect_code(wrong, Code::InvalidArgument);
    assert_eq!(app.dump_store().await, before);

    // The fast agent's submission is stored; its repeat is acknowledged and stores nothing.
    let stored = agents
        .submit_profile(submit("fast", &fast_job, measured_profile(GPU_16, 12.0)))
        .await
        .unwrap()
        .into_inner();
    assert!(!stored.duplicate);
    assert_eq!(
        stored.workload.unwrap().state(),
        pb::WorkloadState::Profiled
    );
    let after = app.dump_store().await;
    let again = agents
        .submit_profile(submit("fast", &fast_job, measured_profile(GPU_16, 99.0)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.duplicate);
    assert_eq!(app.dump_store().await, after);
    let w = workload(&app, "w").await;
    assert_eq!(w.profiles.len(), 1);
    assert_eq!(
        w.profiles[0].system.as_ref().unwrap().exclusive_throughput,
        12.0
    );
    // The late slow agent is still refused after the job is done.
    let late = agents
        .submit_profile(submit("slow", &slow_job, measured_profile(GPU_16, 11.0)))
        .await;
    expect_code(late, Code::Aborted);
}

/// The only agent dies holding the job (it never renews): the service takes the job back
/// by itself once the lease ran out, with no other claim arriving.
#[tokio::test]
async fn a_job_whose_only_agent_died_is_pending_again_without_another_claim() {
    let app = app(1).await;
    let mut agents = agents_client(&app);
    let job = one_agent_holding(&app, &mut agents, "dead", "w").await;
    assert_eq!(job.attempt, 1);
    assert_eq!(live_agents(&app).await[0].job_workload, "w");
    // Nobody claims from here on: only the service's own sweep can take the job back.
    until(
        Duration::from_secs(10),
        "the expired job is pending again",
        || async {
            app.query_i64("SELECT COUNT(*) FROM profiling_jobs WHERE state = 'pending'")
                .await
                == 1
        },
    )
    .await;
    let w = workload(&app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::PendingProfile);
    assert!(
        w.state_reason.contains("lease of agent dead expired")
            && w.state_reason.contains("back in the queue"),
        "{}",
        w.state_reason
    );
    assert_eq!(live_agents(&app).await[0].job_id, 0);
    // The dead agent's claim is gone: its late renewal is refused.
    let late = agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "dead".into(),
            job_id: job.job_id,
            claim: job.claim,
            progress: String::new(),
        })
        .await;
    expect_code(late, Code::Aborted);
    // So is its late failure: not acknowledged as a repeat, and nothing changes.
    let before = app.dump_store().await;
    let late_failure = agents
        .submit_failure(pb::SubmitFailureRequest {
            agent_id: "dead".into(),
            job_id: job.job_id,
            claim: job.claim,
            kind: pb::JobFailureKind::Retry as i32,
            error: "late".into(),
            reason: "late".into(),
            retry_after_ms: 0,
        })
        .await;
    expect_code(late_failure, Code::Aborted);
    assert_eq!(app.dump_store().await, before);
    app.stop().await;
}

/// A workload that takes its agent down every time: each lost lease counts an attempt,
/// and the lease lost on attempt `max_attempts` fails the job and the workload.
#[tokio::test]
async fn a_job_that_loses_its_lease_on_its_last_attempt_fails_for_good() {
    let app = app_with_profiler(1, "max_attempts = 2\n").await;
    let mut agents = agents_client(&app);
    let first = one_agent_holding(&app, &mut agents, "a", "killer").await;
    let pending = "SELECT COUNT(*) FROM profiling_jobs WHERE state = 'pending'";
    assert_eq!(first.attempt, 1);
    until(
        Duration::from_secs(10),
        "the first lease expired",
        || async { app.query_i64(pending).await == 1 },
    )
    .await;
    assert_eq!(
        workload(&app, "killer").await.state(),
        pb::WorkloadState::PendingProfile
    );
    let second = claim_one(&mut agents, "a").await;
    assert_eq!((second.attempt, second.claim), (2, 2));
    until(
        Duration::from_secs(10),
        "the second lease expired",
        || async {
            app.query_i64("SELECT COUNT(*) FROM profiling_jobs WHERE state = 'failed'")
                .await
                == 1
        },
    )
    .await;
    let w = workload(&app, "killer").await;
    assert_eq!(w.state(), pb::WorkloadState::Failed);
    assert!(
        w.state_reason.contains("lease of agent a expired")
            && w.state_reason.contains("attempt 2 of 2")
            && w.state_reason.contains("failed for good"),
        "{}",
        w.state_reason
    );
    // Never offered again.
    assert!(agents
        .claim_profiling_job(pb::ClaimProfilingJobRequest {
            agent_id: "a".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .is_none());
    app.stop().await;
}

/// Another agent naming a claim it does not hold (the right job id and claim token) is
/// refused with PERMISSION_DENIED, and nothing changes; the holder goes on as before.
#[tokio::test]
async fn only_the_agent_holding_a_claim_may_renew_it_or_submit_for_it() {
    let app = app(30).await;
    let mut agents = agents_client(&app);
    for id in ["holder", "other"] {
        agents.announce_agent(announce(id, GPU_16)).await.unwrap();
    }
    app.client
        .clone()
        .register_workload(register("w", &["ok"], &[GPU_16]))
        .await
        .unwrap();
    let job = claim_one(&mut agents, "holder").await;
    let before = app.dump_store().await;
    let renewal = agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "other".into(),
            job_id: job.job_id,
            claim: job.claim,
            progress: "not mine".into(),
        })
        .await;
    let message = expect_code(renewal, Code::PermissionDenied);
    assert!(
        message.contains("agent \"other\" does not hold claim 1")
            && message.contains("agent \"holder\" does"),
        "{message}"
    );
    let profile = agents
        .submit_profile(submit("other", &job, measured_profile(GPU_16, 11.0)))
        .await;
    expect_code(profile, Code::PermissionDenied);
    for kind in [
        pb::JobFailureKind::Wait,
        pb::JobFailureKind::Retry,
        pb::JobFailureKind::Final,
    ] {
        let failure = agents
            .submit_failure(pb::SubmitFailureRequest {
                agent_id: "other".into(),
                job_id: job.job_id,
                claim: job.claim,
                kind: kind as i32,
                error: "not mine".into(),
                reason: String::new(),
                retry_after_ms: 0,
            })
            .await;
        expect_code(failure, Code::PermissionDenied);
    }
    assert_eq!(app.dump_store().await, before);

    // The holder renews and submits; another agent's "repeat" of its submission is still
    // refused, not acknowledged as a duplicate.
    agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "holder".into(),
            job_id: job.job_id,
            claim: job.claim,
            progress: "mine".into(),
        })
        .await
        .unwrap();
    let stored = agents
        .submit_profile(submit("holder", &job, measured_profile(GPU_16, 12.0)))
        .await
        .unwrap()
        .into_inner();
    assert!(!stored.duplicate);
    let after = app.dump_store().await;
    expect_code(
        agents
            .submit_profile(submit("other", &job, measured_profile(GPU_16, 12.0)))
            .await,
        Code::PermissionDenied,
    );
    let again = agents
        .submit_profile(submit("holder", &job, measured_profile(GPU_16, 12.0)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.duplicate);
    assert_eq!(app.dump_store().await, after);
}

/// An agent that handed its claim back and renews it late is told that it handed it back,
/// not that its lease expired.
#[tokio::test]
async fn a_renewal_after_handing_the_claim_back_says_so() {
    let app = app(30).await;
    let mut agents = agents_client(&app);
    let job = one_agent_holding(&app, &mut agents, "holder", "w").await;
    agents
        .submit_failure(pb::SubmitFailureRequest {
            agent_id: "holder".into(),
            job_id: job.job_id,
            claim: job.claim,
            kind: pb::JobFailureKind::Wait as i32,
            error: String::new(),
            reason: "the GPU is busy".into(),
            retry_after_ms: 60_000,
        })
        .await
        .unwrap();
    let before = app.dump_store().await;
    let late = agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "holder".into(),
            job_id: job.job_id,
            claim: job.claim,
            progress: "still here".into(),
        })
        .await;
    let message = expect_code(late, Code::Aborted);
    assert!(
        message.contains("agent \"holder\" handed this claim back") && !message.contains("expired"),
        "{message}"
    );
    assert_eq!(app.dump_store().await, before);
}
