//! Python objects to the crates' inputs and back. Graphs and plans cross
//! as their JSON formats (`tensile-graph/v1`, `tensile-plan/v1`): a Python
//! caller holds them as dicts, the crates read them with the same readers
//! as files, so a graph from Python is held to `Graph::new`'s rules with
//! the same messages.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyMapping, PyString};
use tensile_graph::{Graph, Limits};

/// The JSON text of `obj`: a `str` is taken as JSON text already, anything
/// else (a dict) is written by Python's `json` module.
pub(crate) fn json_text(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_str()?.to_owned());
    }
    let dumped = obj
        .py()
        .import("json")?
        .call_method1("dumps", (obj,))
        .map_err(|e| PyValueError::new_err(format!("{what} is not JSON: {e}")))?;
    dumped.extract()
}

/// A JSON text as Python objects (`json.loads`).
pub(crate) fn from_json<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (text,))
}

/// A graph from its JSON text, validated (`Graph::new`).
pub(crate) fn parse_graph(text: &str) -> Result<Graph, String> {
    tensile_graph::json::parse(text.as_bytes(), &Limits::default())
        .map_err(|e| format!("graph: {e}"))
}

/// A graph given as a `tensile-graph/v1` dict or its JSON text; a
/// `ValueError` naming the op or tensor at fault.
pub(crate) fn graph_of(obj: &Bound<'_, PyAny>) -> PyResult<Graph> {
    let text = json_text(obj, "graph")?;
    obj.py()
        .detach(move || parse_graph(&text))
        .map_err(PyValueError::new_err)
}

/// `obj` as a mapping, or a `ValueError` saying what it is instead.
pub(crate) fn mapping<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    what: &str,
    expected: &str,
) -> PyResult<&'a Bound<'py, PyMapping>> {
    obj.cast::<PyMapping>().map_err(|_| {
        PyValueError::new_err(format!("{what} is a {}, not {expected}", type_name(obj)))
    })
}

/// `m[key]`, or `None` when the key is absent.
pub(crate) fn get<'py>(
    m: &Bound<'py, PyMapping>,
    key: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if m.contains(key)? {
        m.get_item(key).map(Some)
    } else {
        Ok(None)
    }
}

/// `obj` as a whole number of 0 to 2^64-1 (an int, not a bool or a
/// float), or `None`.
pub(crate) fn as_u64(obj: &Bound<'_, PyAny>) -> Option<u64> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return None;
    }
    obj.extract::<u64>().ok()
}

/// A whole number of 0 to 2^64-1 of `unit`, or a `ValueError`: "`{what}`
/// is 1.5, not a whole number of ns from 0 to 2^64-1".
pub(crate) fn whole_u64(obj: &Bound<'_, PyAny>, what: &str, unit: &str) -> PyResult<u64> {
    as_u64(obj).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{what} is {}, not a whole number of {unit} from 0 to 2^64-1",
            repr(obj)
        ))
    })
}

/// `repr(obj)`, as Python prints it.
pub(crate) fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map_or_else(|_| "?".into(), |r| r.to_string())
}

/// The name of `obj`'s type, as Python prints it.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}
