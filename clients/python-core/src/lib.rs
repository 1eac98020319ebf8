//! `tensile._core`: the project's Rust crates under the Python package, so
//! that Python runs one implementation of each rule instead of a twin of
//! it (pydantic-core's and tokenizers' shape: a Rust core, a thin Python
//! API over it, type stubs in `tensile/_core.pyi`).
//!
//! Everything a caller gets wrong (a graph that is not one, a plan that
//! does not fit its graph, a value of the wrong type) is a Python exception
//! carrying the Rust message, never a panic. Long calls (planning, waiting
//! for a plan, ending a session) release the GIL.
//!
//! # Layout
//! - `convert`: Python objects to the crates' inputs and back (graphs and
//!   plans travel as `tensile-graph/v1` and `tensile-plan/v1` JSON).
//! - `planning`: `plan()`, one graph planned in the process
//!   (`tensile-plan-job`, what `tensilectl plan` runs).
//! - `plan_format`: `read_plan()` and `plan_from_wire()`, the plan file
//!   format (`tensile_proto::plan_json`).
//! - `gate`: `Gate`, `GateClock`, `gate_of()`, `pace_of()`,
//!   `pace_from_seconds()` (`tensile_planner::gate`).
//! - `guard`: `guard_victims()`, which storages a memory limit's guard
//!   moves first (`tensile_planner::guard`, the executor's rule).
//! - `session`: `Session`, the job's side of the scheduler
//!   (`tensile-session`, what `tensile-worker` runs).
//! - `endpoint`: where a job's scheduler listens
//!   (`tensile_proto::endpoint`).

mod convert;
mod endpoint;
mod gate;
mod guard;
mod plan_format;
mod planning;
mod session;

use pyo3::create_exception;
use pyo3::exceptions::{PyLookupError, PyRuntimeError, PyValueError};

create_exception!(
    tensile._core,
    PlanningError,
    PyRuntimeError,
    "Planning failed: an unknown device profile, latency models that cannot be loaded, a planner error."
);
create_exception!(
    tensile._core,
    PlanFormatError,
    PyValueError,
    "A plan that is not a valid tensile-plan/v1 document for its graph; the message names the item."
);
create_exception!(
    tensile._core,
    ResolveError,
    PyLookupError,
    "The scheduler could not be found: gpus.json is unreadable, or serves no GPU the job's device names."
);

/// The Rust core of the `tensile` package: the planner, the plan format,
/// the gate clock, the memory guard's choice, the session protocol and the
/// endpoint rule.
#[pyo3::pymodule]
mod _core {
    use pyo3::prelude::*;

    #[pymodule_export]
    use super::{PlanFormatError, PlanningError, ResolveError};
    #[pymodule_export]
    use crate::endpoint::{
        default_socket_path, device_ordinal, gpu_socket_name, read_gpus_file, resolve_server,
        socket_dir,
    };
    #[pymodule_export]
    use crate::gate::{Gate, GateClock, gate_of, pace_from_seconds, pace_of};
    #[pymodule_export]
    use crate::guard::guard_victims;
    #[pymodule_export]
    use crate::plan_format::{plan_from_wire, read_plan};
    #[pymodule_export]
    use crate::planning::plan;
    #[pymodule_export]
    use crate::session::Session;

    /// The longest gate period (and op start) a plan may carry: an hour.
    #[pymodule_export]
    const MAX_PERIOD_NS: u64 = tensile_proto::convert::MAX_GATE_PERIOD_NS;
    /// The plan format this module reads and writes.
    #[pymodule_export]
    const PLAN_FORMAT: &str = tensile_proto::plan_json::FORMAT;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))
    }
}
