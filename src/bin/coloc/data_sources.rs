//! Where the data the tools read comes from: a missing input is refused before any work
//! with the public source to fetch it from, so that a clone without `../shared/data` learns
//! what to get (docs/data.md lays out every file).

use std::path::Path;

/// The published measurements and trace the offline tools read.
#[derive(Debug, Clone, Copy)]
pub enum DataSet {
    /// KACE's V100 profiles and pairs (a folder).
    KaceV100,
    /// KACE's 3- or 4-way runs (a CSV).
    KaceNway,
    /// Alibaba's GPU cluster trace v2023 (a pod list CSV).
    AlibabaTrace,
}

impl DataSet {
    fn source(self) -> &'static str {
        match self {
            DataSet::KaceV100 => {
                "the KACE V100 measurements: clone the public repository \
                 nba556677go/KACE-artifact and give its folder (coloc reads its profiling/ and \
                 output/ layout), or lay its CSVs out as ../shared/data/kace-v100/"
            }
            DataSet::KaceNway => {
                "KACE's N-way runs: in the public repository nba556677go/KACE-artifact, \
                 scripts/multiinstance/dataset/ (3-way: comb3/.../KACE/trainbatch2/, 4-way: \
                 KACE/0907_total_labels_comb4_batch2-8_targetMPS100.csv), laid out as \
                 ../shared/data/kace-3way/runs.csv and ../shared/data/kace-4way/runs.csv"
            }
            DataSet::AlibabaTrace => {
                "Alibaba's GPU trace v2023: the public repository alibaba/clusterdata, \
                 cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv, laid out as \
                 ../shared/data/alibaba-gpu-v2023/"
            }
        }
    }
}

/// Refuses a missing `path` with where `set` comes from.
pub fn require(path: &Path, set: DataSet) -> anyhow::Result<()> {
    if path.exists() {
        return Ok(());
    }
    anyhow::bail!(
        "{} does not exist; it is {} (scripts/fetch-data.sh lays the public sources out; \
         docs/data.md says which file goes where)",
        path.display(),
        set.source()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_input_names_its_public_source() {
        let error = require(Path::new("/nonexistent/openb.csv"), DataSet::AlibabaTrace)
            .unwrap_err()
            .to_string();
        assert!(error.contains("/nonexistent/openb.csv"), "{error}");
        assert!(error.contains("alibaba/clusterdata"), "{error}");
        let error = require(Path::new("/nonexistent"), DataSet::KaceV100)
            .unwrap_err()
            .to_string();
        assert!(error.contains("nba556677go/KACE-artifact"), "{error}");
        assert!(require(Path::new("/"), DataSet::KaceNway).is_ok());
    }
}
