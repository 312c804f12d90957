//! The view's precedence when sources disagree, and its snapshots, without a store (the
//! AssignJob source is tested through the real server in tests/api/pod_devices.rs).

use super::*;

fn at(node: &str, gpu: &str, workload: &str) -> Residency {
    Residency {
        node: node.into(),
        gpus: vec![gpu.into()],
        workload: workload.into(),
        min_job_fraction: None,
    }
}

fn watched(node: &str, gpus: &[&str], source: Source, workload: Option<&str>) -> WatchedPod {
    WatchedPod {
        node: node.into(),
        gpus: gpus.iter().map(|g| g.to_string()).collect(),
        gpu_source: source,
        workload: workload.map(str::to_string),
        uid: None,
        min_job_fraction: Some(0.5),
        throughput_query: None,
        hami_allocated: Vec::new(),
    }
}

fn reported(pod: &str, gpus: &[&str]) -> PodDevices {
    PodDevices {
        pod: pod.into(),
        gpus: gpus.iter().map(|g| g.to_string()).collect(),
    }
}

/// (gpu, [(id, source)]) of one node.
fn sources_on(view: &ClusterView, node: &str) -> Vec<(String, Vec<(String, Source)>)> {
    view.occupied_gpus(node)
        .into_iter()
        .map(|(gpu, residents)| {
            (
                gpu,
                residents.into_iter().map(|r| (r.id, r.source)).collect(),
            )
        })
        .collect()
}

#[test]
fn a_moved_pod_leaves_its_old_gpu_and_a_relist_drops_the_unlisted() {
    let view = ClusterView::new();
    view.set_pod("a", Some(at("n1", "g0", "resnet")));
    view.set_pod("b", Some(at("n1", "g0", "bert")));
    view.set_pod("a", Some(at("n2", "g1", "resnet")));
    let occupancy = view.occupancy();
    assert_eq!(occupancy[&("n1".into(), "g0".into())], ["bert"]);
    assert_eq!(occupancy[&("n2".into(), "g1".into())], ["resnet"]);
    view.replace_pods([("c".to_string(), at("n3", "g2", "lstm"))]);
    assert_eq!(
        view.occupancy().into_keys().collect::<Vec<_>>(),
        [("n3".to_string(), "g2".to_string())]
    );
    view.set_pod("c", None);
    assert!(view.occupancy().is_empty());
}

#[test]
fn the_kubelets_report_places_a_pod_over_its_gpu_annotation_and_keeps_its_workload() {
    let view = ClusterView::new();
    view.set_watched_pod(
        "ml/train-1",
        Some(watched(
            "n1",
            &["gpu-0"],
            Source::GpuAnnotation,
            Some("bert"),
        )),
    );
    assert_eq!(
        sources_on(&view, "n1"),
        [(
            "gpu-0".into(),
            vec![("ml/train-1".into(), Source::GpuAnnotation)]
        )]
    );
    // The kubelet says the pod holds another GPU: that is where it runs.
    view.report_pod_devices("n1", vec![reported("ml/train-1", &["GPU-b"])], now_ms());
    let gpus = view.occupied_gpus("n1");
    assert_eq!(gpus.len(), 1, "{gpus:?}");
    let (gpu, residents) = &gpus[0];
    assert_eq!(gpu, "GPU-b");
    assert_eq!(residents[0].source, Source::PodResources);
    assert_eq!(
        residents[0].workload.as_deref(),
        Some("bert"),
        "from the annotation"
    );
    assert_eq!(residents[0].min_job_fraction, Some(0.5));
}

#[test]
fn hamis_allocation_wins_over_the_kubelets_device_ids() {
    let view = ClusterView::new();
    view.set_watched_pod(
        "ml/infer",
        Some(watched(
            "n1",
            &["GPU-hami"],
            Source::HamiAnnotation,
            Some("vit"),
        )),
    );
    view.report_pod_devices("n1", vec![reported("ml/infer", &["GPU-kubelet"])], now_ms());
    assert_eq!(
        sources_on(&view, "n1"),
        [(
            "GPU-hami".into(),
            vec![("ml/infer".into(), Source::HamiAnnotation)]
        )]
    );
}

#[test]
fn a_pod_coloc_did_not_place_nor_know_is_still_a_resident() {
    let view = ClusterView::new();
    view.report_pod_devices("n1", vec![reported("web/cuda-job", &["GPU-a"])], now_ms());
    let gpus = view.occupied_gpus("n1");
    assert_eq!(gpus[0].1[0].workload, None);
    assert_eq!(gpus[0].1[0].placement_name(), "unknown pod web/cuda-job");
    // A watched pod without a GPU annotation waits for its node's report.
    view.set_watched_pod(
        "ml/a",
        Some(watched("n2", &[], Source::HamiAnnotation, Some("w"))),
    );
    assert!(view.occupied_gpus("n2").is_empty());
}

#[test]
fn a_report_is_a_full_snapshot_and_a_stale_one_falls_back_to_the_annotations() {
    let view = ClusterView::new();
    view.set_watched_pod(
        "ml/a",
        Some(watched("n1", &["GPU-a"], Source::GpuAnnotation, Some("w1"))),
    );
    let now = now_ms();
    view.report_pod_devices(
        "n1",
        vec![
            reported("ml/a", &["GPU-b"]),
            reported("ml/b", &["GPU-b", "GPU-b"]),
        ],
        now,
    );
    assert_eq!(
        sources_on(&view, "n1"),
        [(
            "GPU-b".into(),
            vec![
                ("ml/a".into(), Source::PodResources),
                ("ml/b".into(), Source::PodResources)
            ]
        )]
    );
    // The same snapshot again: the same view.
    let again = view.report_pod_devices(
        "n1",
        vec![reported("ml/a", &["GPU-b"]), reported("ml/b", &["GPU-b"])],
        now,
    );
    assert_eq!(again, (2, 1));
    // ml/b left: the next snapshot does not list it.
    view.report_pod_devices("n1", vec![reported("ml/a", &["GPU-b"])], now);
    assert_eq!(
        sources_on(&view, "n1"),
        [("GPU-b".into(), vec![("ml/a".into(), Source::PodResources)])]
    );
    // The agent went quiet: after the stale limit the annotation places ml/a again.
    view.set_stale_after_ms(1_000);
    view.report_pod_devices("n1", vec![reported("ml/a", &["GPU-b"])], now - 5_000);
    assert_eq!(
        sources_on(&view, "n1"),
        [("GPU-a".into(), vec![("ml/a".into(), Source::GpuAnnotation)])]
    );
}

#[test]
fn listings_carry_the_nodes_gpu_model_and_every_source() {
    let view = ClusterView::new();
    view.set_node(
        "n1",
        Some(NodeGpus {
            count: 2,
            gpu_model: Some("Tesla-V100-SXM2-32GB".into()),
            memory_gb: None,
        }),
    );
    view.set_pod("ml/a", Some(at("n1", "gpu-0", "bert")));
    view.report_pod_devices("n1", vec![reported("ml/b", &["GPU-x"])], now_ms());
    let gpus = view.gpus();
    let summary: Vec<(&str, Option<&str>, Source)> = gpus
        .iter()
        .map(|g| (g.id.as_str(), g.gpu_model.as_deref(), g.residents[0].source))
        .collect();
    assert_eq!(
        summary,
        [
            ("GPU-x", Some("Tesla-V100-SXM2-32GB"), Source::PodResources),
            ("gpu-0", Some("Tesla-V100-SXM2-32GB"), Source::GpuAnnotation),
        ]
    );
}

#[test]
fn a_pod_seen_bound_counts_as_landed_after_it_leaves() {
    let view = ClusterView::new();
    assert!(!view.is_bound("ml/a"), "never seen");
    view.set_pod("ml/a", Some(at("n1", "GPU-a", "w1")));
    assert!(view.is_bound("ml/a"));
    view.set_watched_pod("ml/a", None);
    assert!(
        view.is_bound("ml/a"),
        "left: a hold for it is done all the same"
    );
    assert!(view.occupied_gpus("n1").is_empty(), "and it is no resident");
    // Leaving by a relist that no longer lists it, likewise.
    view.set_pod("ml/b", Some(at("n1", "GPU-b", "w1")));
    view.replace_pods([("ml/c".to_string(), at("n1", "GPU-c", "w1"))]);
    assert!(view.is_bound("ml/b") && view.is_bound("ml/c"));
    // A pod never bound that is forgotten stays unknown.
    view.set_watched_pod("ml/d", None);
    assert!(!view.is_bound("ml/d"));
}

#[test]
fn the_borrowed_reading_names_the_same_residents_as_the_owned_one() {
    let view = ClusterView::new();
    view.set_pod("a", Some(at("n1", "g0", "resnet")));
    view.set_pod("b", Some(at("n1", "g0", "bert")));
    view.set_pod("c", Some(at("n2", "g1", "lstm")));
    view.set_watched_pod(
        "web/cuda",
        Some(watched("n1", &[], Source::GpuAnnotation, None)),
    );
    view.report_pod_devices("n1", vec![reported("web/cuda", &["g1"])], now_ms());
    let wanted = HashSet::from(["n1", "n2", "n3"]);
    let owned = view.occupied_by_node(&wanted);
    let borrowed: HashMap<String, Vec<(String, Vec<Resident>)>> =
        view.with_occupied_by_node(&wanted, |by_node| {
            by_node
                .iter()
                .map(|(node, gpus)| {
                    let gpus = gpus
                        .iter()
                        .map(|(gpu, residents)| {
                            let residents = residents.iter().map(ResidentRef::to_resident);
                            (gpu.to_string(), residents.collect())
                        })
                        .collect();
                    (node.to_string(), gpus)
                })
                .collect()
        });
    assert_eq!(borrowed, owned);
    assert_eq!(owned["n1"].len(), 2, "{owned:?}");
    let unknown = view.with_occupied_by_node(&wanted, |by_node| {
        by_node["n1"]["g1"][0].placement_name().into_owned()
    });
    assert_eq!(unknown, "unknown pod web/cuda");
}

/// (gpu, id, workload, floor, source) of a resident.
type Placed = (String, String, Option<String>, Option<f64>, Source);

/// Every resident of one node.
fn residents_on(view: &ClusterView, node: &str) -> Vec<Placed> {
    view.occupied_gpus(node)
        .into_iter()
        .flat_map(|(gpu, residents)| {
            residents
                .into_iter()
                .map(move |r| (gpu.clone(), r.id, r.workload, r.min_job_fraction, r.source))
        })
        .collect()
}

#[test]
fn a_claims_residency_places_the_watched_pod_and_outlives_the_pod_watchers_word() {
    let view = ClusterView::new();
    let claimed = WatchedPod {
        min_job_fraction: None,
        ..watched("n2", &["GPU-c"], Source::DraAllocation, Some("from-claim"))
    };
    // The pod watcher records the pod (workload and floor, no GPU), the claim watcher
    // where its claim's device is.
    view.set_watched_pod(
        "ml/p",
        Some(watched("n2", &[], Source::GpuAnnotation, Some("bert"))),
    );
    view.set_claim_residency("ml/p", Some(claimed.clone()));
    let placed = vec![(
        "GPU-c".to_string(),
        "ml/p".to_string(),
        Some("bert".to_string()),
        Some(0.5),
        Source::DraAllocation,
    )];
    assert_eq!(residents_on(&view, "n2"), placed);
    // The pod watcher's events and relists do not take the claim's word away: a DRA pod
    // without coloc's annotations is no pod of its own.
    view.set_watched_pod("ml/p", None);
    view.replace_watched_pods(Vec::new());
    assert_eq!(
        residents_on(&view, "n2"),
        [(
            "GPU-c".to_string(),
            "ml/p".to_string(),
            Some("from-claim".to_string()),
            None,
            Source::DraAllocation,
        )]
    );
    view.replace_watched_pods([(
        "ml/p".to_string(),
        watched("n2", &[], Source::GpuAnnotation, Some("bert")),
    )]);
    assert_eq!(residents_on(&view, "n2"), placed);
    // The claim released: the pod is placed no more (no GPU of its own), and the pod
    // watcher's record stands.
    view.set_claim_residency("ml/p", None);
    assert!(residents_on(&view, "n2").is_empty());
    assert_eq!(view.resident_pods(), 1);
}

#[test]
fn a_claim_relist_drops_the_unlisted_claims_and_a_claim_ends_the_pods_hold() {
    let view = ClusterView::new();
    let on = |gpu: &str| watched("n1", &[gpu], Source::DraAllocation, Some("w1"));
    assert!(!view.is_bound("ml/a"));
    view.set_claim_residency("ml/a", Some(on("GPU-a")));
    assert!(
        view.is_bound("ml/a"),
        "allocated and reserved: the hold is done"
    );
    view.set_pod("ml/b", Some(at("n1", "GPU-b", "w2")));
    view.replace_claim_residencies([("ml/c".to_string(), on("GPU-c"))]);
    let gpus: Vec<String> = view
        .occupied_gpus("n1")
        .into_iter()
        .map(|(g, _)| g)
        .collect();
    assert_eq!(gpus, ["GPU-b", "GPU-c"], "a gone, b the pod watcher's");
    assert!(view.is_bound("ml/a"), "left: still landed");
}
