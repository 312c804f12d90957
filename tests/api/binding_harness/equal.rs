//! coloc's choice through the whole binding path (inventory, cluster view fed by the
//! watcher's parser, holds, HAMi's accounting, the webhook over HTTP) against the
//! simulation's decision on the same state: the advisor's in-process Place (what
//! `coloc simulate`'s model policies call, src/bin/coloc/sim/place.rs) asked directly about
//! every GPU HAMi has room on, with the residents the harness itself put there, taking the
//! largest gain and, on ties, the first GPU (the simulation's rule; its GPUs in node and id
//! order here). Every `SAMPLE`th arrival of the trace is compared.

use coloc::{
    advisor::{GpuState, PlaceQuery},
    domain::{GpuName, WorkloadName},
};
use tokio::sync::Mutex;

use super::{
    events,
    hami::{admit, bind, depart, refusal, register, Cluster, DEVMEM},
    node_of, trace, Outcome, TracePod,
};
use crate::{
    binding::config,
    helpers::{slowdown_app_with_config, TestApp, GPU},
};

const PODS: usize = 120;
const SAMPLE: usize = 4;

/// The simulation's choice for `pod` on the harness's own state: the GPU and its gain;
/// `None` when Place accepts no GPU.
async fn simulated(app: &TestApp, cluster: &Cluster, pod: &TracePod) -> Option<(String, f64)> {
    let gpu = GpuName::parse("gpu", GPU).unwrap();
    let room: Vec<(&String, Vec<String>)> = cluster
        .usage
        .iter()
        .filter(|(_, u)| refusal(u, pod).is_none())
        .map(|(id, u)| (id, u.workloads.clone()))
        .collect();
    let gpus = room
        .iter()
        .map(|(id, residents)| GpuState {
            id: id.to_string(),
            node: node_of(id),
            gpu: Some(gpu.clone()),
            memory_gb: Some(f64::from(DEVMEM) / 1024.0),
            residents: residents.clone(),
            resident_floors: Vec::new(),
        })
        .collect();
    let mut query = PlaceQuery::new(
        WorkloadName::parse("workload", &pod.workload).unwrap(),
        gpus,
    );
    query.policy = app.advisor.policy();
    let answer = app.advisor.place(query).await.unwrap();
    // The largest gain, the first GPU on ties.
    let mut best: Option<(usize, f64)> = None;
    for placement in &answer.placements {
        let at = room.iter().position(|(id, _)| **id == placement.gpu_id)?;
        let better = match best {
            None => true,
            Some((b, gain)) => placement.gain > gain || (placement.gain == gain && at < b),
        };
        if better {
            best = Some((at, placement.gain));
        }
    }
    best.map(|(at, gain)| (room[at].0.clone(), gain))
}

#[tokio::test]
async fn coloc_chooses_what_the_simulations_place_chooses_on_the_same_state() {
    let (app, _) = slowdown_app_with_config(7, &config("hami", 1)).await;
    let addr = app.extender_addr.unwrap();
    let cluster = Mutex::new(register(&app, super::hami::NODES));
    let pods = trace(PODS);
    let mut outcome = Outcome::default();
    let (mut compared, mut arrivals) = (0, 0);
    let mut differences = Vec::new();
    for (departure, i) in events(&pods) {
        let mut cluster = cluster.lock().await;
        if departure {
            depart(&app, &mut cluster, &pods, i);
            continue;
        }
        arrivals += 1;
        let expected = if arrivals % SAMPLE == 0 {
            Some(simulated(&app, &cluster, &pods[i]).await)
        } else {
            None
        };
        let admitted = admit(addr, &pods[i], cluster.nodes).await;
        if let Some(expected) = expected {
            compared += 1;
            let got = admitted.choice.clone();
            if got != expected.as_ref().map(|(id, _)| id.clone()) {
                differences.push(format!(
                    "{} ({}): coloc chose {got:?}, the simulation's Place {expected:?}",
                    pods[i].name, pods[i].workload
                ));
            }
        }
        bind(&app, &mut cluster, &pods, i, admitted, &mut outcome);
    }
    println!(
        "harness, equal: {compared} states compared, {} differences",
        differences.len()
    );
    for difference in &differences {
        println!("  difference: {difference}");
    }
    assert_eq!(compared, PODS / SAMPLE);
    assert!(differences.is_empty(), "{differences:#?}");
    app.stop().await;
}
