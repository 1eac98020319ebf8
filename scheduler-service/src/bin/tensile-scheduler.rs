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

fn main() -> ExitCode {
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
