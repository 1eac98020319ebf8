//! The session protocol (`tensile-session`, the worker's own) for Python:
//! `Session`, which `tensile.hook.session.Session` wraps without logic of
//! its own. The session's messages wait in a queue that the wrapper hands
//! to the `tensile.hook` logger (`take_log`), so that no Rust thread calls
//! into Python.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tensile_graph::Graph;
use tensile_proto::plan_json::plan_to_json;
use tensile_session::{Level, LogSink, PushedPlan, Report, SessionConfig};

use crate::ResolveError;
use crate::convert::{from_json, get, graph_of, mapping, repr, whole_u64};

/// Messages kept for the wrapper at most; older ones are dropped.
const MAX_LOG: usize = 1000;

type LogQueue = Arc<Mutex<VecDeque<(Level, String)>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every value under these locks is replaced whole: a panic elsewhere
    // cannot leave one half-updated.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A number of seconds for a `Duration`, positive and finite.
fn seconds(s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "{what} must be a positive number of seconds, got {s}"
            ))
        })
}

/// A job's connection to its scheduler, on a background thread: register,
/// follow the plans, report every iteration, renew the lease, reconnect
/// with backoff. Training never waits on it.
#[pyclass(module = "tensile._core")]
pub(crate) struct Session {
    session: tensile_session::Session,
    graph: Arc<Graph>,
    log: LogQueue,
}

impl Session {
    /// A pushed plan as `(job_id, registration, version, plan document)`.
    fn pushed<'py>(&self, py: Python<'py>, p: &PushedPlan) -> PyResult<Bound<'py, PyTuple>> {
        let doc = from_json(py, &plan_to_json(&p.plan, &p.diagnostics, &self.graph))?;
        (p.job_id, p.registration, p.version, doc).into_pyobject(py)
    }

    fn report(m: &Bound<'_, PyAny>, ops: usize) -> PyResult<Option<Report>> {
        let m = mapping(m, "measurements", "a dict")?;
        let latencies: Vec<f64> = match get(m, "op_latency_s")? {
            Some(v) => v.extract().map_err(|_| {
                PyValueError::new_err(format!(
                    "measurements' op_latency_s is {}, not a list of seconds",
                    repr(&v)
                ))
            })?,
            None => Vec::new(),
        };
        // Checked before anything returns, so that a bad figure is an error
        // whether or not this report goes out.
        let base_bytes = match get(m, "base_bytes")? {
            Some(v) if !v.is_none() => whole_u64(&v, "measurements' base_bytes", "bytes")?,
            // Not measured: the scheduler keeps the base it plans with.
            _ => 0,
        };
        if latencies.len() != ops {
            // Not every op was timed: nothing to report.
            return Ok(None);
        }
        fn field<'py, T: FromPyObjectOwned<'py>>(
            m: &Bound<'py, pyo3::types::PyMapping>,
            key: &str,
            what: &str,
            default: Option<T>,
        ) -> PyResult<T> {
            match get(m, key)? {
                Some(v) => v.extract().map_err(|_| {
                    PyValueError::new_err(format!(
                        "measurements' {key} is {}, not {what}",
                        repr(&v)
                    ))
                }),
                None => default
                    .ok_or_else(|| PyValueError::new_err(format!("measurements lack {key:?}"))),
            }
        }
        Ok(Some(Report {
            iteration: field(m, "iteration", "a whole number", None)?,
            op_latency_s: latencies,
            stall_s: field(m, "stall_s", "a number of seconds", Some(0.0))?,
            late_prefetches: field(
                m,
                "late_prefetches",
                "a list of storage ids",
                Some(Vec::new()),
            )?,
            passive_swaps: field(m, "passive_swaps", "a whole number", Some(0))?,
            peak_bytes: field(m, "peak_bytes", "a whole number of bytes", Some(0))?,
            base_bytes,
        }))
    }
}

#[pymethods]
impl Session {
    /// Starts the session of `graph` (a `tensile-graph/v1` dict or its
    /// JSON text) with the scheduler at `server` (`unix:PATH`, an absolute
    /// path, `HOST:PORT`; `None`: the one of the job's GPU, found by
    /// `resolve_server` with `device_ordinal`, again at every connection).
    /// A scheduler that cannot be found is a `ResolveError` at once.
    /// `allow_recompute=False` registers the job with recomputation off
    /// and refuses a plan that recomputes.
    #[new]
    #[pyo3(signature = (graph, server=None, name="", *, priority=0, device_ordinal=0, allow_recompute=None, base_bytes=None, call_timeout_s=5.0, max_backoff_s=5.0))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        graph: &Bound<'_, PyAny>,
        server: Option<String>,
        name: &str,
        priority: i32,
        device_ordinal: u32,
        allow_recompute: Option<bool>,
        base_bytes: Option<u64>,
        call_timeout_s: f64,
        max_backoff_s: f64,
    ) -> PyResult<Session> {
        let graph = Arc::new(graph_of(graph)?);
        let server = server.filter(|s| !s.trim().is_empty());
        tensile_proto::endpoint::resolve_server(server.as_deref(), device_ordinal)
            .map_err(|e| ResolveError::new_err(e.to_string()))?;
        // TLS as every client takes it from the environment:
        // TENSILE_TLS_CA (and TENSILE_TLS_CERT/KEY for mutual TLS).
        let tls = tensile_proto::tls::ClientTlsFiles::from_env()
            .load()
            .map_err(|e| PyValueError::new_err(format!("TLS for the scheduler: {e}")))?;
        let log: LogQueue = Arc::default();
        let queue = log.clone();
        let config = SessionConfig {
            server,
            device_ordinal,
            name: if name.is_empty() {
                graph.name().to_string()
            } else {
                name.to_string()
            },
            priority,
            allow_recompute,
            base_bytes,
            // A process of its own (the hook runs one job per process).
            process: None,
            max_backoff: seconds(max_backoff_s, "max_backoff_s")?,
            call_timeout: Some(seconds(call_timeout_s, "call_timeout_s")?),
            tls,
            log: LogSink::new(move |level, message| {
                let mut q = lock(&queue);
                if q.len() >= MAX_LOG {
                    q.pop_front();
                }
                q.push_back((level, message.to_string()));
            }),
        };
        let session = tensile_session::Session::start(graph.clone(), config)
            .map_err(|e| PyValueError::new_err(format!("cannot start the session: {e}")))?;
        Ok(Session {
            session,
            graph,
            log,
        })
    }

    /// Queues one iteration's report (`measurements`: `iteration`,
    /// `op_latency_s` (one per op, else nothing is sent), `stall_s`,
    /// `late_prefetches`, `passive_swaps`, `peak_bytes`, and `base_bytes`:
    /// the device bytes the process holds outside the job's storages, as
    /// measured, this job's share of them where the process runs several
    /// jobs; absent or `None`: not measured) and returns the plan to switch
    /// to, `(job_id, registration, version, plan)`, if a newer one than the
    /// one running has arrived. Never blocks on the network. A field of the
    /// wrong kind (`base_bytes` of -1 or 1.5) is a `ValueError` naming it.
    fn iteration_done<'py>(
        &self,
        py: Python<'py>,
        measurements: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let report = Session::report(measurements, self.graph.ops().len())?;
        let pushed = self.session.iteration_done(report.unwrap_or_default());
        pushed.map(|p| self.pushed(py, &p)).transpose()
    }

    /// The plan to switch to, `(job_id, registration, version, plan)`, if
    /// a newer one than the one running has arrived, marked as the one
    /// running from now; no report is sent.
    fn take_plan<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let pushed = self.session.take_plan();
        pushed.map(|p| self.pushed(py, &p)).transpose()
    }

    /// Blocks (without the GIL) until the newest plan received is not
    /// `other_than` (a `(registration, version)`; `None`: the plan applied
    /// last; `(0, 0)`: any plan), and returns it as `iteration_done`
    /// does; `None` after `timeout_s`.
    #[pyo3(signature = (timeout_s, other_than=None))]
    fn wait_for_plan<'py>(
        &self,
        py: Python<'py>,
        timeout_s: f64,
        other_than: Option<(u64, u64)>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let timeout = Duration::try_from_secs_f64(timeout_s.max(0.0)).map_err(|_| {
            PyValueError::new_err(format!("timeout_s is {timeout_s}, not a number of seconds"))
        })?;
        let session = &self.session;
        let pushed = py.detach(|| session.wait_for_new_plan(timeout, other_than));
        pushed.map(|p| self.pushed(py, &p)).transpose()
    }

    /// Ends the session (the job unregisters when connected), waiting at
    /// most `timeout_s` without the GIL; false when the background thread
    /// was left behind. Later calls do nothing.
    #[pyo3(signature = (timeout_s=5.0))]
    fn finish(&self, py: Python<'_>, timeout_s: f64) -> PyResult<bool> {
        let timeout = seconds(timeout_s, "timeout_s")?;
        let session = &self.session;
        Ok(py.detach(|| session.finish(timeout)))
    }

    /// Where the session stands: `job` (`{"id", "token", "state",
    /// "reason", "lease_s"}` of the current registration, or `None`),
    /// `state` (a `JobState` name), `reason`, `last_error`, `gave_up`,
    /// `registrations`, `reports_sent`, `received` (`(job_id, version)` of
    /// every plan kept), `refused` (why each refused plan was).
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.session.status();
        let out = PyDict::new(py);
        let job = match &s.registration {
            Some(r) => {
                let d = PyDict::new(py);
                d.set_item("id", r.job_id)?;
                d.set_item("token", &r.token)?;
                d.set_item("state", r.state)?;
                d.set_item("reason", &r.reason)?;
                d.set_item("lease_s", r.lease_s)?;
                Some(d)
            }
            None => None,
        };
        out.set_item("job", job)?;
        out.set_item("state", s.state_name())?;
        out.set_item("reason", &s.reason)?;
        out.set_item("last_error", &s.last_error)?;
        out.set_item("gave_up", &s.gave_up)?;
        out.set_item("registrations", s.registrations)?;
        out.set_item("reports_sent", s.reports_sent)?;
        out.set_item("received", PyList::new(py, &s.received)?)?;
        out.set_item("refused", PyList::new(py, &s.refused)?)?;
        Ok(out)
    }

    /// The session's messages since the last call, oldest first, as
    /// `(level, message)`: level `"debug"`, `"info"` or `"warning"`.
    fn take_log(&self) -> Vec<(&'static str, String)> {
        lock(&self.log)
            .drain(..)
            .map(|(level, m)| {
                let name = match level {
                    Level::Debug => "debug",
                    Level::Info => "info",
                    Level::Warning => "warning",
                };
                (name, m)
            })
            .collect()
    }
}
