//! `archplace schedule LAYER.json`.

use anyhow::{Context, Result, bail};
use archplace_engine::phaze::schedule as format;
use archplace_engine::schedule::{Options, check, solve};
use std::path::Path;
use std::process::ExitCode;

pub fn run(path: &Path, node_limit: u64, time_limit: f64, gap: f64) -> Result<ExitCode> {
    if !(0.0..1.0).contains(&gap) {
        bail!("--gap must be a fraction from 0 up to, not including, 1");
    }
    if !(time_limit.is_finite() && time_limit > 0.0) {
        bail!("--time-limit must be a positive number of seconds");
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let input = format::parse(&text)
        .with_context(|| format!("{} is not a layer instance", path.display()))?;
    let inst = format::instance(&input)
        .with_context(|| format!("{} is not a valid layer instance", path.display()))?;
    let schedule = solve(
        &inst,
        &Options {
            node_limit,
            time_limit_seconds: time_limit,
            heuristic_only: false,
            relative_gap: gap,
        },
    )
    .with_context(|| format!("cannot schedule {}", path.display()))?;
    check(&inst, &schedule.placements)
        .map_err(|e| anyhow::anyhow!("internal error: invalid schedule: {e}"))?;
    if !schedule.optimal {
        eprintln!(
            "note: not proven optimal (gap {:.3}%{})",
            schedule.gap * 100.0,
            if schedule.hit_time_limit {
                ", MIP time limit reached"
            } else if schedule.hit_node_limit {
                ", MIP node limit reached"
            } else {
                ""
            }
        );
    }
    super::print_json(&format::output(&input, &schedule))?;
    Ok(ExitCode::SUCCESS)
}
