//! `archplace stacks`: the shipped software-stack profiles, their defaults, sources and
//! calibrations with the errors those were made with.

use super::{Exit, print_json};
use anyhow::Result;
use archplace_spec::stack::{self, CalibrationErrors, ErrorPercent};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, clap::Args)]
pub struct StacksArgs {
    /// Print the profiles as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Row {
    name: String,
    title: String,
    /// The `[training]` keys a spec naming the stack gets when it leaves them out.
    defaults: toml::Table,
    /// The cost-model parameters a spec using that plugin gets when it leaves them out.
    parameters: BTreeMap<String, toml::Table>,
    /// Per GPU generation, the defaults that replace those (what the framework ran there).
    generations: BTreeMap<String, GenerationRow>,
    /// Per GPU generation, the shipped calibration and its errors.
    calibrations: BTreeMap<String, CalibrationRow>,
    sources: Vec<String>,
}

#[derive(Serialize)]
struct GenerationRow {
    training: toml::Table,
    parameters: BTreeMap<String, toml::Table>,
}

#[derive(Serialize)]
struct CalibrationRow {
    calibration: String,
    errors: Option<CalibrationErrors>,
}

fn rows() -> Vec<Row> {
    stack::all_shipped()
        .into_iter()
        .map(|s| Row {
            calibrations: s
                .calibrations
                .iter()
                .map(|(gpu, name)| {
                    let row = CalibrationRow {
                        calibration: name.clone(),
                        errors: stack::calibration_errors(name),
                    };
                    (gpu.clone(), row)
                })
                .collect(),
            generations: s
                .generations
                .into_iter()
                .map(|(gpu, g)| {
                    let row = GenerationRow {
                        training: g.training,
                        parameters: g.parameters,
                    };
                    (gpu, row)
                })
                .collect(),
            parameters: s.parameters,
            name: s.name,
            title: s.title,
            defaults: s.training,
            sources: s.sources,
        })
        .collect()
}

/// A table's keys as `key = value, …`.
fn keys(table: &toml::Table) -> String {
    let keys: Vec<String> = table.iter().map(|(k, v)| format!("{k} = {v}")).collect();
    keys.join(", ")
}

/// Cost-model parameters per plugin, as `gpu-like: fused_epilogues = false`.
fn parameters(per_plugin: &BTreeMap<String, toml::Table>) -> String {
    per_plugin
        .iter()
        .map(|(plugin, values)| format!("{plugin}: {}", keys(values)))
        .collect::<Vec<_>>()
        .join("; ")
}

fn percent(e: &ErrorPercent) -> String {
    format!("{:.1}% mean, {:.1}% max", e.mean_percent, e.max_percent)
}

pub fn run(args: &StacksArgs) -> Result<Exit> {
    let rows = rows();
    if args.json {
        print_json(&rows)?;
        return Ok(Exit::Success);
    }
    for r in &rows {
        outln!("{} — {}", r.name, r.title)?;
        outln!("  defaults: {}", keys(&r.defaults))?;
        if !r.parameters.is_empty() {
            outln!("  cost-model parameters: {}", parameters(&r.parameters))?;
        }
        for (gpu, g) in &r.generations {
            let parts = [keys(&g.training), parameters(&g.parameters)];
            let line: Vec<&str> = parts
                .iter()
                .map(String::as_str)
                .filter(|p| !p.is_empty())
                .collect();
            outln!("  on {gpu}: {}", line.join(", "))?;
        }
        if r.calibrations.is_empty() {
            outln!("  calibration: none yet (uncalibrated estimates)")?;
        }
        // One line per calibration, with the GPU generations it serves.
        let mut by_calibration: BTreeMap<&str, (Vec<&str>, Option<&CalibrationErrors>)> =
            BTreeMap::new();
        for (gpu, c) in &r.calibrations {
            let entry = by_calibration
                .entry(&c.calibration)
                .or_insert((Vec::new(), c.errors.as_ref()));
            entry.0.push(gpu);
        }
        for (name, (gpus, errors)) in by_calibration {
            let detail = match errors {
                Some(e) => format!(
                    "{} runs; uncalibrated {}, leave-one-out {}{}",
                    e.measurements,
                    percent(&e.uncalibrated),
                    percent(&e.leave_one_out),
                    e.leave_one_source_out
                        .as_ref()
                        .map(|x| format!(", leave-one-source-out {}", percent(x)))
                        .unwrap_or_default()
                ),
                None => "errors unknown".into(),
            };
            outln!("  calibration {name} for {}: {detail}", gpus.join(", "))?;
        }
        for s in &r.sources {
            outln!("  source: {s}")?;
        }
        outln!()?;
    }
    outln!(
        "Use one with `[training] stack = \"NAME\"` (or a profile file of the same format); the spec's own [training] keys win."
    )?;
    Ok(Exit::Success)
}
