//! `archplace validate`.

use anyhow::Result;
use archplace_job::RunError;
use archplace_plugin_sdk::units::format_bytes;
use archplace_spec::{self as spec, Diagnostic};
use std::path::PathBuf;
use std::process::ExitCode;

/// Checks each spec, then resolves its cost models with the plugin host (so a missing
/// plugin or a parameter a plugin rejects is reported at its place in the spec), then
/// estimates its search's memory on `threads` (default: all cores) against the budget.
pub fn run(
    files: &[PathBuf],
    json: bool,
    print_resolved: bool,
    memory_budget_bytes: u64,
    threads: Option<usize>,
    plugins: &super::plugin::PluginArgs,
) -> Result<ExitCode> {
    let host = plugins.host()?;
    let threads = threads
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut all: Vec<Diagnostic> = Vec::new();
    let mut text = String::new();
    // The memory estimate in words when the spec is good.
    let check_models = |s: &spec::Spec, text: &mut String, all: &mut Vec<Diagnostic>| {
        let cancel = Default::default();
        match archplace_job::prepare(s, &host, threads, Some(memory_budget_bytes), &cancel) {
            Ok(p) => Some(format!(
                "may need up to {} of its {} memory budget on {threads} thread(s)",
                format_bytes(p.memory.total_bytes),
                format_bytes(memory_budget_bytes)
            )),
            Err(RunError::CostModel(diags) | RunError::Memory(diags)) => {
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
        match spec::load(f) {
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
                        eprintln!("note: {}: {note}", f.display());
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
        eprint!("{text}");
        eprintln!("{} error(s)", all.len());
    }
    Ok(if all.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
