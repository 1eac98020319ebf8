//! Not built yet.

use tensile_planner::Plan;

use crate::{BaselineError, BaselineInput};

/// How many offloads torchtune's OffloadActivations keeps in flight.
pub(crate) const OFFLOAD_STASH: usize = 5;

pub(crate) fn save_on_cpu(_input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    Err(BaselineError::Invalid {
        policy: "save-on-cpu",
        what: "not built yet".into(),
    })
}

pub(crate) fn offload_stream(_input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    Err(BaselineError::Invalid {
        policy: "offload-stream",
        what: "not built yet".into(),
    })
}
