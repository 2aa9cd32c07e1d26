//! `archplace validate`.

use anyhow::Result;
use archplace::spec::{self, Diagnostic};
use std::path::PathBuf;
use std::process::ExitCode;

/// Checks each spec, then resolves its cost models with the plugin host (so a missing
/// plugin or a parameter a plugin rejects is reported at its place in the spec).
pub fn run(files: &[PathBuf], json: bool, plugins: &super::plugin::PluginArgs) -> Result<ExitCode> {
    let host = plugins.host()?;
    let mut all: Vec<Diagnostic> = Vec::new();
    let mut text = String::new();
    let check_models = |s: &spec::Spec, text: &mut String, all: &mut Vec<Diagnostic>| {
        match spec::resolve_cost_models(s, &host, Default::default()) {
            Ok(_) => true,
            Err(diags) => {
                for d in &diags {
                    text.push_str(&d.render(&s.source_text));
                }
                all.extend(diags);
                false
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
                if check_models(&s, &mut text, &mut all) && !json {
                    outln!("ok: {}", spec::DEFAULT_SPEC_NAME)?;
                }
            }
        }
    }
    for f in files {
        match spec::load(f) {
            Ok(s) if !check_models(&s, &mut text, &mut all) => {}
            Ok(s) => {
                if !json {
                    outln!(
                        "ok: {} (search `{}`, {} model(s))",
                        f.display(),
                        s.name,
                        s.models.len()
                    )?;
                }
            }
            Err(e) => {
                text.push_str(&e.render());
                all.extend(e.diagnostics());
            }
        }
    }
    if json {
        super::print_json(&all)?;
    } else if !all.is_empty() {
        print!("{text}");
        outln!("{} error(s)", all.len())?;
    }
    Ok(if all.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
