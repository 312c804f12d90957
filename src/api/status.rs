//! The one place where advisor errors become gRPC statuses: each cause gets its code here
//! and nowhere else. Invalid requests carry a `google.rpc.BadRequest` detail naming the
//! field, beside the human message. Internal causes are logged with their whole chain and
//! answered as a plain "internal error".

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::{advisor::Error, store::OccupancyConflict};

/// The gRPC code of each cause.
pub fn code(error: &Error) -> Code {
    match error {
        Error::InvalidRequest(_) | Error::AmbiguousGpuModel => Code::InvalidArgument,
        Error::UnknownWorkload(_)
        | Error::UnknownTarget(_)
        | Error::UnknownPlaceWorkload(_)
        | Error::UnknownReportedWorkload(_)
        | Error::UnknownModelVersion { .. } => Code::NotFound,
        Error::WorkloadExists(_)
        | Error::Occupancy(OccupancyConflict::JobAssignedElsewhere { .. }) => Code::AlreadyExists,
        Error::Occupancy(
            OccupancyConflict::GpuMismatch { .. } | OccupancyConflict::GpuFull { .. },
        ) => Code::FailedPrecondition,
        Error::NoGpuModelKnown
        | Error::NoModelForGpu(_)
        | Error::TargetNotProfiled { .. }
        | Error::MemberNotProfiled { .. }
        | Error::GpuMemoryUnknown(_)
        | Error::ModelPredictsOnlySums { .. }
        | Error::TrainingFailed(_)
        | Error::NothingPinned(_) => Code::FailedPrecondition,
        Error::LaunchSpecsDisabled | Error::ProgramNotAllowed(_) => Code::PermissionDenied,
        Error::Internal(_) => Code::Internal,
    }
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidRequest(invalid) => Status::with_error_details(
                Code::InvalidArgument,
                invalid.message.clone(),
                ErrorDetails::with_bad_request_violation(invalid.field, invalid.message),
            ),
            Error::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "internal error");
                Status::internal("internal error")
            }
            other => Status::new(code(&other), other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ValidationError;

    #[test]
    fn an_invalid_request_carries_its_field_as_a_bad_request_violation() {
        let status = Status::from(Error::from(ValidationError::new(
            "top_k",
            "top_k must not be negative, got -1",
        )));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "top_k must not be negative, got -1");
        let violations = status.get_details_bad_request().unwrap().field_violations;
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].field, "top_k");
    }

    #[test]
    fn internal_causes_are_never_sent() {
        let status = Status::from(Error::Internal(anyhow::anyhow!("disk /var/x is full")));
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(status.message(), "internal error");
    }
}
