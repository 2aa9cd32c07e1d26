//! `archplace validate`.

use anyhow::Result;
use archplace::spec::{self, Diagnostic};
use std::path::PathBuf;
use std::process::ExitCode;

pub fn run(files: &[PathBuf], json: bool) -> Result<ExitCode> {
    let mut all: Vec<Diagnostic> = Vec::new();
    let mut text = String::new();
    if files.is_empty() {
        if let Err(diags) = spec::default_spec() {
            for d in &diags {
                text.push_str(&d.render(spec::DEFAULT_SPEC));
            }
            all.extend(diags);
        } else if !json {
            println!("ok: {}", spec::DEFAULT_SPEC_NAME);
        }
    }
    for f in files {
        match spec::load(f) {
            Ok(s) => {
                if !json {
                    println!(
                        "ok: {} (search `{}`, {} model(s))",
                        f.display(),
                        s.name,
                        s.models.len()
                    );
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
        println!("{} error(s)", all.len());
    }
    Ok(if all.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
