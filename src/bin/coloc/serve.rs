//! The service and its store from the command line: `coloc serve` runs the gRPC service
//! until a signal; `coloc backup` copies its database; `coloc config` prints the effective
//! settings.

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use coloc::{
    settings::{Settings, SettingsSources},
    startup::{cancel_on_signal, App},
    telemetry,
};

use crate::args::{BackupArgs, CommonArgs, ConfigArgs, ServeArgs};

pub fn load_settings(common: &CommonArgs, listen: Option<&String>) -> anyhow::Result<Settings> {
    let overrides = listen
        .map(|listen| ("server.listen", listen.clone()))
        .into_iter()
        .collect();
    load_settings_with(common, overrides)
}

/// The settings from the file (`--config`), the environment and these command-line
/// overrides, `--database` included.
fn load_settings_with(
    common: &CommonArgs,
    mut overrides: Vec<(&'static str, String)>,
) -> anyhow::Result<Settings> {
    if let Some(url) = &common.database {
        overrides.push(("database.url", url.clone()));
    }
    Ok(Settings::load(SettingsSources {
        file: common.config.as_deref(),
        environment: None,
        overrides,
    })?)
}

/// `coloc serve`.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let listens = [
        ("server.listen", &args.listen),
        ("metrics.listen", &args.metrics_listen),
        ("extender.listen", &args.extender_listen),
    ];
    let overrides = listens
        .into_iter()
        .filter_map(|(key, value)| value.clone().map(|value| (key, value)))
        .collect();
    let mut settings = load_settings_with(&args.common, overrides)?;
    if let Some(format) = args.log_format {
        settings.log.format =
            format
                .parse()
                .map_err(|message| coloc::settings::SettingsError::Invalid {
                    key: "log.format",
                    message,
                })?;
    }
    telemetry::init(&settings.log.level, settings.log.format);
    let app = App::build(&settings).await?;
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(cancel_on_signal(shutdown.clone()));
    let served = app.run_until_stopped(shutdown).await;
    signals.abort();
    served
}

/// `coloc backup`.
pub async fn backup(args: BackupArgs) -> anyhow::Result<()> {
    let settings = load_settings(&args.common, None)?;
    let started = std::time::Instant::now();
    let summary = coloc::store::backup::backup(&settings.database.url, &args.file)
        .await
        .with_context(|| format!("cannot back up {}", settings.database.url))?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "file": args.file,
                "bytes": summary.bytes,
                "workloads": summary.workloads,
                "observations": summary.observations,
                "models": summary.models,
                "seconds": started.elapsed().as_secs_f64(),
            })
        );
    } else {
        println!(
            "backed up {} to {} in {:.2} s: {} bytes, {} workloads, {} runs, {} model \
             versions; integrity check ok",
            settings.database.url,
            args.file.display(),
            started.elapsed().as_secs_f64(),
            summary.bytes,
            summary.workloads,
            summary.observations,
            summary.models
        );
    }
    Ok(())
}

/// `coloc config`.
pub fn config(args: ConfigArgs) -> anyhow::Result<()> {
    let settings = load_settings(&args.common, None)?;
    // Settings hold no secret values: auth.tokens_file is a path, never its tokens.
    print!("{}", toml::to_string(&settings)?);
    Ok(())
}
