//! `tensilectl`: the command-line client of the TENSILE service.
//!
//! Thin: parses arguments (`args`) into a validated command (`config`),
//! runs it, maps errors to exit codes (1: the command failed or the input
//! is invalid; 2: bad usage). Planning and simulation experiments live in
//! `tensile-experiments`; this crate prints and plots what they return.

mod args;
mod bench_cmd;
mod bench_colocate;
mod bench_node;
mod bench_planner;
mod bench_service;
mod bench_sweep;
mod config;
mod demo_cmd;
mod graph_cmd;
mod input;
mod latency_cmd;
mod plan_cmd;
mod plot;
mod progress;
mod report;
mod server_cmd;
mod sim_cmd;
mod zoo_cmd;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{BenchCommand, Cli, Command, GraphCommand, LatencyCommand};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Zoo(a) => zoo_cmd::run(&a),
        Command::Graph(GraphCommand::Stats(a)) => graph_cmd::stats(&a),
        Command::Graph(GraphCommand::Export(a)) => graph_cmd::export(&a),
        Command::Graph(GraphCommand::Check(a)) => graph_cmd::check(&a),
        Command::Plan(a) => match a.server.as_deref() {
            Some(server) => {
                let server = if server == "default" {
                    tensile_proto::endpoint::resolve_server(None, 0).map_err(anyhow::Error::from)
                } else {
                    Ok(server.to_string())
                };
                server.and_then(|s| server_cmd::plan(&a, &s))
            }
            None => config::PlanCommand::from_args(&a).and_then(|c| plan_cmd::run(&c)),
        },
        Command::Sim(a) => config::SimCommand::from_args(&a).and_then(|c| sim_cmd::run(&c)),
        Command::Latency(LatencyCommand::Eval(a)) => latency_cmd::eval(&a),
        Command::Bench(BenchCommand::Paper(a)) => {
            config::BenchCommand::from_args(&a).and_then(|c| bench_cmd::run(&c))
        }
        Command::Demo(a) => demo_cmd::run(&a),
        Command::Bench(BenchCommand::Service(a)) => bench_service::run(&a),
        Command::Bench(BenchCommand::Planner(a)) => bench_planner::run(&a),
        Command::Bench(BenchCommand::Colocate(a)) => {
            config::ColocateCommand::from_args(&a).and_then(|c| bench_colocate::run(&c))
        }
        Command::Status(a) => server_cmd::status(&a),
        Command::Budget(a) => server_cmd::budget(&a),
        Command::Watch(a) => server_cmd::watch(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `demo` stops its children before it ends on a closed stdout.
        Err(e)
            if e.downcast_ref::<tensile_cli::StdoutError>()
                .is_some_and(tensile_cli::StdoutError::reader_gone) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            // One line: the chain of causes joined, as a user would read it.
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
