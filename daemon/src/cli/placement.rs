//! `archplace placement IN.json [OUT.json]`: the reference's device-placement program.

use anyhow::{Context, Result};
use archplace_engine::phaze;
use std::path::Path;
use std::process::ExitCode;

pub fn run(input: &Path, output: Option<&Path>) -> Result<ExitCode> {
    let text = std::fs::read_to_string(input)
        .with_context(|| format!("cannot read {}", input.display()))?;
    let parsed = phaze::parse(&text)
        .with_context(|| format!("{} is not a placement input", input.display()))?;
    let problem = phaze::problem(&parsed)
        .with_context(|| format!("{} is not a valid placement input", input.display()))?;
    let out =
        phaze::solve(&problem).with_context(|| format!("cannot place {}", input.display()))?;
    for m in &out.messages {
        eprintln!("note: {m}");
    }
    let mut json = serde_json::to_vec_pretty(&out)?;
    json.push(b'\n');
    match output {
        Some(path) => archplace_util::atomic::write(path, &json)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => {
            use std::io::Write;
            std::io::stdout().lock().write_all(&json)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
