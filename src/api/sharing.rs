//! The sharing mode on the wire: a request's `sharing_mode` (unset or UNSPECIFIED: the
//! server's default for Rank, Predict and Place, MPS for a reported run), and what each
//! answer says of the mode it was asked for ([`ModeEvidence`]).

use crate::{advisor::ModeEvidence, domain::SharingMode, domain::ValidationError, proto as pb};

/// The request's mode; `None` when unset or UNSPECIFIED, an error for a value this server
/// does not know.
pub fn sharing_mode(raw: Option<i32>) -> Result<Option<SharingMode>, ValidationError> {
    match raw.map(pb::SharingMode::try_from) {
        None | Some(Ok(pb::SharingMode::Unspecified)) => Ok(None),
        Some(Ok(pb::SharingMode::Mps)) => Ok(Some(SharingMode::Mps)),
        Some(Ok(pb::SharingMode::TimeSlicing)) => Ok(Some(SharingMode::TimeSlicing)),
        Some(Err(_)) => Err(ValidationError::new(
            "sharing_mode",
            format!(
                "sharing_mode {} is not a known value (1 = MPS, 2 = TIME_SLICING)",
                raw.unwrap_or_default()
            ),
        )),
    }
}

pub fn sharing_mode_to_pb(mode: SharingMode) -> pb::SharingMode {
    match mode {
        SharingMode::Mps => pb::SharingMode::Mps,
        SharingMode::TimeSlicing => pb::SharingMode::TimeSlicing,
    }
}

/// Rank's answer, saying which mode it is for and whether the GPU model has runs of it.
pub fn rank_with_mode(mut answer: pb::RankResponse, evidence: ModeEvidence) -> pb::RankResponse {
    answer.sharing_mode = sharing_mode_to_pb(evidence.mode) as i32;
    answer.mode_unmeasured = evidence.unmeasured;
    answer.mode_note = evidence.note;
    answer
}

/// Predict's answer, as Rank's.
pub fn predict_with_mode(
    mut answer: pb::PredictResponse,
    evidence: ModeEvidence,
) -> pb::PredictResponse {
    answer.sharing_mode = sharing_mode_to_pb(evidence.mode) as i32;
    answer.mode_unmeasured = evidence.unmeasured;
    answer.mode_note = evidence.note;
    answer
}

/// Place's answer for `mode`: each GPU model's entry says whether it has runs of it
/// (`evidence` of the GPU model named).
pub fn place_with_mode(
    mut answer: pb::PlaceResponse,
    mode: SharingMode,
    evidence: impl Fn(&str) -> Option<ModeEvidence>,
) -> pb::PlaceResponse {
    answer.sharing_mode = sharing_mode_to_pb(mode) as i32;
    for model in &mut answer.models {
        if let Some(evidence) = evidence(&model.gpu) {
            model.mode_unmeasured = evidence.unmeasured;
            model.mode_note = evidence.note;
        }
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_and_unspecified_are_the_default_and_unknown_values_are_refused() {
        assert_eq!(sharing_mode(None), Ok(None));
        assert_eq!(sharing_mode(Some(0)), Ok(None));
        assert_eq!(sharing_mode(Some(1)), Ok(Some(SharingMode::Mps)));
        assert_eq!(sharing_mode(Some(2)), Ok(Some(SharingMode::TimeSlicing)));
        assert_eq!(sharing_mode(Some(7)).unwrap_err().field, "sharing_mode");
        assert!(sharing_mode(Some(-1)).is_err());
    }
}
