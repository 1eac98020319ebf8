//! The gate clock (`tensile_planner::gate`) for Python: `Gate`, `GateClock`
//! and a plan document's gate and pace (`gate_of`, `pace_of`), checked by
//! the plan format's rules (`tensile_proto::convert::check_gate`,
//! `plan_json::check_op_starts`, `convert::check_pace`). The hook reads the
//! host's `CLOCK_MONOTONIC` (`time.monotonic_ns()`) and waits; these types
//! only say until when.

use std::hash::{Hash, Hasher};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use tensile_planner as planner;
use tensile_proto::convert::{check_gate, check_pace};
use tensile_proto::plan_json::check_op_starts;

use crate::convert::{as_u64, get, mapping, repr, type_name, whole_u64};

/// The keys of a plan document's `gate`, in order.
const KEYS: [&str; 3] = ["period_ns", "phase_ns", "epoch_ns"];

/// When a coordinated job may start its iterations: the slots
/// `epoch_ns + phase_ns + n * period_ns` for every integer `n`. Checked on
/// construction as a plan's gate is: a period of 1 ns to an hour, a phase
/// less than the period, every number a whole number of ns.
#[pyclass(module = "tensile._core", frozen, eq, from_py_object)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gate(pub(crate) planner::Gate);

impl Gate {
    fn checked(period_ns: u64, phase_ns: u64, epoch_ns: u64) -> PyResult<Gate> {
        check_gate(planner::Gate {
            period_ns,
            phase_ns,
            epoch_ns,
        })
        .map(Gate)
        .map_err(PyValueError::new_err)
    }
}

#[pymethods]
impl Gate {
    #[new]
    fn new(
        period_ns: &Bound<'_, PyAny>,
        phase_ns: &Bound<'_, PyAny>,
        epoch_ns: &Bound<'_, PyAny>,
    ) -> PyResult<Gate> {
        let [period, phase, epoch] = [
            (period_ns, KEYS[0]),
            (phase_ns, KEYS[1]),
            (epoch_ns, KEYS[2]),
        ]
        .map(|(v, key)| whole_u64(v, &format!("gate {key}"), "ns"));
        Gate::checked(period?, phase?, epoch?)
    }

    /// A plan document's `gate` (`{"period_ns", "phase_ns", "epoch_ns"}`);
    /// a missing or unknown key is an error.
    #[staticmethod]
    fn from_dict(doc: &Bound<'_, PyAny>) -> PyResult<Gate> {
        let m = mapping(doc, "gate", &format!("an object with {}", KEYS.join(", ")))?;
        let mut unknown: Vec<String> = Vec::new();
        for key in m.keys()?.iter() {
            let name = key
                .cast::<PyString>()
                .map_or_else(|_| key.to_string(), |s| s.to_string());
            if !KEYS.contains(&name.as_str()) {
                unknown.push(name);
            }
        }
        unknown.sort();
        if let Some(first) = unknown.first() {
            return Err(PyValueError::new_err(format!(
                "gate has unknown key '{first}' (it has {})",
                KEYS.join(", ")
            )));
        }
        let mut values = [0u64; 3];
        for (value, key) in values.iter_mut().zip(KEYS) {
            let v =
                get(m, key)?.ok_or_else(|| PyValueError::new_err(format!("gate lacks '{key}'")))?;
            *value = whole_u64(&v, &format!("gate {key}"), "ns")?;
        }
        Gate::checked(values[0], values[1], values[2])
    }

    /// The gate as a plan document holds it.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("period_ns", self.0.period_ns)?;
        d.set_item("phase_ns", self.0.phase_ns)?;
        d.set_item("epoch_ns", self.0.epoch_ns)?;
        Ok(d)
    }

    #[getter]
    fn period_ns(&self) -> u64 {
        self.0.period_ns
    }

    #[getter]
    fn phase_ns(&self) -> u64 {
        self.0.phase_ns
    }

    #[getter]
    fn epoch_ns(&self) -> u64 {
        self.0.epoch_ns
    }

    /// The slot nearest to `now` (ties go to the earlier one); slots
    /// before the clock's zero do not exist, so near zero it may be a
    /// later one.
    fn nearest_slot(&self, now: u64) -> u64 {
        self.0.nearest_slot(now)
    }

    /// The epoch to give the gates of a joint plan published at `now`:
    /// the start of the cycle of the gates in use (`previous`) nearest to
    /// `now`; `now` when no job had a gate.
    #[staticmethod]
    fn epoch_at(previous: Option<Gate>, now: u64) -> u64 {
        planner::Gate::epoch_at(previous.map(|g| g.0), now)
    }

    /// The epoch to give the gates of plans published at `now` whose
    /// `anchor` job's next slot is to be at `now`; without one,
    /// `epoch_at` the gates in use.
    #[staticmethod]
    fn epoch_for(previous: Option<Gate>, anchor: Option<Gate>, now: u64) -> u64 {
        planner::Gate::epoch_for(previous.map(|g| g.0), anchor.map(|g| g.0), now)
    }

    fn __hash__(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.0.period_ns, self.0.phase_ns, self.0.epoch_ns).hash(&mut h);
        h.finish()
    }

    fn __repr__(&self) -> String {
        format!(
            "Gate(period_ns={}, phase_ns={}, epoch_ns={})",
            self.0.period_ns, self.0.phase_ns, self.0.epoch_ns
        )
    }
}

/// A driver's position on its job's slots: where the next iteration may
/// start. One per job.
#[pyclass(module = "tensile._core")]
#[derive(Debug)]
pub(crate) struct GateClock(planner::GateClock);

#[pymethods]
impl GateClock {
    #[new]
    fn new(gate: Gate) -> GateClock {
        GateClock(planner::GateClock::new(gate.0))
    }

    #[getter]
    fn gate(&self) -> Gate {
        Gate(self.0.gate())
    }

    /// The slot of the iteration about to start (`None`: not placed yet).
    #[getter]
    fn next_ns(&self) -> Option<u64> {
        self.0.next_slot()
    }

    /// Takes a new plan's gate. The same gate keeps the slots; another one
    /// places them afresh at the next start: on the slot just passed if it
    /// passed within a tenth of a period, else on the next one.
    fn set_gate(&mut self, gate: Gate) {
        self.0.set_gate(gate.0);
    }

    /// When the iteration that is ready to start at `now_ns` may start
    /// (`now_ns` itself when its slot has passed). Call once per iteration.
    fn start_at(&mut self, now_ns: u64) -> u64 {
        self.0.start_at(now_ns)
    }

    fn __repr__(&self) -> String {
        let g = self.0.gate();
        format!(
            "GateClock(Gate(period_ns={}, phase_ns={}, epoch_ns={}), next_ns={:?})",
            g.period_ns,
            g.phase_ns,
            g.epoch_ns,
            self.0.next_slot()
        )
    }
}

/// The gate of a `tensile-plan/v1` document, or `None` (the job runs free).
#[pyfunction]
pub(crate) fn gate_of(plan: &Bound<'_, PyAny>) -> PyResult<Option<Gate>> {
    let m = mapping(plan, "the plan", "a tensile-plan/v1 object")?;
    match get(m, "gate")? {
        None => Ok(None),
        Some(g) if g.is_none() => Ok(None),
        Some(g) => Gate::from_dict(&g).map(Some),
    }
}

/// The pace of a `tensile-plan/v1` document (`prediction.op_start_ns`):
/// empty, or one whole number of ns per op of a graph of `n_ops` ops,
/// non-decreasing, as a plan file is read.
#[pyfunction]
pub(crate) fn pace_of(plan: &Bound<'_, PyAny>, n_ops: usize) -> PyResult<Vec<u64>> {
    const KEY: &str = "prediction.op_start_ns";
    let m = mapping(plan, "the plan", "a tensile-plan/v1 object")?;
    let Some(prediction) = get(m, "prediction")? else {
        return Ok(Vec::new());
    };
    let prediction = mapping(&prediction, "prediction", "an object")?;
    let Some(starts) = get(prediction, "op_start_ns")? else {
        return Ok(Vec::new());
    };
    let list = starts.cast::<PyList>().map_err(|_| {
        PyValueError::new_err(format!(
            "{KEY} is a {}, not a list of ns",
            type_name(&starts)
        ))
    })?;
    let pace = list
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            as_u64(&ns).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "{KEY}: op {i} starts at {}, not a whole number of ns",
                    repr(&ns)
                ))
            })
        })
        .collect::<PyResult<Vec<u64>>>()?;
    check_op_starts(&pace, n_ops).map_err(|why| PyValueError::new_err(format!("{KEY}: {why}")))?;
    Ok(pace)
}

/// A pace from the wire (`PlanPrediction.op_start_s`, seconds) in ns,
/// checked as a pushed plan's is: empty, or one start per op, finite, in
/// 0 s to 1 hour, non-decreasing once rounded to ns.
#[pyfunction]
pub(crate) fn pace_from_seconds(starts_s: Vec<f64>, n_ops: usize) -> PyResult<Vec<u64>> {
    check_pace(&starts_s, n_ops).map_err(PyValueError::new_err)
}
