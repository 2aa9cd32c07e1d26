//! The memory budget of one search. Before a search starts, the memory it may need is
//! estimated from the spec (the engine's part: [`archplace_engine::search::memory`]; the
//! cost models' instances and the result files here), and a spec above the operator's
//! budget is refused with the numbers — instead of a search that aborts, or swaps, the
//! process and every other search in it. The daemon's budget is `search_memory_bytes`;
//! `archplace run` and `validate` take `--memory-budget`.

use archplace_cost_port::CostModelSource;
use archplace_engine::search::memory::{self, MemoryEstimate};
use archplace_plugin_sdk::text::thousands;
use archplace_plugin_sdk::units::format_bytes;
use archplace_spec::{Diagnostic, Spec};
use serde::Serialize;

/// The default budget of one search: 3 GiB. The systemd unit's `MemoryMax=8G` holds two
/// searches at this budget (`max_concurrent_searches = 2`) and the daemon's own memory.
pub const DEFAULT_BUDGET_BYTES: u64 = 3 << 30;

/// The command line's default budget: half of this machine's memory (`MemTotal` in
/// `/proc/meminfo`), or [`DEFAULT_BUDGET_BYTES`] where that cannot be read.
pub fn machine_budget_bytes() -> u64 {
    archplace_util::files::read_regular(std::path::Path::new("/proc/meminfo"), 1 << 20)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib.saturating_mul(1024) / 2)
        })
        .filter(|&b| b > 0)
        .unwrap_or(DEFAULT_BUDGET_BYTES)
}

/// The result files' memory beyond the explored list the search holds: `explored.jsonl` is
/// streamed, and the Pareto plot draws at most one dot per cell of its grid (60,000 dots of
/// ~100 bytes of SVG), plus its point list.
const PLOT_BYTES: u64 = 16 << 20;

/// A search's memory: the engine's parts, its cost models and its result files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Estimate {
    pub engine: MemoryEstimate,
    /// The cost-model plugins' instances (each plugin's memory cap × its instances), and
    /// the plugin host's memo of their estimates (the engine's memo, up to the host memo's
    /// capacity).
    pub cost_models_bytes: u64,
    /// Writing the results: the Pareto plot's points and picture.
    pub results_bytes: u64,
    pub total_bytes: u64,
}

/// The memory a search of `spec` may need with `threads` workers and the cost models of
/// `source`.
pub fn estimate(spec: &Spec, source: &dyn CostModelSource, threads: usize) -> Estimate {
    estimate_for(spec, source, threads, None)
}

/// [`estimate`] with the space's candidates counted (see [`memory::estimate_for`]).
pub fn estimate_for(
    spec: &Spec,
    source: &dyn CostModelSource,
    threads: usize,
    candidates: Option<u64>,
) -> Estimate {
    let input = spec.search_input();
    let engine = memory::estimate_for(&input, &spec.space, threads, candidates);
    let mut plugins = vec![
        spec.cost_model.area.name.as_str(),
        spec.cost_model.latency.name.as_str(),
    ];
    plugins.dedup();
    let instances = plugins
        .iter()
        .map(|p| source.instance_memory_bytes(p))
        .fold(0u64, u64::saturating_add);
    // The host's memo holds the same estimates as the engine's, up to its capacity.
    let cost_models_bytes =
        instances.saturating_add(engine.memo_bytes.min(source.memo_memory_bytes()));
    let results_bytes = engine
        .candidates
        .saturating_mul(2 * 16)
        .saturating_add(PLOT_BYTES);
    Estimate {
        engine,
        cost_models_bytes,
        results_bytes,
        total_bytes: engine
            .total_bytes
            .saturating_add(cost_models_bytes)
            .saturating_add(results_bytes),
    }
}

/// The estimate in words, largest parts first: "1.80 GiB (the cost-model plugins 864 MiB,
/// …)".
pub fn describe(e: &Estimate) -> String {
    let m = &e.engine;
    let mut parts = [
        (
            m.explored_bytes,
            format!(
                "a summary of each of up to {} candidates",
                thousands(m.candidates)
            ),
        ),
        (
            m.space_bytes,
            format!("the space's {} configurations", thousands(m.configurations)),
        ),
        (m.memo_bytes, "the memo of operator estimates".to_string()),
        (
            m.solver_bytes,
            format!("layer-schedule solvers on {} thread(s)", m.threads),
        ),
        (
            m.placement_bytes,
            format!("placement programs on {} thread(s)", m.threads),
        ),
        (m.graphs_bytes, "the layer graphs".to_string()),
        (
            m.schedule_memo_bytes,
            "the memo of layer schedules".to_string(),
        ),
        (m.bounds_bytes, "a proven search's bounds".to_string()),
        (m.candidate_bytes, "the candidate in flight".to_string()),
        (e.cost_models_bytes, "the cost-model plugins".to_string()),
        (e.results_bytes, "the result files".to_string()),
    ];
    parts.sort_by_key(|p| std::cmp::Reverse(p.0));
    let listed: Vec<String> = parts
        .iter()
        .filter(|p| p.0 > 0)
        .take(4)
        .map(|(b, what)| format!("{what} {}", format_bytes(*b)))
        .collect();
    format!("{} ({})", format_bytes(e.total_bytes), listed.join(", "))
}

/// Refuses `spec` if `e` is above `budget_bytes`, located at the search's axes (what makes
/// a search large) and saying what to change.
pub fn check(spec: &Spec, e: &Estimate, budget_bytes: u64) -> Result<(), Vec<Diagnostic>> {
    if e.total_bytes <= budget_bytes {
        return Ok(());
    }
    let message = format!(
        "this search may need up to {}, above the memory budget of {}",
        describe(e),
        format_bytes(budget_bytes)
    );
    let help = "narrow the search's axes (fewer configurations), use fewer threads, or raise the budget (`--memory-budget`; the daemon's `search_memory_bytes`)".to_string();
    Err(vec![spec.diagnostic_at(&["search"], message, Some(help))])
}
