//! The GPU a dataset was measured on, kept beside its CSVs as `gpu.json` (`{"gpu": "NVIDIA
//! H100 80GB HBM3", "gpu_memory_gb": 79.65}`): `coloc export` writes it, `coloc import`
//! reads it, so that a dataset can never be filed under another GPU model by default.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The file's name inside a dataset folder.
pub const GPU_FILE: &str = "gpu.json";

/// What `gpu.json` says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetGpu {
    /// The GPU model, as NVML names it (`nvidia-smi --query-gpu=name`).
    pub gpu: String,
    /// Its total memory, GB.
    pub gpu_memory_gb: f64,
}

impl DatasetGpu {
    /// `dir/gpu.json`, or `None` when the folder has none.
    pub fn read(dir: &Path) -> anyhow::Result<Option<Self>> {
        let path = dir.join(GPU_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(error).with_context(|| format!("cannot read {}", path.display()))
            }
        };
        let recorded: Self = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a dataset's GPU file", path.display()))?;
        if recorded.gpu.trim().is_empty() {
            anyhow::bail!("{}: gpu is empty", path.display());
        }
        if !(recorded.gpu_memory_gb.is_finite() && recorded.gpu_memory_gb > 0.0) {
            anyhow::bail!("{}: gpu_memory_gb must be > 0", path.display());
        }
        Ok(Some(recorded))
    }

    /// Writes `dir/gpu.json` (a temporary file, synced, then renamed over it).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let path = dir.join(GPU_FILE);
        let temporary = dir.join(format!(".{GPU_FILE}.tmp"));
        let mut file = std::fs::File::create(&temporary)?;
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        file.write_all(text.as_bytes())?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back_and_a_missing_one_is_none() {
        let dir = tempfile::TempDir::new().unwrap();
        assert_eq!(DatasetGpu::read(dir.path()).unwrap(), None);
        let gpu = DatasetGpu {
            gpu: "NVIDIA H100 80GB HBM3".into(),
            gpu_memory_gb: 79.6474609375,
        };
        gpu.write(dir.path()).unwrap();
        assert_eq!(DatasetGpu::read(dir.path()).unwrap(), Some(gpu));
    }

    #[test]
    fn a_file_without_memory_or_with_unknown_keys_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        for text in [
            r#"{"gpu": "Tesla T4"}"#,
            r#"{"gpu": "Tesla T4", "gpu_memory_gb": 16, "extra": 1}"#,
            r#"{"gpu": "", "gpu_memory_gb": 16}"#,
            r#"{"gpu": "Tesla T4", "gpu_memory_gb": -1}"#,
        ] {
            std::fs::write(dir.path().join(GPU_FILE), text).unwrap();
            assert!(DatasetGpu::read(dir.path()).is_err(), "{text}");
        }
    }
}
