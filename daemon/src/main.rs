//! The `archplace` command.

mod cli;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
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
    Run {
        /// Spec file; the embedded default spec when omitted.
        spec: Option<PathBuf>,
        /// Result folder (default: RESULTS/<spec name>/<content hash>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Root of result folders.
        #[arg(long, default_value = "results")]
        results: PathBuf,
        /// Print `result.json` on stdout instead of a summary.
        #[arg(long)]
        json: bool,
        /// Worker threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// The most memory the search may need, by the estimate made before it starts
        /// (e.g. "8 GiB"; default: half of this machine's memory): a larger search is
        /// refused with the numbers.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        memory_budget: Option<u64>,
    },
    /// Run the daemon: watch a folder of specs, search each new one, write results and
    /// states; stop cleanly on SIGTERM or SIGINT.
    Daemon(cli::daemon::DaemonArgs),
    /// Check spec files; print every problem with its location and exit 1 if any.
    Validate {
        /// Spec files (TOML). Without any, the embedded default spec is checked.
        files: Vec<PathBuf>,
        /// Check a daemon config file instead.
        #[arg(long, value_name = "FILE", conflicts_with = "files")]
        config: Option<PathBuf>,
        /// Print the problems as JSON (one array) on stdout.
        #[arg(long)]
        json: bool,
        /// Refuse a spec whose search may need more memory than this (e.g. "8 GiB";
        /// default: half of this machine's memory, as for `run`; the daemon's is
        /// `search_memory_bytes`).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        memory_budget: Option<u64>,
        /// Worker threads the memory estimate counts (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Print each good spec with every default written out (itself a spec) on stdout.
        #[arg(long, conflicts_with = "json")]
        print_resolved: bool,
    },
    /// Print the JSON Schema of spec files.
    Schema,
    /// Print a shell's completion script, e.g. `archplace completions bash >
    /// ~/.local/share/bash-completion/completions/archplace`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `archplace man > ~/.local/share/man/man1/archplace.1`.
    Man,
    /// Cost-model plugins: check a component, list or install plugins, print the WIT.
    #[command(subcommand)]
    Plugin(cli::plugin::PluginCommand),
    /// Print the layers of each model of a spec: parameters, stashed activations, FLOPs and
    /// operator counts, per tensor-parallel width.
    Model {
        /// Spec file; the embedded default spec when omitted.
        spec: Option<PathBuf>,
        /// Micro-batch size (default: the spec's smallest).
        #[arg(long)]
        micro_batch: Option<u64>,
        /// Machine-readable output: one JSON object per model and width.
        #[arg(long)]
        json: bool,
    },
    /// List the candidate accelerators of a spec in the order the search visits them.
    Space {
        /// Spec file; the embedded default spec when omitted.
        spec: Option<PathBuf>,
        /// One JSON document: `{"summary": {…}, "candidates": […]}`.
        #[arg(long, conflicts_with = "jsonl")]
        json: bool,
        /// JSON Lines, streamed: one object per candidate, then the summary.
        #[arg(long)]
        jsonl: bool,
        /// Print at most this many candidates (the summary covers all).
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Estimate one training step of a fixed chip ([accelerator]) and plan ([plan]): step
    /// time and where it goes, memory per device, throughput, FLOP rates, energy. `estimate
    /// op`: one operator on that chip. Exit 3 when the plan cannot run.
    Estimate(cli::estimate::EstimateArgs),
    /// Solve a device-placement problem in the reference system's JSON format and write
    /// its output fields (to OUT, atomically, or to stdout).
    Placement {
        /// Input file (the reference's DP input format).
        input: PathBuf,
        /// Output file; stdout when omitted.
        output: Option<PathBuf>,
    },
    /// Schedule one layer's operators (the reference's fixture format) and print the
    /// makespan and, per operator, its mode, core and start as JSON.
    Schedule {
        /// Instance file (the reference's layer format, e.g. `tests/fixtures/schedule/layer-000.json`).
        layer: PathBuf,
        /// Branch-and-bound nodes the MIP may explore (the reproducible limit).
        #[arg(long, default_value_t = archplace_engine::schedule::MAX_NODE_LIMIT)]
        node_limit: u64,
        /// Wall-clock limit of the MIP, seconds (a safety net; what it stops at depends
        /// on the machine).
        #[arg(long, default_value_t = 10.0)]
        time_limit: f64,
        /// Accept a schedule within this relative gap of the bound (default 0: prove
        /// optimality).
        #[arg(long, default_value_t = 0.0)]
        gap: f64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logging = cli::init_logging(
        cli.verbose,
        matches!(cli.command, Command::Daemon(_)),
        cli.log_format,
    );
    let result = match cli.command {
        Command::Run {
            spec,
            out,
            results,
            json,
            threads,
            memory_budget,
        } => cli::run::run(
            spec.as_deref(),
            out.as_deref(),
            &results,
            json,
            memory_budget.unwrap_or_else(archplace_job::memory::machine_budget_bytes),
            threads,
            &cli.plugins,
        ),
        Command::Validate {
            config: Some(config),
            json,
            ..
        } => cli::daemon::validate_config(&config, json),
        Command::Validate {
            files,
            json,
            memory_budget,
            threads,
            print_resolved,
            ..
        } => cli::validate::run(
            &files,
            json,
            print_resolved,
            memory_budget.unwrap_or_else(archplace_job::memory::machine_budget_bytes),
            threads,
            &cli.plugins,
        ),
        Command::Daemon(args) => cli::daemon::run(&args, &cli.plugins, logging),
        Command::Plugin(cmd) => cli::plugin::run(cmd, &cli.plugins),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "archplace", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            let cmd = <Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(cmd)
                .render(&mut std::io::stdout())
                .map(|()| ExitCode::SUCCESS)
                .map_err(anyhow::Error::from)
        }
        Command::Schema => {
            cli::print_json(&archplace_spec::json_schema()).map(|_| ExitCode::SUCCESS)
        }
        Command::Model {
            spec,
            micro_batch,
            json,
        } => cli::model::run(spec.as_deref(), micro_batch, json),
        Command::Space {
            spec,
            json,
            jsonl,
            limit,
        } => {
            let format = match (json, jsonl) {
                (true, _) => cli::space::Format::Json,
                (_, true) => cli::space::Format::JsonLines,
                _ => cli::space::Format::Text,
            };
            cli::space::run(spec.as_deref(), format, limit, &cli.plugins)
        }
        Command::Estimate(args) => cli::estimate::run(&args, &cli.plugins),
        Command::Placement { input, output } => cli::placement::run(&input, output.as_deref()),
        Command::Schedule {
            layer,
            node_limit,
            time_limit,
            gap,
        } => cli::schedule::run(&layer, node_limit, time_limit, gap),
    };
    match result {
        Ok(code) => code,
        // The reader of our output went away (`archplace schema | head -1`): what it
        // wanted it has; end quietly and successfully, as ripgrep does.
        Err(e) if cli::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A size on the command line: "8 GiB", "512 MiB", or bytes.
fn parse_size(s: &str) -> Result<u64, String> {
    archplace_plugin_sdk::units::parse_bytes(s).map_err(|e| e.to_string())
}
