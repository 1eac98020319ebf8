//! One job of the process (one copy of `--copies`, or one `--job`),
//! trained on a thread of its own: its plan (a file, the scheduler's, or
//! vanilla), kernels and initial tensors, its session with the scheduler
//! (registered in this process, whose base the scheduler counts once), its
//! report lines and files.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::Serialize;
use tch::Device;
use tensile_cli::Mb;
use tensile_graph::{Graph, Liveness};
use tensile_kernels::Program;
use tensile_planner::Plan;
use tensile_swap_executor::HostConfig;
use tensile_worker::{
    BaseMeter, Engine, IterationReport, Level, LogSink, Session, SessionConfig, Worker,
    WorkerConfig, vanilla_plan,
};

use crate::args::Args;
use crate::spec::{JobSpec, numbered};

/// What the process trains several of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Copies of one job (`--copies N`).
    Copy,
    /// Different jobs (`--job SPEC`, repeated).
    Job,
}

/// Which of the process's jobs one thread trains.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobCopy {
    pub(crate) index: usize,
    pub(crate) of: usize,
    pub(crate) kind: Kind,
}

impl JobCopy {
    /// The job's own file: `PATH` alone, else (a copy's) the copy's number
    /// before the extension. A `--job`'s paths are its own already.
    fn path(self, path: &Path) -> PathBuf {
        if self.of == 1 || self.kind == Kind::Job {
            return path.to_path_buf();
        }
        numbered(path, self.index)
    }

    /// The job's name at the scheduler: the one given (a `--job`'s as
    /// given, a copy's numbered), else the graph's, numbered when the
    /// process trains several.
    fn name(self, given: Option<&str>, graph: &str) -> String {
        match (given, self.kind) {
            (Some(name), Kind::Job) => name.to_string(),
            _ if self.of == 1 => given.unwrap_or(graph).to_string(),
            _ => format!("{}-{}", given.unwrap_or(graph), self.index),
        }
    }
}

/// What the jobs of one process share: the device, the copy engine's
/// kind, the host pool's settings, the memory ledger, where they print,
/// the process's base meter and its key at the scheduler.
pub(crate) struct Shared {
    pub(crate) process: String,
    pub(crate) device: Device,
    pub(crate) engine: Engine,
    pub(crate) host: HostConfig,
    pub(crate) ledger: Option<PathBuf>,
    pub(crate) bars: MultiProgress,
    pub(crate) base: Arc<BaseMeter>,
}

/// One iteration's JSON line: the report, and its copy's or job's number
/// when the process trains several.
#[derive(Serialize)]
pub(crate) struct Line<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    copy: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<usize>,
    #[serde(flatten)]
    report: &'a IterationReport,
}

pub(crate) fn print(r: &IterationReport, copy: JobCopy, json: bool) -> Result<()> {
    let number = (copy.of > 1).then_some(copy.index);
    let word = match copy.kind {
        Kind::Copy => "copy",
        Kind::Job => "job",
    };
    if json {
        let line = Line {
            copy: number.filter(|_| copy.kind == Kind::Copy),
            job: number.filter(|_| copy.kind == Kind::Job),
            report: r,
        };
        tensile_cli::try_out(&format!("{}\n", serde_json::to_string(&line)?))?;
    } else {
        let prefix = number.map_or_else(String::new, |n| format!("{word} {n}: "));
        // The base only once measured (on CUDA, after the first
        // iterations).
        let base = r.base_bytes.map_or_else(String::new, |b| {
            format!(", base outside the storages {:.1} MB", b as f64 / 1e6)
        });
        tensile_cli::try_out(&format!(
            "{prefix}iteration {}: {:.1} ms, peak {:.1} MB, stalls {:.1} ms, {} passive swaps, {} late prefetches, {} failed copies, {} recomputed ops, {:.1} MB swapped{base}\n",
            r.iteration,
            r.time_ns as f64 / 1e6,
            r.measured_peak_bytes as f64 / 1e6,
            r.stall_ns as f64 / 1e6,
            r.passive_swaps,
            r.late_prefetches,
            r.failed_copies,
            r.recomputed_ops,
            r.swapped_bytes as f64 / 1e6,
        ))?;
    }
    Ok(())
}

pub(crate) fn start_session(
    args: &Args,
    spec: &JobSpec,
    g: &Graph,
    copy: JobCopy,
    shared: &Shared,
) -> Result<Session> {
    let bars = &shared.bars;
    let device_ordinal = tensile_proto::endpoint::device_ordinal(&args.device);
    // Found again at every connection; once here so that a scheduler that
    // cannot be found is a clear error at once.
    let address =
        tensile_proto::endpoint::resolve_server(args.scheduler.as_deref(), device_ordinal)
            .context("finding the scheduler (--scheduler ADDR names one)")?;
    let tls = args.tls.load()?;
    bars.suspend(|| eprintln!("scheduler: {address}"));
    let say = bars.clone();
    let config = SessionConfig {
        server: args.scheduler.clone(),
        device_ordinal,
        name: copy.name(spec.name.as_deref(), g.name()),
        priority: spec.priority,
        allow_recompute: None,
        // The whole process's: the scheduler counts it once for the jobs
        // registered in this process.
        base_bytes: args.base_mb.map(Mb::bytes),
        process: Some(shared.process.clone()),
        max_backoff: Duration::from_secs(2),
        call_timeout: None,
        tls,
        // Above the progress bars, as everything else the worker says.
        log: LogSink::new(move |level, message| {
            if level >= Level::Info {
                say.suspend(|| eprintln!("scheduler: {message}"));
            }
        }),
    };
    Session::start(Arc::new(g.clone()), config).context("starting the scheduler session")
}

/// Trains one copy of the job: plan, kernels and initial tensors of its
/// own, its own session with the scheduler, its own files.
pub(crate) fn run_copy(
    args: &Args,
    spec: &JobSpec,
    g: &Graph,
    live: &Liveness,
    shared: &Shared,
    copy: JobCopy,
) -> Result<()> {
    let session = if spec.plan.is_none() && !args.vanilla {
        Some(start_session(args, spec, g, copy, shared)?)
    } else {
        None
    };
    let plan = first_plan(args, spec, g, live, session.as_ref(), &shared.bars)?;
    let mut worker = build_worker(args, spec, g, live, shared, copy, &plan)?;
    let bar = shared.bars.add(
        ProgressBar::new(args.iterations as u64).with_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} iterations ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
    );
    bar.set_message(copy.name(spec.name.as_deref(), g.name()));
    let mut trace = match &spec.memory_trace {
        Some(path) => {
            worker.record_memory();
            let path = copy.path(path);
            let file = std::fs::File::create(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            Some(std::io::BufWriter::new(file))
        }
        None => None,
    };
    let mut printed = Ok(());
    worker.run(|r| {
        bar.inc(1);
        shared.bars.suspend(|| {
            if printed.is_ok() {
                printed = print(r, copy, args.json);
            }
            if let (Some(out), true) = (&mut trace, printed.is_ok()) {
                printed = tensile_executor::trace::write_csv(out, &r.memory).map_err(Into::into);
            }
        });
        let pushed = session.as_ref()?.iteration_done(r.to_session_report())?;
        shared.bars.suspend(|| {
            eprintln!(
                "scheduler: plan version {} of job {} from the next iteration",
                pushed.version, pushed.job_id
            )
        });
        Some(pushed.plan)
    })?;
    bar.finish_and_clear();
    match printed {
        // Stdout's reader went away (`| head`): the job still trained to
        // its end, which matters more than its log; nothing failed.
        Err(e)
            if e.downcast_ref::<tensile_cli::StdoutError>()
                .is_some_and(tensile_cli::StdoutError::reader_gone) => {}
        other => other?,
    }
    finish(spec, g, shared, copy, worker, trace, session)
}

/// The plan of the first iteration: the file's, else the scheduler's first
/// (waited for up to `--plan-timeout-s`: a queued job waits here), else
/// vanilla's.
fn first_plan(
    args: &Args,
    spec: &JobSpec,
    g: &Graph,
    live: &Liveness,
    session: Option<&Session>,
    bars: &MultiProgress,
) -> Result<Plan> {
    if let Some(path) = &spec.plan {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        return tensile_proto::plan_json::plan_from_json(&bytes, g)
            .with_context(|| format!("plan file {}", path.display()));
    }
    let Some(session) = session else {
        return Ok(vanilla_plan(live));
    };
    let wait = Duration::try_from_secs_f64(args.plan_timeout_s)
        .context("--plan-timeout-s must be a number of seconds")?;
    let Some(pushed) = session.wait_for_plan(wait) else {
        if let Some(why) = session.gave_up() {
            bail!("the scheduler refused the job: {why}");
        }
        bail!("no plan from the scheduler within {wait:?}");
    };
    bars.suspend(|| {
        eprintln!(
            "scheduler: plan version {} of job {}",
            pushed.version, pushed.job_id
        )
    });
    session.applied(&pushed);
    Ok(pushed.plan)
}

/// The copy's worker: its kernels, its initial tensors (seeded under the
/// kernels' lock on the process's generator, so every copy starts from the
/// same tensors whatever the others draw meanwhile), the process's base
/// meter and, for updates kept on the host, the CPU kernels.
fn build_worker<'g>(
    args: &Args,
    spec: &JobSpec,
    g: &'g Graph,
    live: &'g Liveness,
    shared: &Shared,
    copy: JobCopy,
    plan: &Plan,
) -> Result<Worker<'g, Program>> {
    let program = Program::new(g, shared.device)
        .with_context(|| format!("graph {:?} cannot run", g.name()))?;
    let values = tensile_kernels::initial_values(
        g,
        shared.device,
        spec.seed,
        spec.init_params.as_deref(),
        spec.inputs.as_deref(),
    )?;
    let initial = tensile_worker::initial_of(g, &values);
    let config = WorkerConfig {
        iterations: args.iterations,
        memory_budget_bytes: args.memory_mb.map(Mb::bytes),
        host: shared.host,
        engine: shared.engine,
        // A plan's run holds --memory-mb with the executor's guard;
        // vanilla runs out of memory past it, as a GPU would.
        guard: !args.vanilla,
        ledger: shared.ledger.clone(),
    };
    let mut worker = Worker::new(g, live, plan, program, initial, config)?;
    worker.set_base_meter(shared.base.clone(), copy.index);
    if g.has_host_ops() {
        let host = Program::new(g, Device::Cpu)
            .with_context(|| format!("graph {:?}: its host ops cannot run", g.name()))?;
        worker.set_host_kernels(host);
    }
    Ok(worker)
}

/// After the last iteration: the parameters written if asked, the device
/// memory let go before the scheduler hears the job is done (which may
/// take seconds: the other jobs of the device get it now, and the trace
/// says when it went), then goodbye to the scheduler.
fn finish(
    spec: &JobSpec,
    g: &Graph,
    shared: &Shared,
    copy: JobCopy,
    mut worker: Worker<'_, Program>,
    trace: Option<std::io::BufWriter<std::fs::File>>,
    session: Option<Session>,
) -> Result<()> {
    if let Some(path) = &spec.save_params {
        let path = copy.path(path);
        let values = worker.persistent_values()?;
        tensile_worker::save_params(g, values, &path)?;
        shared
            .bars
            .suspend(|| eprintln!("parameters written to {}", path.display()));
    }
    let rest = worker.close();
    if let Some(mut out) = trace {
        tensile_executor::trace::write_csv(&mut out, &rest)?;
    }
    if let Some(session) = session {
        session.finish(Duration::from_secs(5));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copys_files_carry_its_number_before_the_extension() {
        let one = JobCopy {
            index: 0,
            of: 1,
            kind: Kind::Copy,
        };
        let second = JobCopy {
            index: 1,
            of: 3,
            kind: Kind::Copy,
        };
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(one.path(&p("out/trace.csv")), p("out/trace.csv"));
        assert_eq!(second.path(&p("out/trace.csv")), p("out/trace.1.csv"));
        assert_eq!(second.path(&p("trace")), p("trace.1"));
        assert_eq!(second.path(&p("a.b.pt")), p("a.b.1.pt"));
        assert_eq!(
            (one.name(None, "r50"), second.name(Some("x"), "r50")),
            ("r50".into(), "x-1".into())
        );
        // A --job's files and name are its own; unnamed, numbered.
        let job = JobCopy {
            kind: Kind::Job,
            ..second
        };
        assert_eq!(job.path(&p("out/trace.7.csv")), p("out/trace.7.csv"));
        assert_eq!(job.name(Some("bert"), "g"), "bert");
        assert_eq!(job.name(None, "g"), "g-1");
    }
}
