//! The scheduler's typed errors and their one mapping to gRPC status codes
//! (`impl From<Error> for tonic::Status`): handlers return `Error`, never a
//! `Status` they made themselves.

use std::path::PathBuf;
use tensile_graph::GraphError;

use tonic::Status;

use crate::config::ListenAddr;

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

/// What is wrong with the scheduler's configuration (flags, environment,
/// the TOML file, the GPUs asked for), found before anything starts; each
/// message names the flag or file. The binary exits with status 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--gpus is empty: give `all` or GPU indices such as 0,1")]
    NoGpus,
    #[error(
        "--gpus {spec:?}: {part:?} is not a GPU index (expected `all` or indices such as 0,1,3)"
    )]
    NotAGpuIndex { spec: String, part: String },
    #[error("--gpus {spec:?}: GPU {index} is named twice")]
    GpuTwice { spec: String, index: u32 },
    /// `seen`: the GPUs nvidia-smi lists, `index (name)` each.
    #[error("--gpus: nvidia-smi sees no GPU {index}; it sees {seen}")]
    NoSuchGpu { index: u32, seen: String },
    #[error("--listen {0:?}: unix: needs a path")]
    UnixWithoutPath(String),
    #[error("--listen {0:?}: expected unix:PATH or IP:PORT (e.g. 127.0.0.1:50051)")]
    NotAnAddress(String),
    #[error(
        "--listen {0} and --gpus cannot go together: --gpus serves each GPU on its own socket in --socket-dir (gpuN.sock), --listen one device on the addresses given; drop one"
    )]
    ListenWithGpus(ListenAddr),
    #[error(
        "--listen {0} is not a loopback address: jobs' tokens would cross the network in clear; give it TLS (--tls-cert and --tls-key), or add --insecure to allow plaintext"
    )]
    PlaintextOffHost(ListenAddr),
    #[error("{0:?} is not a file mode: expected octal permission bits such as 0660 (at most 0777)")]
    NotAMode(String),
    #[error(
        "{0:?} leaves the scheduler's own user unable to connect: give the owner read and write (0600 or more, e.g. 0660)"
    )]
    OwnerCannotConnect(String),
    #[error("--{flag} must be a positive number of seconds, got {value}")]
    NotSeconds { flag: &'static str, value: f64 },
    #[error("--config {}: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--config {}: {source}", path.display())]
    ParseFile {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("--admin-token-file {}: {source}", path.display())]
    ReadAdminToken {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--admin-token-file {}: the file is empty", .0.display())]
    EmptyAdminToken(PathBuf),
    #[error("--device: {0}")]
    Device(#[source] tensile_latency_model::DeviceError),
    /// The device profile itself (the builtin one, or one that fails its
    /// checks).
    #[error(transparent)]
    Profile(#[from] tensile_latency_model::ProfileError),
    #[error(transparent)]
    Tls(#[from] tensile_proto::tls::TlsError),
    /// A value out of its range, or settings that cannot go together: the
    /// message names the flag (or the file's key).
    #[error("{0}")]
    Invalid(String),
}
