//! Where a job's scheduler listens (`tensile_proto::endpoint`) for Python:
//! the one rule `tensile.client.resolve_server`, the hook's session and
//! `tensile.ray` follow, with the environment given as a mapping (`None`:
//! the process's).

use std::collections::HashMap;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyMapping;
use tensile_proto::endpoint::{self, GpusFile};

use crate::ResolveError;
use crate::convert::{from_json, mapping};

/// The environment a rule reads: the mapping given, else the process's.
struct Env(Option<HashMap<String, String>>);

impl Env {
    fn of(environ: Option<&Bound<'_, PyAny>>) -> PyResult<Env> {
        let Some(environ) = environ.filter(|e| !e.is_none()) else {
            return Ok(Env(None));
        };
        let m: &Bound<'_, PyMapping> = mapping(environ, "environ", "a mapping of names to values")?;
        let mut vars = HashMap::new();
        for item in m.items()?.iter() {
            let (k, v): (String, String) = item.extract()?;
            vars.insert(k, v);
        }
        Ok(Env(Some(vars)))
    }

    fn get(&self, name: &str) -> Option<String> {
        match &self.0 {
            Some(vars) => vars.get(name).cloned(),
            None => std::env::var(name).ok(),
        }
    }
}

/// The scheduler a job of CUDA ordinal `ordinal` talks to, as an address
/// (`unix:PATH`, `HOST:PORT`): `address` when given; else
/// `TENSILE_SERVER`; else, when the socket directory (`TENSILE_SOCKET_DIR`,
/// else the default one) holds `gpus.json`, the socket of the job's GPU
/// (its ordinal mapped through `CUDA_VISIBLE_DEVICES`, else
/// `NVIDIA_VISIBLE_DEVICES`, matched by index or uuid prefix); else
/// `DIR/scheduler.sock`. Raises `ResolveError` naming the GPU and listing
/// those served when `gpus.json` has no such GPU.
#[pyfunction]
#[pyo3(signature = (address=None, ordinal=0, environ=None))]
pub(crate) fn resolve_server(
    address: Option<&str>,
    ordinal: u32,
    environ: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let env = Env::of(environ)?;
    endpoint::resolve_server_with(address, ordinal, &|name| env.get(name))
        .map_err(|e| ResolveError::new_err(e.to_string()))
}

/// The directory clients look in: `TENSILE_SOCKET_DIR` when set (and not
/// empty), else the default one (`$XDG_RUNTIME_DIR/tensile`, else
/// `/tmp/tensile-$UID`).
#[pyfunction]
#[pyo3(signature = (environ=None))]
pub(crate) fn socket_dir(environ: Option<&Bound<'_, PyAny>>) -> PyResult<PathBuf> {
    let env = Env::of(environ)?;
    Ok(endpoint::socket_dir_with(&|name| env.get(name)))
}

/// The scheduler's default Unix socket, as the scheduler computes it:
/// `$XDG_RUNTIME_DIR/tensile/scheduler.sock` when that variable is an
/// absolute path, else `/tmp/tensile-$UID/scheduler.sock`.
#[pyfunction]
#[pyo3(signature = (environ=None))]
pub(crate) fn default_socket_path(environ: Option<&Bound<'_, PyAny>>) -> PyResult<PathBuf> {
    let env = Env::of(environ)?;
    Ok(endpoint::default_socket_dir_with(&|name| env.get(name)).join(endpoint::SINGLE_SOCKET))
}

/// The CUDA ordinal of a device name: `cuda:N` is N; `cuda`, `cpu` and
/// anything else are 0 (the job's first visible GPU).
#[pyfunction]
pub(crate) fn device_ordinal(device: &str) -> u32 {
    endpoint::device_ordinal(device)
}

/// The socket file of the node's GPU `index` in a socket directory
/// (`gpu1.sock`).
#[pyfunction]
pub(crate) fn gpu_socket_name(index: u32) -> String {
    endpoint::gpu_socket_name(index)
}

/// `DIR/gpus.json` as a dict, checked (at least one GPU, indices unique,
/// every field there), or `None` when there is none. Raises
/// `ResolveError` for a file that cannot be read or is not one.
#[pyfunction]
pub(crate) fn read_gpus_file<'py>(
    py: Python<'py>,
    directory: PathBuf,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(file) =
        GpusFile::read(&directory).map_err(|e| ResolveError::new_err(e.to_string()))?
    else {
        return Ok(None);
    };
    let text = serde_json::to_string(&file).map_err(|e| ResolveError::new_err(e.to_string()))?;
    from_json(py, &text).map(Some)
}
