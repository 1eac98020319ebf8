//! The scheduler's typed errors and their one mapping to gRPC status codes
//! (`impl From<Error> for tonic::Status`): handlers return `Error`, never a
//! `Status` they made themselves.

use tensile_graph::GraphError;
use tonic::Status;

/// Everything an RPC can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A malformed graph: the message names the op or tensor.
    #[error("invalid graph: {0}")]
    Graph(#[source] GraphError),
    /// A graph over the configured limits.
    #[error("graph over the limits: {0}")]
    GraphTooLarge(#[source] GraphError),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("job {0} is not registered (unregistered, its lease lapsed, or never was)")]
    UnknownJob(u64),
    #[error("job {0}: the request carries no token; RegisterJob hands one out")]
    MissingToken(u64),
    #[error("job {0}: wrong token")]
    WrongToken(u64),
    #[error("SetMemoryBudget needs the scheduler's admin token, and the request has none")]
    MissingAdminToken,
    #[error("SetMemoryBudget: wrong admin token")]
    WrongAdminToken,
    #[error("job {job}: {what}")]
    WrongState { job: u64, what: String },
    #[error("the scheduler is shutting down")]
    ShuttingDown,
    #[error("planning failed: {0}")]
    Planning(String),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
}

impl Error {
    /// Sorts a graph error: over a limit, or malformed.
    pub fn from_graph(e: GraphError) -> Error {
        use GraphError as G;
        match e {
            G::InputTooLarge { .. }
            | G::TooMany { .. }
            | G::NameTooLong { .. }
            | G::RankTooLarge { .. }
            | G::TensorTooLarge { .. }
            | G::TotalTooLarge { .. }
            | G::TooManyOperands { .. }
            | G::TooManyAttrs { .. }
            | G::AttrTooLong { .. } => Error::GraphTooLarge(e),
            _ => Error::Graph(e),
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let msg = e.to_string();
        match e {
            Error::Graph(_) | Error::InvalidArgument(_) => Status::invalid_argument(msg),
            Error::GraphTooLarge(_) => Status::resource_exhausted(msg),
            Error::UnknownJob(_) => Status::not_found(msg),
            Error::MissingToken(_) | Error::MissingAdminToken => Status::unauthenticated(msg),
            Error::WrongToken(_) | Error::WrongAdminToken => Status::permission_denied(msg),
            Error::WrongState { .. } => Status::failed_precondition(msg),
            Error::ShuttingDown => Status::unavailable(msg),
            Error::Planning(_) | Error::Store(_) => Status::internal(msg),
        }
    }
}
