//! Not built yet.

use tensile_planner::Plan;

use crate::{BaselineError, BaselineInput};

pub(crate) fn plan(_input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    Err(BaselineError::Invalid {
        policy: "vdnn",
        what: "not built yet".into(),
    })
}
