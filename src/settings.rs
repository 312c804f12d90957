//! Typed settings, layered: built-in defaults, then an optional TOML file, then the
//! environment (`COLOC__SECTION__KEY`, e.g. `COLOC__SERVER__LISTEN`), then command-line
//! flags. Everything is validated before any port is bound; an error names the bad key.

use std::{net::SocketAddr, path::Path};

use config::{Config, Environment, File, FileFormat, Map};
use serde::{Deserialize, Serialize};

use crate::{domain::GpuName, model::ModelKind};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub model: ModelSettings,
    pub log: LogSettings,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address the gRPC server binds, e.g. 127.0.0.1:50051.
    pub listen: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// sqlx SQLite URL; the file is created if missing.
    pub url: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// GPU model used when a request names none; empty = the only one known.
    pub default_gpu: String,
    /// Model kind Train fits when the request names none.
    pub kind: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// A tracing filter, e.g. "info" or "coloc=debug,info". RUST_LOG overrides it.
    pub level: String,
    /// "text" or "json".
    pub format: String,
}

const DEFAULTS: &str = r#"
[server]
listen = "127.0.0.1:50051"

[database]
url = "sqlite://./coloc.db"

[model]
default_gpu = ""
kind = "member-ridge-gbt"

[log]
level = "info"
format = "text"
"#;

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("cannot read settings: {0}")]
    Load(#[from] config::ConfigError),
    #[error("setting {key} is invalid: {message}")]
    Invalid { key: &'static str, message: String },
}

/// Where settings come from, besides the defaults.
#[derive(Debug, Default)]
pub struct SettingsSources<'a> {
    pub file: Option<&'a Path>,
    /// The environment to read `COLOC__...` variables from; `None` = the process's own.
    pub environment: Option<Map<String, String>>,
    /// Command-line overrides as (key, value), e.g. ("server.listen", "0.0.0.0:50051").
    pub overrides: Vec<(&'static str, String)>,
}

impl Settings {
    pub fn load(sources: SettingsSources<'_>) -> Result<Self, SettingsError> {
        let mut builder = Config::builder().add_source(File::from_str(DEFAULTS, FileFormat::Toml));
        if let Some(path) = sources.file {
            builder = builder.add_source(File::from(path).format(FileFormat::Toml).required(true));
        }
        builder = builder.add_source(
            Environment::with_prefix("COLOC")
                .prefix_separator("__")
                .separator("__")
                .source(sources.environment),
        );
        for (key, value) in sources.overrides {
            builder = builder.set_override(key, value)?;
        }
        let settings: Settings = builder.build()?.try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }

    pub fn validate(&self) -> Result<(), SettingsError> {
        self.listen_address()?;
        if !self.database.url.starts_with("sqlite:") {
            return Err(SettingsError::Invalid {
                key: "database.url",
                message: format!("{:?} is not a sqlite: URL", self.database.url),
            });
        }
        self.default_gpu()?;
        self.model_kind()?;
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(SettingsError::Invalid {
                key: "log.format",
                message: format!("{:?} is neither \"text\" nor \"json\"", self.log.format),
            });
        }
        tracing_subscriber::EnvFilter::try_new(&self.log.level).map_err(|e| {
            SettingsError::Invalid {
                key: "log.level",
                message: e.to_string(),
            }
        })?;
        Ok(())
    }

    pub fn listen_address(&self) -> Result<SocketAddr, SettingsError> {
        self.server
            .listen
            .parse()
            .map_err(|e| SettingsError::Invalid {
                key: "server.listen",
                message: format!(
                    "{:?} is not an address like 127.0.0.1:50051 ({e})",
                    self.server.listen
                ),
            })
    }

    pub fn model_kind(&self) -> Result<ModelKind, SettingsError> {
        ModelKind::parse(&self.model.kind).ok_or_else(|| SettingsError::Invalid {
            key: "model.kind",
            message: format!(
                "{:?} is not one of {:?}",
                self.model.kind,
                ModelKind::ALL.map(ModelKind::as_str)
            ),
        })
    }

    pub fn default_gpu(&self) -> Result<Option<GpuName>, SettingsError> {
        if self.model.default_gpu.is_empty() {
            return Ok(None);
        }
        GpuName::parse("model.default_gpu", &self.model.default_gpu)
            .map(Some)
            .map_err(|e| SettingsError::Invalid {
                key: "model.default_gpu",
                message: e.0,
            })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Option<Map<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn defaults_work_with_no_file_and_no_environment() {
        let settings = Settings::load(SettingsSources {
            environment: env(&[]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(settings.server.listen, "127.0.0.1:50051");
        assert_eq!(settings.database.url, "sqlite://./coloc.db");
        assert_eq!(settings.default_gpu().unwrap(), None);
    }

    #[test]
    fn file_then_environment_then_flags_take_precedence_in_that_order() {
        let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        writeln!(file, "[server]\nlisten = \"127.0.0.1:1\"\n[database]\nurl = \"sqlite://file.db\"\n[model]\ndefault_gpu = \"from file\"").unwrap();
        let settings = Settings::load(SettingsSources {
            file: Some(file.path()),
            environment: env(&[
                ("COLOC__DATABASE__URL", "sqlite://env.db"),
                ("COLOC__SERVER__LISTEN", "127.0.0.1:2"),
            ]),
            overrides: vec![("server.listen", "127.0.0.1:3".into())],
        })
        .unwrap();
        assert_eq!(settings.model.default_gpu, "from file");
        assert_eq!(settings.database.url, "sqlite://env.db");
        assert_eq!(settings.server.listen, "127.0.0.1:3");
    }

    #[test]
    fn a_bad_value_is_reported_with_its_key() {
        let error = Settings::load(SettingsSources {
            environment: env(&[("COLOC__SERVER__LISTEN", "not an address")]),
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("server.listen"), "{error}");
    }

    #[test]
    fn an_unknown_key_is_rejected_with_its_name() {
        let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        writeln!(file, "[server]\nlisen = \"127.0.0.1:1\"").unwrap();
        let error = Settings::load(SettingsSources {
            file: Some(file.path()),
            environment: env(&[]),
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("lisen"), "{error}");
    }
}
