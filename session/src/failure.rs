//! What a failed call means for the session, and the names of gRPC codes
//! as the user reads them (`INVALID_ARGUMENT`, the names every gRPC
//! implementation prints).

use tonic::Code;

/// The calls whose failures the session tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Register,
    Report,
    Other,
}

/// What a failed call means for the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The request will be refused again: give up on the scheduler.
    Fatal,
    /// The scheduler no longer has the job: register again.
    Gone,
    /// This report was not taken: go on.
    Skip,
    /// The registration is lost: leave, then register again.
    Lost,
}

pub(crate) fn classify(call: Call, code: Code) -> Failure {
    match (call, code) {
        (Call::Register, Code::InvalidArgument | Code::ResourceExhausted | Code::Unimplemented) => {
            Failure::Fatal
        }
        (Call::Report | Call::Other, Code::NotFound | Code::PermissionDenied) => Failure::Gone,
        (Call::Report, Code::FailedPrecondition | Code::InvalidArgument) => Failure::Skip,
        _ => Failure::Lost,
    }
}

/// The canonical name of a gRPC status code: `NOT_FOUND`, `UNAVAILABLE`.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// `what: CODE: message`, a failed call as the user reads it.
pub(crate) fn describe(what: &str, s: &tonic::Status) -> String {
    match tensile_proto::tls::explain(s, None) {
        // A TLS failure surfacing at a call (the scheduler's refusal of a
        // client without a certificate comes after the handshake).
        Some(tls) => format!("{what}: {}: {tls}", code_name(s.code())),
        None => format!("{what}: {}: {}", code_name(s.code()), s.message()),
    }
}
