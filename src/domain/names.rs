//! Names that clients use as keys: workload names and GPU model names.

use std::{borrow::Borrow, fmt, sync::Arc};

use super::ValidationError;

const MAX_NAME_CHARS: usize = 128;

/// Every name: present, and at most [`MAX_NAME_CHARS`] characters.
fn check_length(field: &str, raw: &str) -> Result<(), ValidationError> {
    if raw.is_empty() {
        return Err(ValidationError::new(
            field,
            format!("{field} must not be empty"),
        ));
    }
    if raw.chars().count() > MAX_NAME_CHARS {
        return Err(ValidationError::new(
            field,
            format!("{field} is longer than {MAX_NAME_CHARS} characters"),
        ));
    }
    Ok(())
}

/// A workload's unique name: 1 to 128 characters from letters, digits and `. _ - / : +`, so
/// that it is safe in logs, URLs and shell commands.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadName(Arc<str>);

impl WorkloadName {
    pub fn parse(field: &str, raw: &str) -> Result<Self, ValidationError> {
        Self::check(field, raw)?;
        Ok(Self(raw.into()))
    }

    /// The checks of [`WorkloadName::parse`] without making a name: for names that are only
    /// looked up (a map keyed by `WorkloadName` is searched by `&str`).
    pub fn check(field: &str, raw: &str) -> Result<(), ValidationError> {
        check_length(field, raw)?;
        if let Some(bad) = raw
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "._-/:+".contains(*c)))
        {
            return Err(ValidationError::new(
                field,
                format!("{field} {raw:?} contains {bad:?}; use letters, digits and . _ - / : +"),
            ));
        }
        Ok(())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Hashes and compares as its text (the derived `Hash` and `Eq` delegate to `str`).
impl Borrow<str> for WorkloadName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkloadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A GPU model as NVML names it ("Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3"): 1 to 128
/// printable characters, no leading or trailing space.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuName(Arc<str>);

impl GpuName {
    pub fn parse(field: &str, raw: &str) -> Result<Self, ValidationError> {
        check_length(field, raw)?;
        if raw.trim() != raw || raw.chars().any(char::is_control) {
            return Err(ValidationError::new(
                field,
                format!("{field} {raw:?} has control characters or leading/trailing spaces"),
            ));
        }
        Ok(Self(raw.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GpuName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_names_from_the_kace_data_are_accepted() {
        for name in [
            "albert-base-v2_batch16-train",
            "vit_h_14_batch2-train",
            "team/a:v1+x",
        ] {
            assert_eq!(WorkloadName::parse("name", name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn workload_names_that_are_empty_long_or_odd_are_rejected() {
        let long = "a".repeat(129);
        for name in ["", long.as_str(), "has space", "semi;colon", "ünï"] {
            assert!(
                WorkloadName::parse("name", name).is_err(),
                "{name:?} accepted"
            );
        }
    }

    #[test]
    fn gpu_names_keep_inner_spaces_but_reject_padding_and_controls() {
        assert!(GpuName::parse("gpu", "NVIDIA H100 80GB HBM3").is_ok());
        for name in ["", " padded", "padded ", "tab\there"] {
            assert!(GpuName::parse("gpu", name).is_err(), "{name:?} accepted");
        }
    }
}
