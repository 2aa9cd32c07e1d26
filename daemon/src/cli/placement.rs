//! `archplace placement IN.json [OUT.json]`: the reference's device-placement program.

use super::{Exit, MAX_REFERENCE_INPUT_BYTES, read_text};
use anyhow::{Context, Result};
use archplace_engine::phaze;
use std::path::PathBuf;

/// `archplace placement`.
#[derive(Debug, clap::Args)]
pub struct PlacementArgs {
    /// Input file (the reference's DP input format).
    pub input: PathBuf,
    /// Output file; stdout when omitted.
    pub output: Option<PathBuf>,
}

pub fn run(args: &PlacementArgs) -> Result<Exit> {
    let input = &args.input;
    let text = read_text(input, MAX_REFERENCE_INPUT_BYTES)?;
    let parsed = phaze::parse(&text)
        .with_context(|| format!("{} is not a placement input", input.display()))?;
    let problem = phaze::problem(&parsed)
        .with_context(|| format!("{} is not a valid placement input", input.display()))?;
    let out =
        phaze::solve(&problem).with_context(|| format!("cannot place {}", input.display()))?;
    for m in &out.messages {
        errln!("note: {m}");
    }
    let mut json = serde_json::to_vec_pretty(&out)?;
    json.push(b'\n');
    match &args.output {
        Some(path) => archplace_util::atomic::write(path, &json)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => {
            use std::io::Write;
            std::io::stdout().lock().write_all(&json)?;
        }
    }
    Ok(Exit::Success)
}
