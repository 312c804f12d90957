//! `[observer]`: the task that turns what the cluster ran into runs by itself
//! (docs/observer.md). Off unless `sources` names at least one throughput source.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Settings, SettingsError};

/// A throughput source the observer may read (`observer.sources`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ThroughputSourceKind {
    /// Prometheus' HTTP API (`/api/v1/query_range`), one PromQL template per workload.
    Prometheus,
    /// What workloads push to `POST /observer/throughput` on the metrics endpoint.
    Push,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ObserverSettings {
    /// The throughput sources, tried in this order for each pod; empty = the observer is off.
    pub sources: Vec<ThroughputSourceKind>,
    /// How often the observer looks at the cluster and forms the windows that closed.
    pub interval_secs: u64,
    /// A GPU's set of pods must stay the same this long to make a run.
    pub min_window_secs: u64,
    /// Seconds left out of the mean at each end of a window: at the start, the range a rate
    /// reaches back over plus a scrape interval (values there still mix the set before); at
    /// the end, a scrape begun before the change but answered after it.
    pub guard_secs: u64,
    /// A window is read this long after it closed (the last scrapes or pushes arrive).
    pub settle_secs: u64,
    /// A series whose last value is older than this before the window's end is stale.
    pub stale_secs: u64,
    pub prometheus: PrometheusSettings,
    pub push: PushSettings,
    /// The share of Place's placements (answers offering a GPU) that may explore: offer
    /// first the admitted GPU whose new set's interval is widest, when the low end of every
    /// member's interval keeps its caps and floors (decision 024). 0 = never; at most 1.
    pub explore_budget: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PrometheusSettings {
    /// Prometheus' base URL (http only), e.g. http://prometheus:9090.
    pub url: String,
    /// The query_range step.
    pub step_secs: u64,
    pub timeout_secs: u64,
    /// The PromQL template of workloads with none of their own; "" = none. Placeholders:
    /// {pod_uid}, {pod}, {namespace}, {workload}.
    pub default_query: String,
    /// Per workload: its PromQL template (a pod's `coloc.io/throughput-query` comes first).
    pub queries: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PushSettings {
    /// Values kept per pod (the oldest go first).
    pub max_points_per_pod: usize,
    /// Pods kept at most (a push for one more is refused).
    pub max_pods: usize,
}

impl Default for ObserverSettings {
    fn default() -> Self {
        Self {
            sources: Vec::new(),
            interval_secs: 15,
            min_window_secs: 300,
            guard_secs: 60,
            settle_secs: 30,
            stale_secs: 120,
            prometheus: PrometheusSettings::default(),
            push: PushSettings::default(),
            explore_budget: 0.0,
        }
    }
}

impl Default for PrometheusSettings {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:9090".into(),
            step_secs: 15,
            timeout_secs: 10,
            default_query: String::new(),
            queries: BTreeMap::new(),
        }
    }
}

impl Default for PushSettings {
    fn default() -> Self {
        Self {
            max_points_per_pod: 4096,
            max_pods: 10_000,
        }
    }
}

impl Settings {
    pub(super) fn validate_observer(&self) -> Result<(), SettingsError> {
        let observer = &self.observer;
        if !(0.0..=1.0).contains(&observer.explore_budget) {
            return Err(SettingsError::Invalid {
                key: "observer.explore_budget",
                message: format!(
                    "{} is not a share of placements between 0 and 1 (0.05 = 5 %)",
                    observer.explore_budget
                ),
            });
        }
        if observer.sources.is_empty() {
            return Ok(());
        }
        for (key, value) in [
            ("observer.interval_secs", observer.interval_secs),
            ("observer.min_window_secs", observer.min_window_secs),
            ("observer.stale_secs", observer.stale_secs),
            (
                "observer.prometheus.step_secs",
                observer.prometheus.step_secs,
            ),
            (
                "observer.prometheus.timeout_secs",
                observer.prometheus.timeout_secs,
            ),
        ] {
            if value == 0 {
                return Err(SettingsError::Invalid {
                    key,
                    message: "must be at least 1 while the observer is on".into(),
                });
            }
        }
        if 2 * observer.guard_secs >= observer.min_window_secs {
            return Err(SettingsError::Invalid {
                key: "observer.guard_secs",
                message: format!(
                    "the guard ({} s, at each end) must be under half observer.min_window_secs \
                     ({} s), or no window keeps a value",
                    observer.guard_secs, observer.min_window_secs
                ),
            });
        }
        if observer.sources.contains(&ThroughputSourceKind::Prometheus)
            && !observer.prometheus.url.starts_with("http://")
        {
            return Err(SettingsError::Invalid {
                key: "observer.prometheus.url",
                message: format!(
                    "{:?} is not an http:// URL like http://prometheus:9090",
                    observer.prometheus.url
                ),
            });
        }
        if observer.sources.contains(&ThroughputSourceKind::Push) && self.metrics.listen.is_none() {
            return Err(SettingsError::Invalid {
                key: "observer.sources",
                message: "the push source is served on the metrics endpoint: set metrics.listen"
                    .into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::settings::{Settings, SettingsError, SettingsSources};

    fn load(toml: &str) -> Result<Settings, SettingsError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coloc.toml");
        std::fs::write(&path, toml).unwrap();
        Settings::load(SettingsSources {
            file: Some(&path),
            environment: Some(Default::default()),
            overrides: Vec::new(),
        })
    }

    fn invalid_key(toml: &str) -> &'static str {
        match load(toml) {
            Err(SettingsError::Invalid { key, .. }) => key,
            other => panic!("{toml}: {other:?}"),
        }
    }

    #[test]
    fn the_observer_is_off_by_default_and_its_settings_are_checked_when_on() {
        let defaults = load("").unwrap().observer;
        assert!(defaults.sources.is_empty());
        assert_eq!((defaults.min_window_secs, defaults.guard_secs), (300, 60));
        let on = "[observer]\nsources = [\"prometheus\", \"push\"]\n";
        assert_eq!(load(on).unwrap().observer.sources.len(), 2);
        assert_eq!(
            invalid_key(&format!("{on}min_window_secs = 120\n")),
            "observer.guard_secs"
        );
        assert_eq!(
            invalid_key(&format!(
                "{on}[observer.prometheus]\nurl = \"prometheus:9090\"\n"
            )),
            "observer.prometheus.url"
        );
        assert_eq!(
            invalid_key("[metrics]\nlisten = \"\"\n[observer]\nsources = [\"push\"]\n"),
            "observer.sources"
        );
        assert!(load("[observer]\nsources = [\"carrier-pigeon\"]\n").is_err());
    }
}
