//! Physical bounds: absurd but finite metrics and throughputs (1e300 threads, 1e308
//! samples/s) are refused with INVALID_ARGUMENT naming the field, by the RPCs and the
//! importer alike, and leave the store unchanged.

use std::path::Path;

use coloc::{
    domain::GpuName,
    import::{import_kace, KACE_GPU, KACE_GPU_MEMORY_GB},
    proto as pb,
};
use tonic::Code;

use crate::helpers::{expect_code, kace_dir, profile, register_request, spawn_app, GPU};

#[tokio::test]
async fn absurd_metrics_and_throughputs_are_refused_by_every_rpc() {
    let mut app = spawn_app().await;
    for name in ["a", "b"] {
        app.client
            .register_workload(register_request(name, Some(profile(1, 1.0))))
            .await
            .unwrap();
    }
    let before = app.dump_store().await;
    type Mutation = fn(&mut pb::Profile);
    let cases: [(&str, Mutation); 7] = [
        ("kernel.threads", |p| {
            p.kernel.as_mut().unwrap().threads = 1e300
        }),
        ("kernel.registers", |p| {
            p.kernel.as_mut().unwrap().registers = 1e300
        }),
        ("kernel.static_shared_memory_bytes", |p| {
            p.kernel.as_mut().unwrap().static_shared_memory_bytes = 1e300
        }),
        ("kernel.compute_throughput_pct", |p| {
            p.kernel.as_mut().unwrap().compute_throughput_pct = 101.0
        }),
        ("system.exclusive_throughput", |p| {
            p.system.as_mut().unwrap().exclusive_throughput = 1e308
        }),
        ("system.memory_gb", |p| {
            p.system.as_mut().unwrap().memory_gb = 5000.0
        }),
        ("profile.gpu_memory_gb", |p| p.gpu_memory_gb = 1e9),
    ];
    for (field, mutate) in cases {
        let mut absurd = profile(2, 1.0);
        mutate(&mut absurd);
        let message = expect_code(
            app.client
                .put_profile(pb::PutProfileRequest {
                    name: "a".into(),
                    profile: Some(absurd.clone()),
                })
                .await,
            Code::InvalidArgument,
        );
        assert!(message.contains(field), "{field}: {message}");
        expect_code(
            app.client
                .register_workload(register_request("c", Some(absurd)))
                .await,
            Code::InvalidArgument,
        );
    }
    assert_eq!(
        app.dump_store().await,
        before,
        "a refused profile left a trace"
    );
    // A rounding margin above 100 % is accepted.
    let mut rounded = profile(3, 1.0);
    rounded.kernel.as_mut().unwrap().memory_throughput_pct = 100.05;
    app.client
        .register_workload(register_request("rounded", Some(rounded)))
        .await
        .unwrap();
    app.client
        .delete_workload(pb::DeleteWorkloadRequest {
            name: "rounded".into(),
        })
        .await
        .unwrap();

    let message = expect_code(
        app.client
            .report_colocation(pb::ReportColocationRequest {
                sharing_mode: None,
                gpu: GPU.into(),
                gpu_id: String::new(),
                members: vec![
                    pb::ColocatedMember {
                        workload: "a".into(),
                        throughput: 1e308,
                        job_id: String::new(),
                    },
                    pb::ColocatedMember {
                        workload: "b".into(),
                        throughput: 1e308,
                        job_id: String::new(),
                    },
                ],
                observed_at: None,
            })
            .await,
        Code::InvalidArgument,
    );
    assert!(message.contains("throughput"), "{message}");
    assert_eq!(app.count("observations").await, 0);
}

/// A copy of the KACE dataset in `dir` with one cell of `file` replaced.
fn hostile_copy(dir: &Path, file: &str, column: &str, value: &str) {
    for entry in std::fs::read_dir(kace_dir()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let index = header.iter().position(|h| *h == column).unwrap();
    let mut cells: Vec<String> = lines[1].split(',').map(str::to_string).collect();
    cells[index] = value.into();
    lines[1] = cells.join(",");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
}

#[tokio::test]
async fn the_importer_refuses_absurd_metrics_and_throughputs_and_writes_nothing() {
    let app = spawn_app().await;
    let gpu = GpuName::parse("gpu", KACE_GPU).unwrap();
    for (file, column, value) in [
        ("kernel_metrics.csv", "Registers", "1e300"),
        ("kernel_metrics.csv", "Threads", "1e300"),
        ("pairs.csv", "w1throughput", "1e308"),
    ] {
        let dir = tempfile::TempDir::new().unwrap();
        hostile_copy(dir.path(), file, column, value);
        let before = app.dump_store().await;
        let refused = import_kace(&app.advisor, dir.path(), &gpu, KACE_GPU_MEMORY_GB).await;
        let error = format!(
            "{:#}",
            refused.expect_err(&format!("{file} {column} = {value} imported"))
        );
        assert!(error.contains("at most"), "{error}");
        assert_eq!(app.dump_store().await, before, "{file} {column}");
    }
}
