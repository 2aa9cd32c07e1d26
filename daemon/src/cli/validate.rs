//! `archplace validate`.

use super::Exit;
use anyhow::Result;
use archplace_engine::search::Strategy;
use archplace_engine::search::memory::bound_cost as estimate_bound;
use archplace_job::RunError;
use archplace_plugin_sdk::text::thousands;
use archplace_plugin_sdk::units::format_bytes;
use archplace_spec::{self as spec, Diagnostic};
use std::path::PathBuf;

/// `archplace validate`.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Spec files (TOML). Without any, the embedded default spec is checked.
    pub files: Vec<PathBuf>,
    /// Check a daemon config file instead.
    #[arg(long, value_name = "FILE", conflicts_with = "files")]
    pub config: Option<PathBuf>,
    /// Print the problems as JSON (one array) on stdout.
    #[arg(long)]
    pub json: bool,
    /// Refuse a spec whose search may need more memory than this (e.g. "8 GiB";
    /// default: half of this machine's memory, as for `run`; the daemon's is
    /// `search_memory_bytes`).
    #[arg(long, value_name = "SIZE", value_parser = super::parse_size)]
    pub memory_budget: Option<u64>,
    /// Worker threads the memory estimate counts (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print each good spec with every default written out (itself a spec) on stdout.
    #[arg(long, conflicts_with = "json")]
    pub print_resolved: bool,
}

/// Checks each spec, then resolves its cost models with the plugin host (so a missing
/// plugin or a parameter a plugin rejects is reported at its place in the spec), then
/// estimates its search's memory on `threads` (default: all cores) against the budget.
pub fn run(args: &ValidateArgs, plugins: &super::plugin::PluginArgs) -> Result<Exit> {
    if let Some(config) = &args.config {
        return super::daemon::validate_config(config, args.json);
    }
    let (files, json, print_resolved) = (&args.files, args.json, args.print_resolved);
    let memory_budget_bytes = args
        .memory_budget
        .unwrap_or_else(archplace_job::memory::machine_budget_bytes);
    let host = plugins.host()?;
    let threads = args
        .threads
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut all: Vec<Diagnostic> = Vec::new();
    let mut text = String::new();
    // The memory estimate in words when the spec is good.
    let check_models = |s: &spec::Spec, text: &mut String, all: &mut Vec<Diagnostic>| {
        let cancel = Default::default();
        match archplace_job::prepare(s, &host, threads, Some(memory_budget_bytes), &cancel, None) {
            Ok(p) => {
                let memory = format!(
                    "may need up to {} of its {} memory budget on {threads} thread(s)",
                    format_bytes(p.memory.total_bytes),
                    format_bytes(memory_budget_bytes)
                );
                Some(match s.space.strategy {
                    Strategy::Proven => format!("{memory}; {}", bound_cost(&p, threads)),
                    _ => memory,
                })
            }
            Err(RunError::CostModel(diags) | RunError::Memory(diags) | RunError::Area(diags)) => {
                for d in &diags {
                    text.push_str(&d.render(&s.source_text));
                }
                all.extend(diags);
                None
            }
            // `prepare` fails only with located problems of the spec.
            Err(e) => {
                text.push_str(&format!("error: {e}\n"));
                None
            }
        }
    };
    if files.is_empty() {
        match spec::default_spec() {
            Err(diags) => {
                for d in &diags {
                    text.push_str(&d.render(spec::DEFAULT_SPEC));
                }
                all.extend(diags);
            }
            Ok(s) => {
                if let Some(memory) = check_models(&s, &mut text, &mut all)
                    && !json
                {
                    if print_resolved {
                        outln!("{}", spec::resolved(&s))?;
                    } else {
                        outln!("ok: {} ({memory})", spec::DEFAULT_SPEC_NAME)?;
                    }
                }
            }
        }
    }
    for f in files {
        match spec::load_with_plugins(f, &host, Default::default()) {
            Ok(s) => {
                if let Some(memory) = check_models(&s, &mut text, &mut all)
                    && !json
                {
                    if print_resolved {
                        outln!("{}", spec::resolved(&s))?;
                    } else {
                        outln!(
                            "ok: {} (search `{}`, {} model(s); {memory})",
                            f.display(),
                            s.name,
                            s.models.len()
                        )?;
                    }
                    for note in s.defaulted_sections() {
                        errln!("note: {}: {note}", f.display());
                    }
                }
            }
            Err(e) => {
                text.push_str(&e.render());
                all.extend(e.diagnostics());
            }
        }
    }
    // Diagnostics go to stderr, as every command's do; stdout has the "ok" lines, or with
    // `--json` the one JSON document.
    if json {
        super::print_json(&all)?;
    } else if !all.is_empty() {
        err!("{text}");
        errln!("{} error(s)", all.len());
    }
    Ok(if all.is_empty() {
        Exit::Success
    } else {
        Exit::Problems
    })
}

/// What a proven search of `p` spends bounding, in words: "bounds 29,360 candidates first
/// (about 4 s on 2 threads, 576 operators each)" — its space enumerated (seconds for
/// millions of configurations), or its configurations when the area model refuses it
/// (the run then says why).
fn bound_cost(p: &archplace_job::Prepared<'_>, threads: usize) -> String {
    let s: &spec::Spec = &p.spec;
    let candidates = match p.enumerated_candidates() {
        Some(n) => n as u64,
        None => archplace_engine::space::enumerate(&s.space, p.models.area.as_ref()).map_or_else(
            |_| archplace_engine::search::memory::configurations(&s.space),
            |space| space.candidates.len() as u64,
        ),
    };
    let c = estimate_bound(&s.search_input(), candidates, threads);
    format!(
        "a proven search bounds {} candidates first (about {} on {} thread(s), {} operators each; then it evaluates those the bounds cannot rule out)",
        thousands(c.candidates),
        rough_duration(c.seconds),
        c.threads,
        thousands(c.operators_per_candidate)
    )
}

/// A duration in the unit a person reads it in: "40 s", "17 min", "2.5 h".
fn rough_duration(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("{:.0} s", seconds.max(1.0))
    } else if seconds < 90.0 * 60.0 {
        format!("{:.0} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}
