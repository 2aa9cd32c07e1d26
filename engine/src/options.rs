//! Options of the search and of its layer schedules: how hard the solver works on one
//! layer and when a schedule is good enough. Inputs (a spec's `[search]`), below every
//! computation that takes them.

use serde::Serialize;

/// The default wall-clock limit of one layer-schedule MIP in a search: a safety net that
/// the node limit keeps from firing (the reference stopped every MIP at 0.1 s, which made
/// results depend on the machine's load); when it fires, the results count it
/// (`work.mip_time_limit_hits`) and say the search was not reproducible.
pub const DEFAULT_SCHEDULE_TIME_LIMIT_SECONDS: f64 = 10.0;

/// The most branch-and-bound nodes one layer-schedule MIP may explore: in effect no limit
/// (a million takes minutes on one layer); what `archplace schedule` uses to prove a
/// schedule optimal.
pub const MAX_NODE_LIMIT: u64 = 1_000_000;

/// Branch-and-bound nodes of one layer-schedule MIP in a search, by default: the work
/// limit that makes a search's result independent of the machine, its load and its thread
/// count. With the root kept cheap (see `schedule/mip.rs`) it is as fast as the
/// reference's 0.1 s wall-clock limit on the default spec and faster on BERT-large; see
/// `schedule_node_limit` in docs/spec.md for the measurements.
pub const DEFAULT_NODE_LIMIT: u64 = 100;

/// Solver settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ScheduleOptions {
    /// Work limit of one MIP: branch-and-bound nodes. Deterministic: the same instance
    /// stops at the same schedule on any machine under any load.
    pub node_limit: u64,
    /// Wall-clock limit of one MIP: a safety net (HiGHS cannot be interrupted otherwise),
    /// reported when it fires because what it stops at depends on the machine.
    pub time_limit_seconds: f64,
    /// Build no MIP: return the list schedule with its gap to the bound.
    pub heuristic_only: bool,
    /// Accept a schedule within this relative gap of the best bound (0: prove optimality).
    /// Such a schedule is reported with its gap, not as optimal.
    pub relative_gap: f64,
}

impl Default for ScheduleOptions {
    fn default() -> Self {
        ScheduleOptions {
            node_limit: MAX_NODE_LIMIT,
            time_limit_seconds: DEFAULT_SCHEDULE_TIME_LIMIT_SECONDS,
            heuristic_only: false,
            relative_gap: 0.0,
        }
    }
}
