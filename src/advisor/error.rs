//! The advisor's one error type. Each variant says which gRPC status it becomes; only
//! `Internal` carries a cause, which is logged and never sent to clients.

use crate::{domain::ValidationError, store::StoreError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl From<ValidationError> for Error {
    fn from(error: ValidationError) -> Self {
        Self::InvalidArgument(error.0)
    }
}

impl From<StoreError> for Error {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::WorkloadNotFound(name) => {
                Self::NotFound(format!("workload {name:?} not found"))
            }
            StoreError::WorkloadExists(name) => {
                Self::AlreadyExists(format!("workload {name:?} already exists"))
            }
            other => Self::Internal(anyhow::Error::new(other)),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
