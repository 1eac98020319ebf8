//! End-to-end tests of the whole system over real processes and loopback
//! gRPC. The tests live in `tests/`; this library holds their shared helpers.
