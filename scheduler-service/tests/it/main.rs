//! The scheduler over real sockets (127.0.0.1:0 and Unix sockets in temp
//! directories) with the real generated client; the binary killed and
//! restarted; random input; one process serving two GPUs; TLS on TCP.

#![allow(clippy::unwrap_used)] // tests unwrap: a failure is the test failing

mod bad_input;
mod binary;
mod deadline;
mod gpus;
mod lease;
mod restart;
mod rpc;
mod tls;
mod util;
