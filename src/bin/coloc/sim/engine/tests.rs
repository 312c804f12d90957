//! The event-driven cluster on small hand-made workloads: queueing, placement, reports
//! and the completion times they lead to.

use super::*;
use crate::sim::{
    policy::{FractionPack, OnePerGpu, Oracle, PlaceRule},
    truth::Workload,
};

fn workload(name: &str, memory_gb: f64) -> Workload {
    Workload {
        name: name.into(),
        exclusive_throughput: 10.0,
        memory_gb,
        inference: true,
        batch_size: 2,
    }
}

fn job(name: &str, arrival: f64, work: f64, workload: u8) -> Job {
    Job {
        name: name.into(),
        arrival,
        work,
        workload,
        gpu_milli: 500,
        cap: None,
    }
}

/// One GPU, the default queue (the tests below have at most one job waiting behind a
/// refused one, so both queues give their results).
fn one_gpu() -> Cluster {
    Cluster::new(1, 60.0, Queue::K8s)
}

fn finishes(outcome: &Outcome) -> Vec<f64> {
    outcome.jobs.iter().map(|j| j.finish).collect()
}

#[test]
fn two_jobs_that_keep_full_speed_together_finish_in_half_the_makespan() {
    // Together each keeps its exclusive throughput (10): the pair doubles the GPU's work.
    let truth = Truth::new(vec![workload("a", 1.0)], &[(vec![0, 0], vec![10.0, 10.0])]).unwrap();
    let jobs = [job("first", 0.0, 100.0, 0), job("second", 0.0, 100.0, 0)];
    let alone = simulate(&jobs, &truth, &one_gpu(), &mut OnePerGpu);
    assert_eq!(finishes(&alone), vec![100.0, 200.0]);
    assert_eq!(alone.makespan, 200.0);
    assert_eq!(alone.jobs[1].queueing_delay(), 100.0);
    assert_eq!(alone.busy_gpu_seconds, 200.0);
    let shared = simulate(
        &jobs,
        &truth,
        &one_gpu(),
        &mut Oracle::new(&truth, PlaceRule::Gain),
    );
    assert_eq!(finishes(&shared), vec![100.0, 100.0]);
    assert_eq!(shared.makespan, 100.0);
    assert_eq!(shared.busy_gpu_seconds, 100.0);
    assert_eq!(shared.job_seconds, 200.0);
}

#[test]
fn a_job_is_re_rated_when_its_partner_leaves() {
    // Together both run at half speed: the short job (50 s of work) ends at 100 s,
    // having let the long one do 50 of its 100 s; the rest runs alone, ending at 150 s.
    let truth = Truth::new(
        vec![workload("a", 1.0), workload("b", 1.0)],
        &[(vec![0, 1], vec![5.0, 5.0])],
    )
    .unwrap();
    let jobs = [job("long", 0.0, 100.0, 0), job("short", 0.0, 50.0, 1)];
    let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
    assert_eq!(finishes(&outcome), vec![150.0, 100.0]);
    assert_eq!(outcome.jobs[0].min_speed, 0.5);
    assert_eq!(outcome.bound_job_seconds, 0.0);
}

/// a+a and a+a+b measured (in the latter a at 0.2, b at 0.4 of their 10), a+b not.
fn pair_and_triple_but_not_a_b() -> Truth {
    Truth::new(
        vec![workload("a", 1.0), workload("b", 1.0)],
        &[
            (vec![0, 0], vec![5.0, 5.0]),
            (vec![0, 0, 1], vec![2.0, 2.0, 4.0]),
        ],
    )
    .unwrap()
}

/// Jobs a1, a2 (workload a) and b, each (arrival, work), at 300 thousandths of a GPU so
/// that fraction packing puts all three on one.
fn three_jobs(timing: [(f64, f64); 3]) -> [Job; 3] {
    let [a1, a2, b] = timing;
    let mut jobs = [
        job("a1", a1.0, a1.1, 0),
        job("a2", a2.0, a2.1, 0),
        job("b", b.0, b.1, 1),
    ];
    for j in &mut jobs {
        j.gpu_milli = 300;
    }
    jobs
}

/// Fraction packing that records what it is told.
struct Listening {
    told: Vec<(f64, Vec<(u8, f64)>)>,
}

impl Policy for Listening {
    fn name(&self) -> &str {
        "listening"
    }
    fn choose(&mut self, job: &JobView, gpus: &[GpuView]) -> Option<usize> {
        FractionPack.choose(job, gpus)
    }
    fn learns(&self) -> bool {
        true
    }
    fn observe(&mut self, members: &[(u8, f64)], now: f64) -> bool {
        let mut members = members.to_vec();
        members.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        self.told.push((now, members));
        false
    }
}

#[test]
fn a_learning_policy_is_told_each_measured_set_that_ran_long_enough_and_nothing_else() {
    // a+a runs from 0 s; b joins at 300 s, before a+a has run the 600 s a report needs.
    // a+a+b (a at 0.2, b at 0.4) then runs until a1 finishes at 300 + (1000 - 150) /
    // 0.2 = 4 550 s: told once, at 900 s. a+b was never measured: it runs at the bound
    // and is not told; a job alone is no colocation.
    let truth = pair_and_triple_but_not_a_b();
    let jobs = three_jobs([(0.0, 1000.0), (0.0, 20_000.0), (300.0, 2000.0)]);
    let mut listening = Listening { told: Vec::new() };
    let outcome = simulate(&jobs, &truth, &one_gpu(), &mut listening);
    assert!(
        (outcome.jobs[0].finish - 4550.0).abs() < 1e-6,
        "{outcome:?}"
    );
    assert!(outcome.bound_job_seconds > 0.0);
    assert_eq!(
        listening.told,
        vec![(900.0, vec![(0, 0.2), (0, 0.2), (1, 0.4)])]
    );
    // A policy that does not learn runs the same simulation.
    assert_eq!(
        simulate(&jobs, &truth, &one_gpu(), &mut FractionPack),
        outcome
    );
}

#[test]
fn no_policy_may_create_a_set_that_was_never_measured() {
    // a+a was measured, a+b was not: fraction packing would put b beside a (500 + 500
    // thousandths fit), but the engine does not offer that GPU, so b waits.
    let truth = Truth::new(
        vec![workload("a", 1.0), workload("b", 1.0)],
        &[(vec![0, 0], vec![5.0, 5.0])],
    )
    .unwrap();
    let jobs = [job("a", 0.0, 100.0, 0), job("b", 10.0, 100.0, 1)];
    let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
    assert_eq!(outcome.max_set, 1);
    assert_eq!(finishes(&outcome), vec![100.0, 200.0]);
}

#[test]
fn departures_that_leave_an_unmeasured_set_run_at_the_bound_and_are_counted() {
    // a+a and a+a+b were measured (in the latter a at 0.2, b at 0.4), a+b was not. When the first a leaves at 50 s
    // (10 s of work at 0.2), a+b was never measured: the bound gives each its speed in
    // that superset. The second a then needs (30 - 10) / 0.2 = 100 s more, b (40 - 20)
    // / 0.4 = 50 s: b ends at 100 s, then a runs alone: 10 s of work left at 100 s,
    // ending at 110 s. Bound time: two jobs x 50 s.
    let truth = pair_and_triple_but_not_a_b();
    let jobs = three_jobs([(0.0, 10.0), (0.0, 30.0), (0.0, 40.0)]);
    let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
    let f = finishes(&outcome);
    assert_eq!(f[0], 50.0);
    assert!((f[2] - 100.0).abs() < 1e-9, "{f:?}");
    assert!((f[1] - 110.0).abs() < 1e-9, "{f:?}");
    assert!((outcome.bound_job_seconds - 100.0).abs() < 1e-9);
    assert_eq!(outcome.max_set, 3);
    // Job-time by set size: three jobs together for 50 s, the pair a+b for 50 s, a alone
    // for 10 s; no job has a cap.
    let by_size = outcome.job_seconds_by_set_size;
    for (size, want) in [(1, 10.0), (2, 100.0), (3, 150.0), (4, 0.0)] {
        assert!((by_size[size] - want).abs() < 1e-9, "{by_size:?}");
    }
    assert_eq!(outcome.capped_job_seconds_by_set_size, [0.0; 5]);
}

#[test]
fn the_pairs_oracle_never_creates_a_set_of_three() {
    // a+a at 0.8 each (Σ 1.6) and a+a+a at 0.6 each (Σ 1.8): the oracle puts all three
    // on the GPU at once and each does its 60 s of work at 0.6, ending at 100 s. The
    // pairs oracle starts a pair (60 / 0.8 = 75 s) and the third alone after it, ending
    // at 135 s.
    let truth = Truth::new(
        vec![workload("a", 1.0)],
        &[
            (vec![0, 0], vec![8.0, 8.0]),
            (vec![0, 0, 0], vec![6.0, 6.0, 6.0]),
        ],
    )
    .unwrap();
    let jobs = [
        job("a1", 0.0, 60.0, 0),
        job("a2", 0.0, 60.0, 0),
        job("a3", 0.0, 60.0, 0),
    ];
    let rule = PlaceRule::FairShare;
    let all = simulate(&jobs, &truth, &one_gpu(), &mut Oracle::new(&truth, rule));
    assert_eq!(all.max_set, 3);
    for f in finishes(&all) {
        assert!((f - 100.0).abs() < 1e-9, "{f}");
    }
    let pairs = simulate(&jobs, &truth, &one_gpu(), &mut Oracle::pairs(&truth, rule));
    assert_eq!(pairs.max_set, 2);
    let f = finishes(&pairs);
    assert_eq!(f[0], 75.0);
    assert_eq!(f[1], 75.0);
    assert!((f[2] - 135.0).abs() < 1e-9, "{f:?}");
}

#[test]
fn a_set_over_gpu_memory_fails_the_job_and_resubmits_it() {
    // Two 20 GB jobs do not fit a 32 GB GPU: fraction packing tries at 0 s and again at
    // the retry (60 s, still full), then at 120 s the GPU is free.
    let truth = Truth::new(vec![workload("big", 20.0)], &[]).unwrap();
    let jobs = [job("first", 0.0, 100.0, 0), job("second", 0.0, 100.0, 0)];
    let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
    assert_eq!(outcome.oom_events, 2);
    assert_eq!(finishes(&outcome), vec![100.0, 220.0]);
    assert_eq!(outcome.jobs[1].start, 120.0);
    // A policy that checks memory waits instead.
    let careful = simulate(
        &jobs,
        &truth,
        &one_gpu(),
        &mut Oracle::new(&truth, PlaceRule::Gain),
    );
    assert_eq!(careful.oom_events, 0);
    assert_eq!(finishes(&careful), vec![100.0, 200.0]);
}

#[test]
fn a_short_job_that_would_shrink_the_sum_waits_under_gain_and_starts_under_break_even() {
    // Two long jobs of `a` together keep 0.6 each (Σ 1.2); a third member of `b` makes
    // them 0.4 and 0.3 (Σ 1.1 >= 1, gain -0.1; b at 0.3 < 1/3).
    let truth = Truth::new(
        vec![workload("a", 1.0), workload("b", 1.0)],
        &[
            (vec![0, 0], vec![6.0, 6.0]),
            (vec![0, 0, 1], vec![4.0, 4.0, 3.0]),
        ],
    )
    .unwrap();
    let jobs = [
        job("long-1", 0.0, 120.0, 0),
        job("long-2", 0.0, 120.0, 0),
        job("short", 0.0, 3.0, 1),
    ];
    let run = |rule| simulate(&jobs, &truth, &one_gpu(), &mut Oracle::new(&truth, rule));
    // Gain and fair share: the short job waits until the pair ends at 120 / 0.6 = 200 s.
    for rule in [PlaceRule::Gain, PlaceRule::FairShare] {
        let waits = run(rule);
        assert_eq!(waits.max_set, 2, "{rule:?}");
        let f = finishes(&waits);
        assert!(
            (f[0] - 200.0).abs() < 1e-9 && (f[2] - 203.0).abs() < 1e-9,
            "{f:?}"
        );
    }
    // Break-even: all three start at 0; the short job ends at 3 / 0.3 = 10 s, when each
    // long one has done 4 s of work; the other 116 s at 0.6 end at 10 + 193.3 s.
    let starts = run(PlaceRule::BreakEven);
    assert_eq!(starts.max_set, 3);
    let f = finishes(&starts);
    assert!((f[2] - 10.0).abs() < 1e-9, "{f:?}");
    assert!((f[0] - (10.0 + 116.0 / 0.6)).abs() < 1e-9, "{f:?}");
    assert!(starts.jobs.iter().all(|j| j.queueing_delay() == 0.0));
}

#[test]
fn under_k8s_a_job_that_can_share_starts_past_a_head_that_fits_nowhere() {
    // Workloads a, h, s (1 GB each, exclusive throughput 10). Measured: a+h at 0.5 each,
    // a+s at 0.8 each; h+s never. A (a, 100 s of work) arrives at 0; H (h, LS with cap
    // 0.9, 50 s) at 10; S (s, 40 s) at 20. One GPU, the oracle under break-even.
    let truth = Truth::new(
        vec![workload("a", 1.0), workload("h", 1.0), workload("s", 1.0)],
        &[(vec![0, 1], vec![5.0, 5.0]), (vec![0, 2], vec![8.0, 8.0])],
    )
    .unwrap();
    let mut jobs = [
        job("A", 0.0, 100.0, 0),
        job("H", 10.0, 50.0, 1),
        job("S", 20.0, 40.0, 2),
    ];
    jobs[1].cap = Some(0.9);
    let run = |queue| {
        simulate(
            &jobs,
            &truth,
            &Cluster::new(1, 60.0, queue),
            &mut Oracle::new(&truth, PlaceRule::BreakEven),
        )
    };
    // fifo: H would run at 0.5 < 0.9 beside A and waits at the head; S waits behind it.
    // A ends alone at 100; H runs alone 100-150 (h+s was never measured, so S cannot
    // join); S runs alone 150-190.
    let fifo = run(Queue::Fifo);
    assert_eq!(finishes(&fifo), vec![100.0, 150.0, 190.0]);
    assert_eq!(fifo.makespan, 190.0);
    assert_eq!(fifo.max_set, 1);
    // k8s: H is refused and S, offered next, starts at 20 beside A (0.8 each). S's 40 s
    // of work end at 20 + 40 / 0.8 = 70; A has done 20 + 50 x 0.8 = 60 by then and
    // ends alone at 70 + 40 = 110; H, refused beside A and beside A+S, runs 110-160.
    let k8s = run(Queue::K8s);
    let f = finishes(&k8s);
    let expected = [110.0, 160.0, 70.0];
    assert!(
        f.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-9),
        "{f:?}"
    );
    assert_eq!(k8s.jobs[2].start, 20.0);
    assert_eq!(k8s.jobs[1].start, 110.0);
    assert_eq!(k8s.max_set, 2);
    assert!((k8s.makespan - 160.0).abs() < 1e-9);
    // Without the shortcut, the same.
    let mut plain = Cluster::new(1, 60.0, Queue::K8s);
    plain.skip_known_refusals = false;
    let oracle = &mut Oracle::new(&truth, PlaceRule::BreakEven);
    assert_eq!(simulate(&jobs, &truth, &plain, oracle), k8s);
}

#[test]
fn the_time_a_capped_job_runs_below_its_cap_is_counted() {
    let truth = Truth::new(
        vec![workload("a", 1.0), workload("b", 1.0)],
        &[(vec![0, 1], vec![3.0, 5.0])],
    )
    .unwrap();
    let mut jobs = [job("capped", 0.0, 30.0, 0), job("other", 0.0, 100.0, 1)];
    jobs[0].cap = Some(0.5);
    let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
    // a at 0.3 for 100 s (its 30 s of work), below its cap all that time.
    assert_eq!(outcome.jobs[0].finish, 100.0);
    assert_eq!(outcome.jobs[0].seconds_below_cap, 100.0);
    assert_eq!(outcome.jobs[1].seconds_below_cap, 0.0);
    // The pair for 100 s, then b alone for its last 50 s of work: of 250 job-seconds,
    // 50 alone and 200 in a pair; the capped job's 100 s all in the pair.
    assert_eq!(
        outcome.job_seconds_by_set_size,
        [0.0, 50.0, 200.0, 0.0, 0.0]
    );
    assert_eq!(
        outcome.capped_job_seconds_by_set_size,
        [0.0, 0.0, 100.0, 0.0, 0.0]
    );
    let summary = super::super::report::RunSummary::of("fraction-pack", 1, &outcome);
    assert_eq!(summary.job_time_share_by_set_size, [0.2, 0.8, 0.0, 0.0]);
    assert_eq!(
        summary.capped_job_time_share_by_set_size,
        [0.0, 1.0, 0.0, 0.0]
    );
    // The oracle keeps caps: it does not pair them (gain 0.3 + 0.5 - 1 < 0).
    let oracle = simulate(
        &jobs,
        &truth,
        &one_gpu(),
        &mut Oracle::new(&truth, PlaceRule::Gain),
    );
    assert_eq!(oracle.max_set, 1);
}

#[test]
fn a_speed_held_for_no_time_is_not_the_lowest_speed_a_job_ran_at() {
    // a+b: a at 0.4; a+b+c: a at 0.6. A (a, cap 0.5), B and C1 arrive at 0 and are
    // placed one after another in the same instant, so A is at 0.4 (with B) for no time
    // before C1 joins. C1 (5 s of work at 0.5) ends at 10 s, and C2, waiting since 1 s
    // (a fourth job exceeds 1000 thousandths), takes its place at once: a+b again for no
    // time. A runs at 0.6 throughout and never below its cap.
    let truth = Truth::new(
        vec![workload("a", 1.0), workload("b", 1.0), workload("c", 1.0)],
        &[
            (vec![0, 1], vec![4.0, 5.0]),
            (vec![0, 1, 2], vec![6.0, 5.0, 5.0]),
        ],
    )
    .unwrap();
    let mut jobs = [
        job("A", 0.0, 100.0, 0),
        job("B", 0.0, 100.0, 1),
        job("C1", 0.0, 5.0, 2),
        job("C2", 1.0, 100.0, 2),
    ];
    jobs[0].cap = Some(0.5);
    for j in &mut jobs {
        j.gpu_milli = 300;
    }
    let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
    assert_eq!(outcome.jobs[2].finish, 10.0);
    assert_eq!(outcome.jobs[3].start, 10.0);
    assert!((outcome.jobs[0].finish - 100.0 / 0.6).abs() < 1e-9);
    assert_eq!(outcome.jobs[0].seconds_below_cap, 0.0);
    assert_eq!(outcome.jobs[0].min_speed, 0.6);
    assert_eq!(outcome.jobs[1].min_speed, 0.5);
}
