//! The `archplace` command.

// The doc comments of the argument structs are the commands' `--help` text, written for a
// terminal: `[accelerator]` there is a spec section, not a link, and `<spec>` a placeholder.
#![allow(
    rustdoc::broken_intra_doc_links,
    rustdoc::invalid_html_tags,
    rustdoc::bare_urls
)]

#[macro_use]
mod cli;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Which accelerator should we build, and how should a large model be split across
/// 1,024 of them to train fastest?
#[derive(Debug, Parser)]
#[command(name = "archplace", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// More log output on stderr: -v archplace's debug events, -vv its trace, -vvv every
    /// library's too (wasmtime, HTTP). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log format on stderr: human text, or JSON lines (one object per event, with the
    /// search's spec name and hash).
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "ARCHPLACE_LOG_FORMAT",
        global = true
    )]
    log_format: cli::LogFormat,
    #[command(flatten)]
    plugins: cli::plugin::PluginArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the search of a spec: the best accelerator and training plan, with result files
    /// (`result.json`, `explored.jsonl`) in the results folder.
    Run(cli::run::RunArgs),
    /// Run the daemon: watch a folder of specs, search each new one, write results and
    /// states; stop cleanly on SIGTERM or SIGINT.
    Daemon(cli::daemon::DaemonArgs),
    /// Check spec files; print every problem with its location and exit 1 if any.
    Validate(cli::validate::ValidateArgs),
    /// Print the JSON Schema of spec files.
    Schema,
    /// List the software-stack profiles (`[training] stack`): the defaults each gives,
    /// its sources, and the calibration it applies per GPU generation with its
    /// cross-validated errors.
    Stacks(cli::stacks::StacksArgs),
    /// Print a shell's completion script, e.g. `archplace completions bash >
    /// ~/.local/share/bash-completion/completions/archplace`.
    Completions(CompletionsArgs),
    /// Print the man page (roff), e.g. `archplace man > ~/.local/share/man/man1/archplace.1`.
    Man,
    /// Cost-model plugins: check a component, list or install plugins, print the WIT.
    #[command(subcommand)]
    Plugin(cli::plugin::PluginCommand),
    /// Print the layers of each model of a spec: parameters, stashed activations, FLOPs and
    /// operator counts, per tensor-parallel width.
    Model(cli::model::ModelArgs),
    /// List the candidate accelerators of a spec in the order the search visits them.
    Space(cli::space::SpaceArgs),
    /// Estimate one training step of a fixed chip ([accelerator]) and plan ([plan]): step
    /// time and where it goes, memory per device, throughput, FLOP rates, energy. `estimate
    /// op`: one operator on that chip. Exit 3 when the plan cannot run.
    Estimate(cli::estimate::EstimateArgs),
    /// Fit the latency model's calibratable parameters (and the cluster's collective
    /// efficiencies) to measurements; write a calibration file with every residual,
    /// cross-validated errors, the parameters' uncertainty and the provenance.
    Calibrate(cli::calibrate::CalibrateArgs),
    /// Why the winner of a finished search wins: the chips it beat and what limits each,
    /// what they differ in, and the winner's neighbours along each axis.
    Explain(cli::explain::ExplainArgs),
    /// Solve a device-placement problem in the reference system's JSON format and write
    /// its output fields (to OUT, atomically, or to stdout).
    Placement(cli::placement::PlacementArgs),
    /// Schedule one layer's operators (the reference's fixture format) and print the
    /// makespan and, per operator, its mode, core and start as JSON.
    Schedule(cli::schedule::ScheduleArgs),
}

#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logging = cli::init_logging(
        cli.verbose,
        matches!(cli.command, Command::Daemon(_)),
        cli.log_format,
    );
    let plugins = &cli.plugins;
    let result = match &cli.command {
        Command::Run(args) => cli::run::run(args, plugins),
        Command::Validate(args) => cli::validate::run(args, plugins),
        Command::Daemon(args) => cli::daemon::run(args, plugins, logging),
        Command::Plugin(cmd) => cli::plugin::run(cmd, plugins),
        Command::Completions(args) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(args.shell, &mut cmd, "archplace", &mut std::io::stdout());
            Ok(cli::Exit::Success)
        }
        Command::Man => {
            let cmd = <Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(cmd)
                .render(&mut std::io::stdout())
                .map(|()| cli::Exit::Success)
                .map_err(anyhow::Error::from)
        }
        Command::Schema => {
            cli::print_json(&archplace_spec::json_schema()).map(|_| cli::Exit::Success)
        }
        Command::Stacks(args) => cli::stacks::run(args),
        Command::Model(args) => cli::model::run(args),
        Command::Space(args) => cli::space::run(args, plugins),
        Command::Estimate(args) => cli::estimate::run(args, plugins),
        Command::Calibrate(args) => cli::calibrate::run(args, plugins),
        Command::Explain(args) => cli::explain::run(args),
        Command::Placement(args) => cli::placement::run(args),
        Command::Schedule(args) => cli::schedule::run(args),
    };
    match result {
        Ok(exit) => exit.into(),
        // The reader of our output went away (`archplace schema | head -1`): what it
        // wanted it has; end quietly and successfully, as ripgrep does.
        Err(e) if cli::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
