//! The one place where advisor errors become gRPC statuses: each cause gets its code here
//! and nowhere else. Invalid requests carry a `google.rpc.BadRequest` detail naming the
//! field, beside the human message. Internal causes are logged with their whole chain and
//! answered as a plain "internal error".

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::{advisor::Error, domain::ValidationError, store::OccupancyConflict};

/// The gRPC code of each cause.
pub fn code(error: &Error) -> Code {
    match error {
        Error::InvalidRequest(_) | Error::AmbiguousGpuModel | Error::WrongGpuForJob { .. } => {
            Code::InvalidArgument
        }
        Error::UnknownWorkload(_)
        | Error::UnknownTarget(_)
        | Error::UnknownPlaceWorkload(_)
        | Error::UnknownReportedWorkload(_)
        | Error::UnknownModelVersion { .. }
        | Error::UnknownAgent(_)
        | Error::UnknownJob(_)
        | Error::UnknownRuns(_)
        | Error::UnknownClusterGpu(_)
        | Error::UnknownNode(_)
        | Error::UnknownProfile { .. } => Code::NotFound,
        // The holder lost the job to an expired lease: a concurrency conflict, settled by
        // dropping the job (and claiming anew), not by retrying the same call.
        Error::ClaimLost { .. } => Code::Aborted,
        // A deposed leader's write: the leader changed under it, a concurrency conflict
        // settled by the new leader (whose writes go on), never by retrying on this one.
        Error::NotLeader(_) => Code::Aborted,
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
        | Error::TrainingFailed(_)
        | Error::NothingPinned(_) => Code::FailedPrecondition,
        // Another agent's claim: the caller may not act on it, whatever the job's state.
        Error::LaunchSpecsDisabled
        | Error::ProgramNotAllowed { .. }
        | Error::NotClaimHolder { .. } => Code::PermissionDenied,
        Error::StorageUnavailable(_) => Code::Unavailable,
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
            Error::StorageUnavailable(cause) => {
                // The cause (a path, SQLite's text) stays in the log.
                tracing::warn!(error = cause.chain(), "a write failed on a storage fault");
                Status::unavailable(Error::StorageUnavailable(cause).to_string())
            }
            Error::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "internal error");
                Status::internal("internal error")
            }
            other => Status::new(code(&other), other.to_string()),
        }
    }
}

/// A request field that fails validation: INVALID_ARGUMENT through the table above, so a
/// handler writes `?` on a conversion's result.
impl From<ValidationError> for Status {
    fn from(error: ValidationError) -> Self {
        Error::InvalidRequest(error).into()
    }
}

/// tonic answers a request it cannot decode (a string field that is not UTF-8, a
/// malformed message) with INTERNAL and the decoder's text. The request is what is wrong,
/// and the decoder's text is an internal detail: INVALID_ARGUMENT, with a message of ours.
/// Returns the replacement for such a trailers-only answer's (code, percent-encoded
/// message), or `None` for any other answer.
pub fn undecodable_request(code: i32, message: &str) -> Option<(Code, &'static str)> {
    let undecodable = code == Code::Internal as i32
        && (message.starts_with("failed to decode Protobuf message")
            || message.starts_with("failed%20to%20decode%20Protobuf%20message"));
    undecodable.then_some((
        Code::InvalidArgument,
        "the%20request%20is%20not%20a%20valid%20message%20for%20this%20method%20(malformed%20protobuf%2C%20or%20a%20string%20that%20is%20not%20UTF-8)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
