//! Datasets in and out of a store: `coloc import kace` loads a KACE-format dataset (into
//! the database directly, or through a running server's API with `--addr`), and `coloc
//! export kace` writes one GPU model's data back out in that format.

use std::path::PathBuf;

use anyhow::Context;

use coloc::{advisor::Advisor, domain::GpuName, import, store::Store, telemetry};

use crate::{
    args::{Connection, ExportKaceArgs, ImportKaceArgs},
    operator,
    serve::load_settings,
};

/// The offline tools print a summary on stdout; the service's info lines (models loaded,
/// writers stopped) would only bury it, so they log warnings and errors unless RUST_LOG
/// asks for more.
fn init_quiet_logs(settings: &coloc::settings::Settings) {
    telemetry::init("warn", settings.log.format);
}

/// `coloc export kace`.
pub async fn export(args: ExportKaceArgs) -> anyhow::Result<()> {
    let settings = load_settings(&args.common, None)?;
    init_quiet_logs(&settings);
    let gpu = GpuName::parse("--gpu", &args.gpu).map_err(|e| anyhow::anyhow!(e.message))?;
    let overwrite = if args.force {
        coloc::dataset::Overwrite::Replace
    } else {
        coloc::dataset::Overwrite::Refuse
    };
    let summary = coloc::export::export_kace(&settings.database.url, &gpu, &args.dir, overwrite)
        .await
        .with_context(|| format!("cannot export {gpu} from {}", settings.database.url))?;
    print_export_summary(&summary);
    Ok(())
}

/// The GPU model and memory an import files its data under: the flags, else the dataset's
/// `gpu.json`; never a default. Flags that contradict `gpu.json` are refused.
fn dataset_gpu(args: &ImportKaceArgs) -> anyhow::Result<(GpuName, f64)> {
    let recorded = coloc::dataset::DatasetGpu::read(&args.dir)?;
    let file = coloc::dataset::GPU_FILE;
    let dir = args.dir.display();
    let (gpu, memory) = match (&args.gpu, args.gpu_memory_gb, recorded) {
        (None, _, None) => anyhow::bail!(
            "{dir} does not say which GPU model it was measured on (no {file}): name it with \
             --gpu and --gpu-memory-gb (the published KACE V100 data: --gpu \
             \"{}\" --gpu-memory-gb {})",
            import::KACE_GPU,
            import::KACE_GPU_MEMORY_GB
        ),
        (Some(gpu), None, None) => {
            anyhow::bail!("{dir} has no {file}: say the memory of {gpu} with --gpu-memory-gb")
        }
        (Some(gpu), Some(memory), None) => (gpu.clone(), memory),
        (flag, memory, Some(recorded)) => {
            if let Some(flag) = flag.as_ref().filter(|flag| **flag != recorded.gpu) {
                anyhow::bail!(
                    "{dir}/{file} says the data was measured on {:?}, not {flag:?}: \
                     import it under its own GPU model (leave --gpu out)",
                    recorded.gpu
                );
            }
            if let Some(memory) = memory.filter(|memory| *memory != recorded.gpu_memory_gb) {
                anyhow::bail!(
                    "{dir}/{file} says {:?} has {} GB, not {memory}",
                    recorded.gpu,
                    recorded.gpu_memory_gb
                );
            }
            (recorded.gpu, recorded.gpu_memory_gb)
        }
    };
    let gpu = GpuName::parse("--gpu", &gpu).map_err(|e| anyhow::anyhow!(e.message))?;
    coloc::domain::check_memory_gb("--gpu-memory-gb", memory)
        .map_err(|e| anyhow::anyhow!(e.message))?;
    Ok((gpu, memory))
}

/// `coloc import kace`.
pub async fn import(args: ImportKaceArgs) -> anyhow::Result<()> {
    let settings = load_settings(&args.common, None)?;
    init_quiet_logs(&settings);
    let (gpu, gpu_memory_gb) = dataset_gpu(&args)?;
    if let Some(addr) = &args.addr {
        let connection = Connection {
            addr: addr.clone(),
            token: std::env::var("COLOC_TOKEN").ok(),
            ca_cert: args.ca_cert.clone(),
            json: false,
        };
        let summary =
            operator::import::import_kace(&connection, &args.dir, &gpu, gpu_memory_gb).await?;
        print_import_summary(&gpu, &summary);
        return Ok(());
    }
    // A failed import leaves no new database file behind.
    let created = new_database_file(&settings.database.url);
    // Writes the file directly: never behind a running server's back.
    let _database_lock = coloc::store::DatabaseLock::acquire(&settings.database.url)?;
    let imported = async {
        let store = Store::open(&settings.database.url)
            .await
            .context("cannot open the database")?;
        let advisor = Advisor::load(store, coloc::startup::advisor_options(&settings)?).await?;
        let summary = import::import_kace(&advisor, &args.dir, &gpu, gpu_memory_gb).await;
        advisor.store().close().await;
        summary
    }
    .await;
    let summary = match imported {
        Ok(summary) => summary,
        Err(error) => {
            if let Some(path) = created {
                for suffix in ["", "-wal", "-shm", "-journal", ".lock"] {
                    let mut file = path.clone().into_os_string();
                    file.push(suffix);
                    let _ = std::fs::remove_file(file);
                }
            }
            return Err(error);
        }
    };
    print_import_summary(&gpu, &summary);
    Ok(())
}

/// The database file `url` names, when it does not exist yet (a command that fails may
/// remove what it created).
fn new_database_file(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next()?;
    if path.is_empty() || path.contains(":memory:") {
        return None;
    }
    let path = PathBuf::from(path);
    (!path.exists()).then_some(path)
}

fn print_import_summary(gpu: &GpuName, summary: &import::ImportSummary) {
    println!(
        "workloads: {} registered, {} updated, {} unchanged; {} skipped without both kernel and system metrics",
        summary.workloads_registered,
        summary.workloads_updated,
        summary.workloads_unchanged,
        summary.incomplete_workloads.len()
    );
    println!(
        "observations on {gpu}: {} new of {} pairs ({} already stored); {} pairs skipped",
        summary.observations_new,
        summary.observations_total,
        summary.observations_total - summary.observations_new,
        summary.pairs_skipped
    );
    if let Some(batch) = summary.import_batch {
        println!("import batch {batch} (undo: coloc runs delete --import-batch {batch})");
    }
    for model in &summary.models {
        match model {
            Ok(model) => println!(
                "model: version {} ({}), {} observations, in-sample R^2 {:.3}, MSE {:.2}: {} ({})",
                model.version,
                model.kind,
                model.observations,
                model.r2,
                model.mse,
                model.status,
                model.reason
            ),
            Err(reason) => println!("model: not trained: {reason}"),
        }
    }
}

fn print_export_summary(summary: &coloc::export::ExportSummary) {
    let gpu = &summary.gpu;
    println!(
        "exported {} workloads and {} pairs of {gpu} to {}",
        summary.workloads,
        summary.pairs,
        summary.dir.display()
    );
    if summary.incomplete_workloads > 0 {
        println!(
            "{} workloads profiled on {gpu} without kernel metrics not exported",
            summary.incomplete_workloads
        );
    }
    if summary.crowded_runs > 0 {
        println!(
            "{} runs of 3 or more members not exported",
            summary.crowded_runs
        );
    }
    if summary.pairs_without_profiles > 0 {
        println!(
            "{} pairs not exported: a member has no complete profile on {gpu}",
            summary.pairs_without_profiles
        );
    }
    if summary.time_sliced_runs > 0 {
        println!(
            "{} runs measured under time-slicing not exported: the KACE format holds MPS runs",
            summary.time_sliced_runs
        );
    }
}
