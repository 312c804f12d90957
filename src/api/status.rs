//! The one place where advisor errors become gRPC statuses. Internal causes are logged
//! with their whole chain and answered as a plain "internal error".

use tonic::Status;

use crate::advisor::Error;

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidArgument(message) => Status::invalid_argument(message),
            Error::NotFound(message) => Status::not_found(message),
            Error::AlreadyExists(message) => Status::already_exists(message),
            Error::FailedPrecondition(message) => Status::failed_precondition(message),
            Error::PermissionDenied(message) => Status::permission_denied(message),
            Error::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "internal error");
                Status::internal("internal error")
            }
        }
    }
}
