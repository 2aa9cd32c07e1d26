//! `archplace schedule LAYER.json`.

use super::{Exit, MAX_REFERENCE_INPUT_BYTES, read_text};
use anyhow::{Context, Result, bail};
use archplace_engine::options::ScheduleOptions;
use archplace_engine::phaze::schedule as format;
use archplace_engine::schedule::{check, solve};
use std::path::PathBuf;

/// `archplace schedule`.
#[derive(Debug, clap::Args)]
pub struct ScheduleArgs {
    /// Instance file (the reference's layer format, e.g. `tests/fixtures/schedule/layer-000.json`).
    pub layer: PathBuf,
    /// Branch-and-bound nodes the MIP may explore (the reproducible limit).
    #[arg(long, default_value_t = archplace_engine::options::MAX_NODE_LIMIT)]
    pub node_limit: u64,
    /// Wall-clock limit of the MIP, seconds (a safety net; what it stops at depends
    /// on the machine).
    #[arg(long, default_value_t = 10.0)]
    pub time_limit: f64,
    /// Accept a schedule within this relative gap of the bound (default 0: prove
    /// optimality).
    #[arg(long, default_value_t = 0.0)]
    pub gap: f64,
}

pub fn run(args: &ScheduleArgs) -> Result<Exit> {
    let (path, gap, time_limit) = (&args.layer, args.gap, args.time_limit);
    if !(0.0..1.0).contains(&gap) {
        bail!("--gap must be a fraction from 0 up to, not including, 1");
    }
    if !(time_limit.is_finite() && time_limit > 0.0) {
        bail!("--time-limit must be a positive number of seconds");
    }
    let text = read_text(path, MAX_REFERENCE_INPUT_BYTES)?;
    let input = format::parse(&text)
        .with_context(|| format!("{} is not a layer instance", path.display()))?;
    let inst = format::instance(&input)
        .with_context(|| format!("{} is not a valid layer instance", path.display()))?;
    let schedule = solve(
        &inst,
        &ScheduleOptions {
            node_limit: args.node_limit,
            time_limit_seconds: time_limit,
            heuristic_only: false,
            relative_gap: gap,
        },
    )
    .with_context(|| format!("cannot schedule {}", path.display()))?;
    check(&inst, &schedule.placements)
        .map_err(|e| anyhow::anyhow!("internal error: invalid schedule: {e}"))?;
    if !schedule.optimal {
        errln!(
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
    Ok(Exit::Success)
}
