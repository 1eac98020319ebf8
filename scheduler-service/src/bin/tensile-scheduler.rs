//! `tensile-scheduler`: parse the configuration, start tracing (RUST_LOG),
//! bind the listeners (or one socket per GPU), run the library until
//! SIGINT or SIGTERM; or, `tensile-scheduler endpoint`, print where a
//! job's scheduler listens.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tensile_scheduler::cli::{Args, Command, Serve};
use tensile_scheduler::endpoint_cmd::endpoint;
use tensile_scheduler::node::run_gpus;
use tensile_scheduler::{Listener, run};
use tracing_subscriber::EnvFilter;

/// jemalloc rather than glibc's malloc: with an arena per thread glibc kept
/// the scheduler at about 1 GB resident after 128 jobs where its data held
/// 83 MB; jemalloc's background threads hand freed pages back to the system
/// (after its decay time, 10 s) without waiting for the next allocation,
/// and it counts its heap for the metrics (`heap_allocated_bytes`,
/// `heap_resident_bytes`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How long jemalloc keeps freed pages before handing them back, ms: 1 s
/// rather than its 10 s, so that what a joint plan allocates for its search
/// leaves the resident memory soon after it ends.
const DIRTY_DECAY_MS: isize = 1000;

/// Sets the decay of the arena that exists before any thread starts
/// (`arena.0`) and of the ones the threads make later; a failure leaves
/// jemalloc's default.
fn set_heap_decay() {
    use tikv_jemalloc_ctl::{Access, AsName};
    for key in [
        &b"arenas.dirty_decay_ms\0"[..],
        &b"arena.0.dirty_decay_ms\0"[..],
    ] {
        if let Err(e) = key.name().write(DIRTY_DECAY_MS) {
            eprintln!("note: cannot set the heap's decay: {e}");
        }
    }
}

fn main() -> ExitCode {
    set_heap_decay();
    let args = Args::parse();
    if let Some(Command::Endpoint(e)) = &args.command {
        return match endpoint(e) {
            Ok(text) => {
                tensile_cli::outln!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {}", e.message);
                ExitCode::from(e.status)
            }
        };
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour for a person at a terminal; none in a log file or journal.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let resolved = match args.resolve() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for n in &resolved.notes {
        tracing::info!("{n}");
    }
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| {
            let r = rt.block_on(async {
                match &resolved.serve {
                    Serve::Listen(addrs) => {
                        let mut listeners = Vec::new();
                        for a in addrs {
                            listeners.push(
                                Listener::bind_with_mode(a, resolved.config.socket_mode).await?,
                            );
                        }
                        run(listeners, resolved.config, shutdown_signal()).await?;
                    }
                    Serve::Gpus { dir, gpus } => {
                        run_gpus(dir, gpus, resolved.config, shutdown_signal()).await?;
                    }
                }
                Ok(())
            });
            // A plan still running on a blocking thread cannot be
            // interrupted; `run` has already given up on it at the
            // deadline, and the process must not wait for it either.
            rt.shutdown_timeout(std::time::Duration::from_millis(100));
            r
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

/// SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
