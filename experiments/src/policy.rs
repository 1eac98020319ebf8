//! A policy as an experiment runs it: plain, or ours given a baseline's
//! peak as its budget (rows `tensile@B`: the two compared at the same
//! memory).

use std::fmt;

use serde::{Serialize, Serializer};
use tensile_baselines::Policy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunPolicy {
    Plain(Policy),
    /// Ours, planned to stop at this baseline's measured peak.
    OursAtBudgetOf(Policy),
}

impl RunPolicy {
    /// The policy that ran: ours, for ours at a baseline's budget.
    pub fn policy(self) -> Policy {
        match self {
            RunPolicy::Plain(p) => p,
            RunPolicy::OursAtBudgetOf(_) => Policy::Tensile,
        }
    }

    /// Whether this is ours in any form.
    pub fn is_ours(self) -> bool {
        self.policy() == Policy::Tensile
    }
}

/// `vdnn-conv`, or `tensile@vdnn-conv` for ours at its peak: the names of
/// the reports' rows and JSON.
impl fmt::Display for RunPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunPolicy::Plain(p) => f.write_str(p.name()),
            RunPolicy::OursAtBudgetOf(p) => write!(f, "{}@{}", Policy::Tensile.name(), p.name()),
        }
    }
}

impl Serialize for RunPolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Serializes a [`Policy`] (serde-free, in `tensile-baselines`) by name.
pub(crate) fn serialize_policy<S: Serializer>(p: &Policy, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_report_rows() {
        assert_eq!(RunPolicy::Plain(Policy::VdnnConv).to_string(), "vdnn-conv");
        let at = RunPolicy::OursAtBudgetOf(Policy::Capuchin);
        assert_eq!(at.to_string(), "tensile@capuchin");
        assert_eq!(at.policy(), Policy::Tensile);
        assert!(at.is_ours() && !RunPolicy::Plain(Policy::Knapsack).is_ours());
    }
}
