//! How a GPU is shared by the processes colocated on it: CUDA MPS (kernels of the members
//! run concurrently on split SMs) or time-slicing (their contexts take turns). Every run
//! records its mode; every shipped dataset is MPS (docs/decisions/030-sharing-mode.md).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ValidationError;

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum SharingMode {
    /// CUDA Multi-Process Service: the mode of the KACE and H100 datasets.
    #[default]
    Mps,
    /// The GPU's contexts take turns (the device plugin's or KAI-Scheduler's time-slicing).
    TimeSlicing,
}

impl SharingMode {
    pub const ALL: [Self; 2] = [Self::Mps, Self::TimeSlicing];

    /// The mode as stored and as the settings spell it: "mps", "time-slicing".
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mps => "mps",
            Self::TimeSlicing => "time-slicing",
        }
    }

    /// A mode by its stored name; `field` names the value in the error.
    pub fn parse(field: &str, raw: &str) -> Result<Self, ValidationError> {
        Self::ALL
            .into_iter()
            .find(|mode| mode.as_str() == raw.trim())
            .ok_or_else(|| {
                ValidationError::new(
                    field,
                    format!("sharing mode must be \"mps\" or \"time-slicing\", got {raw:?}"),
                )
            })
    }
}

impl TryFrom<String> for SharingMode {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        Self::parse("sharing_mode", &raw).map_err(|e| e.message)
    }
}

impl fmt::Display for SharingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_back_their_stored_names_and_others_are_refused() {
        assert_eq!(SharingMode::parse("m", "mps").unwrap(), SharingMode::Mps);
        assert_eq!(
            SharingMode::parse("m", "time-slicing").unwrap(),
            SharingMode::TimeSlicing
        );
        let error = SharingMode::parse("m", "mig").unwrap_err();
        assert_eq!(error.field, "m");
        assert!(SharingMode::parse("m", "MPS").is_err());
    }
}
