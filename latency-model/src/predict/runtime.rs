//! ONNX Runtime underneath the [`crate::Predictor`]: the environment (the
//! shared library, loaded once per process) and one session per op type's
//! model, run on the caller's thread.

use std::path::Path;
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use ort::session::Session;
use ort::value::TensorRef;

use crate::features::FEATURE_LEN;
use crate::manifest::{INPUT, OUTPUT};

static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();

/// Loads ONNX Runtime from `lib` once per process; the error is the reason.
pub(super) fn environment(lib: &Path) -> Result<&'static Environment, &'static str> {
    let env = ENVIRONMENT.get_or_init(|| {
        if !lib.is_file() {
            return Err(format!("{}: no such file", lib.display()));
        }
        ort::init_from(lib)
            .map_err(|e| e.to_string())?
            .with_name("tensile-latency")
            .build()
            .map_err(|e| e.to_string())
    });
    env.as_ref().map_err(String::as_str)
}

/// One op type's model in its session.
#[derive(Debug)]
pub(super) struct Model {
    /// `Session::run` needs `&mut`: ONNX Runtime's `Run` is not thread safe.
    session: Mutex<Session>,
}

impl Model {
    /// Builds the session of an ONNX model and checks its input and output.
    ///
    /// One intra-op thread, the caller's: a call is a few small matrix
    /// products, which a thread pool only slows down with its hand-overs
    /// (and there is no pool to spin). The graph is optimized as ONNX
    /// Runtime does by default (Gemm and Relu fused).
    pub(super) fn load(env: &Environment, bytes: &[u8]) -> Result<Model, String> {
        let session = Session::builder(env)
            .map_err(|e| e.to_string())?
            .with_intra_threads(1)
            .map_err(|e| e.to_string())?
            .commit_from_memory(bytes)
            .map_err(|e| e.to_string())?;
        let io_ok = session.inputs().len() == 1
            && session.inputs()[0].name() == INPUT
            && session.outputs().len() == 1
            && session.outputs()[0].name() == OUTPUT;
        if !io_ok {
            return Err(format!(
                "expected one input {INPUT:?} and one output {OUTPUT:?}"
            ));
        }
        Ok(Model {
            session: Mutex::new(session),
        })
    }

    /// Runs the model once on `rows` (a whole number of [`FEATURE_LEN`]
    /// rows, borrowed, not copied) and hands `ln(ns)` of each row to `out`.
    pub(super) fn run(&self, rows: &[f32], out: &mut dyn FnMut(&[f32])) -> Result<(), String> {
        let n = rows.len() / FEATURE_LEN;
        if n == 0 {
            out(&[]);
            return Ok(());
        }
        let input = TensorRef::from_array_view(([n, FEATURE_LEN], &rows[..n * FEATURE_LEN]))
            .map_err(|e| e.to_string())?;
        let mut session = self
            .session
            .lock()
            .map_err(|_| "a previous run panicked".to_owned())?;
        let outputs = session
            .run(ort::inputs![input])
            .map_err(|e| e.to_string())?;
        let (_, ln_ns) = outputs[0]
            .try_extract_tensor::<f32>()
            .map_err(|e| e.to_string())?;
        if ln_ns.len() != n {
            return Err(format!("{} outputs for {n} rows", ln_ns.len()));
        }
        out(ln_ns);
        Ok(())
    }
}
