//! The Prometheus source: each pod's PromQL template (the pod's
//! `coloc.io/throughput-query`, read by the cluster watcher, else `observer.prometheus.queries[workload]`, else
//! `observer.prometheus.default_query`), filled in with the pod and evaluated over the span
//! with `GET /api/v1/query_range`. The answer is Prometheus' matrix
//! (`{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {..},
//! "values": [[<unix seconds>, "<value>"], ..]}]}}`); one series is the pod's, several are
//! ambiguous, none is missing.

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use serde::Deserialize;

use super::{
    source::{SeriesFuture, SeriesResult, SkipReason, Span, ThroughputSource},
    timeline::Pod,
};
use crate::settings::PrometheusSettings;

/// Answers bigger than this are refused (a template that matches far too much).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

pub struct PrometheusSource {
    client: Client<HttpConnector, Empty<Bytes>>,
    settings: PrometheusSettings,
}

#[derive(Debug, Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<Series>,
}

#[derive(Debug, Deserialize)]
struct Series {
    #[serde(default)]
    #[allow(dead_code)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

/// A label value inside a PromQL string literal.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The template with the pod's placeholders filled in.
pub fn fill(template: &str, pod: &Pod) -> String {
    let (namespace, name) = pod.name.split_once('/').unwrap_or(("", pod.name.as_str()));
    template
        .replace("{pod_uid}", &escape(&pod.uid))
        .replace("{pod}", &escape(name))
        .replace("{namespace}", &escape(namespace))
        .replace("{workload}", &escape(&pod.workload))
}

/// Unix seconds with milliseconds, as Prometheus reads them.
fn seconds(ms: i64) -> String {
    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
}

/// The values of a query_range answer's one series; `Err` with the reason to skip.
pub fn parse_answer(body: &[u8]) -> SeriesResult {
    let answer: Answer = serde_json::from_slice(body).map_err(|error| {
        tracing::warn!(%error, "observer: Prometheus answered something that is not its JSON");
        SkipReason::SourceFailed
    })?;
    if answer.status != "success" {
        tracing::warn!(
            error = answer.error.unwrap_or_default(),
            "observer: Prometheus refused the query"
        );
        return Err(SkipReason::SourceFailed);
    }
    let Some(data) = answer.data.filter(|d| d.result_type == "matrix") else {
        return Err(SkipReason::SourceFailed);
    };
    match data.result.as_slice() {
        [] => Ok(Vec::new()),
        [series] => Ok(series
            .values
            .iter()
            .map(|(at, raw)| {
                let at_ms = (at * 1000.0).round() as i64;
                (at_ms, raw.parse::<f64>().unwrap_or(f64::NAN))
            })
            .collect()),
        _ => Err(SkipReason::Ambiguous),
    }
}

impl PrometheusSource {
    pub fn new(settings: PrometheusSettings) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(settings.timeout_secs)));
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            settings,
        }
    }

    fn template<'a>(&'a self, pod: &'a Pod) -> Option<&'a str> {
        pod.query
            .as_deref()
            .or_else(|| self.settings.queries.get(&pod.workload).map(String::as_str))
            .or(Some(self.settings.default_query.as_str()))
            .filter(|t| !t.trim().is_empty())
    }

    async fn query_range(&self, query: &str, span: Span) -> SeriesResult {
        let params = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", query)
            .append_pair("start", &seconds(span.start_ms))
            .append_pair("end", &seconds(span.end_ms))
            .append_pair("step", &self.settings.step_secs.to_string())
            .finish();
        let url = format!(
            "{}/api/v1/query_range?{params}",
            self.settings.url.trim_end_matches('/')
        );
        let uri: hyper::Uri = url.parse().map_err(|_| SkipReason::SourceFailed)?;
        let timeout = Duration::from_secs(self.settings.timeout_secs);
        let answer = tokio::time::timeout(timeout, async {
            let response = self.client.get(uri).await?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .to_bytes();
            anyhow::Ok((status, body))
        })
        .await;
        match answer {
            // Prometheus answers errors (400, 422, 503) with its JSON too.
            Ok(Ok((_, body))) => parse_answer(&body),
            Ok(Err(error)) => {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "observer: Prometheus unreachable"
                );
                Err(SkipReason::SourceFailed)
            }
            Err(_) => {
                tracing::warn!("observer: Prometheus did not answer in time");
                Err(SkipReason::SourceFailed)
            }
        }
    }
}

impl ThroughputSource for PrometheusSource {
    fn name(&self) -> &'static str {
        "prometheus"
    }

    fn series<'a>(&'a self, pod: &'a Pod, span: Span) -> SeriesFuture<'a> {
        Box::pin(async move {
            let Some(template) = self.template(pod) else {
                return Ok(Vec::new());
            };
            self.query_range(&fill(template, pod), span).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_and_quotes_escaped() {
        let pod = Pod {
            uid: "u-1".into(),
            workload: "bert\"x".into(),
            name: "ml/trainer-0".into(),
            query: None,
        };
        assert_eq!(
            fill(
                r#"rate(samples_total{namespace="{namespace}",pod="{pod}",uid="{pod_uid}",w="{workload}"}[1m])"#,
                &pod
            ),
            r#"rate(samples_total{namespace="ml",pod="trainer-0",uid="u-1",w="bert\"x"}[1m])"#
        );
        assert_eq!(seconds(1_700_000_000_123), "1700000000.123");
    }

    #[test]
    fn the_pods_own_query_comes_first_then_its_workloads_then_the_default() {
        let source = PrometheusSource::new(PrometheusSettings {
            default_query: "default".into(),
            queries: [("bert".to_string(), "bert's".to_string())].into(),
            ..PrometheusSettings::default()
        });
        let mut pod = Pod {
            uid: "u".into(),
            workload: "bert".into(),
            name: String::new(),
            query: Some("the pod's".into()),
        };
        assert_eq!(source.template(&pod), Some("the pod's"));
        pod.query = None;
        assert_eq!(source.template(&pod), Some("bert's"));
        pod.workload = "vit".into();
        assert_eq!(source.template(&pod), Some("default"));
        let none = PrometheusSource::new(PrometheusSettings::default());
        assert_eq!(none.template(&pod), None);
    }

    #[test]
    fn the_answer_shapes_of_prometheus_are_read() {
        let one = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"pod":"a"},"values":[[1700000000.5,"12.5"],[1700000001,"NaN"]]}]}}"#;
        let values = parse_answer(one).unwrap();
        assert_eq!(values[0], (1_700_000_000_500, 12.5));
        assert!(values[1].1.is_nan());
        let none = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert_eq!(parse_answer(none), Ok(Vec::new()));
        let two = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"pod":"a"},"values":[]},{"metric":{"pod":"b"},"values":[]}]}}"#;
        assert_eq!(parse_answer(two), Err(SkipReason::Ambiguous));
        let error = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert_eq!(parse_answer(error), Err(SkipReason::SourceFailed));
    }
}
