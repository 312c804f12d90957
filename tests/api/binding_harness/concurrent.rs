//! Two schedulers at once against one coloc (`hami`): the trace's arrivals are dealt in
//! pairs to two tasks, whose admissions (coloc's webhook and filter, over HTTP) overlap;
//! HAMi's filter and bind then take its lock in turn, as HAMi's scheduler does. On a
//! cluster small enough to fill (3 nodes of 8 GPUs, 120 pods, at most 31 at once), no GPU may ever hold more than HAMi registered (split
//! count, memory, cores), neither by HAMi's accounting nor by coloc's choices alone (each
//! pod on the GPU coloc chose for it: what the reservations must keep apart), and HAMi
//! never refuses a GPU coloc chose, but where a pod coloc left unpinned (no GPU acceptable
//! to Place, so HAMi places it by its own policy, blind to coloc's holds) took the held
//! slot between the pinned pod's admission and its bind: counted and printed apart.

use std::collections::BTreeMap;

use tokio::sync::Mutex;

use super::{
    events,
    hami::{admit, bind, depart, refused_choice, register, Cluster, Usage},
    trace, Outcome, TracePod,
};
use crate::{
    binding::config,
    helpers::{slowdown_app_with_config, TestApp},
};

/// Nodes of the crowded cluster (8 GPUs each) and pods of the trace.
const NODES: usize = 3;
const PODS: usize = 120;

/// What coloc's choices alone put on each GPU (every bound pod on the GPU coloc chose).
fn by_choice(cluster: &Cluster, pods: &[TracePod]) -> BTreeMap<String, Usage> {
    let mut on: BTreeMap<String, Usage> = BTreeMap::new();
    for (i, gpu) in &cluster.chosen {
        let u = on.entry(gpu.clone()).or_default();
        u.used += 1;
        u.mem += pods[*i].mem;
        u.cores += pods[*i].cores;
    }
    on
}

/// One scheduler's turn: admission without HAMi's lock, then filter and bind under it.
async fn schedule(
    app: &TestApp,
    cluster: &Mutex<Cluster>,
    outcome: &Mutex<Outcome>,
    pods: &[TracePod],
    i: usize,
) {
    let admitted = admit(app.extender_addr.unwrap(), &pods[i], NODES).await;
    let mut cluster = cluster.lock().await;
    bind(
        app,
        &mut cluster,
        pods,
        i,
        admitted,
        &mut *outcome.lock().await,
    );
}

/// Checks capacity after each step; the number of over-committed GPU states seen.
fn over_committed(cluster: &Cluster, pods: &[TracePod], seen: &mut Vec<String>) {
    for (gpu, u) in &cluster.usage {
        if !u.within_capacity() {
            seen.push(format!("HAMi's accounting: {gpu} holds {u:?}"));
        }
    }
    for (gpu, u) in by_choice(cluster, pods) {
        if !u.within_capacity() {
            seen.push(format!("coloc's choices: {gpu} holds {u:?}"));
        }
    }
}

#[tokio::test]
async fn two_schedulers_at_once_never_over_commit_a_gpu() {
    let (app, _) = slowdown_app_with_config(7, &config("hami", 1)).await;
    let cluster = Mutex::new(register(&app, NODES));
    let outcome = Mutex::new(Outcome::default());
    let pods = trace(PODS);
    let mut seen = Vec::new();
    let mut arrivals: Vec<usize> = Vec::new();
    let mut peak = 0;
    let events = events(&pods);
    for (at, (departure, i)) in events.iter().enumerate() {
        if *departure {
            depart(&app, &mut *cluster.lock().await, &pods, *i);
            continue;
        }
        arrivals.push(*i);
        // A pair is dealt when two arrivals wait, or the next event is a departure.
        let next_departs = events.get(at + 1).is_none_or(|(d, _)| *d);
        if arrivals.len() == 2 || next_departs {
            let dealt: Vec<usize> = std::mem::take(&mut arrivals);
            let (app, cluster, outcome, pods) = (&app, &cluster, &outcome, &pods);
            futures::future::join_all(
                dealt
                    .into_iter()
                    .map(|i| schedule(app, cluster, outcome, pods, i)),
            )
            .await;
            let cluster = cluster.lock().await;
            peak = peak.max(cluster.placed.len());
            over_committed(&cluster, pods, &mut seen);
        }
    }
    let outcome = outcome.into_inner();
    let share = outcome.report("hami, two schedulers at once, 3 nodes x 8 GPUs");
    println!(
        "  at most {peak} pods ran at once; {} over-committed GPU states",
        seen.len()
    );
    assert_eq!(outcome.pods, PODS);
    assert!(seen.is_empty(), "{seen:#?}");
    assert!(!refused_choice(&outcome), "{:#?}", outcome.explained);
    // Every pod coloc chose for lands there, but for those whose held slot a pod coloc left
    // unpinned took first (HAMi places those by its own policy, blind to coloc's holds);
    // the others found no room coloc would take (neutral), which a cluster this crowded
    // must have.
    let taken = outcome
        .misses
        .get("an unpinned pod took the held slot")
        .copied()
        .unwrap_or(0);
    assert_eq!(
        outcome.landed_on_choice + taken,
        outcome.chosen,
        "{outcome:#?}"
    );
    assert!(
        share < 1.0,
        "the cluster never filled: the pairs never contended"
    );
    app.stop().await;
}
