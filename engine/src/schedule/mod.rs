//! The layer schedule (`docs/reference.md` §1.4): for one layer's forward or backward graph
//! on one accelerator, choose for every operator single-core or all-cores mode, its core
//! and its start, minimising the makespan.
//!
//! Semantics (the reference's, spelled out in the fixtures README): an operator runs on one
//! core of its type (`single`) or on all cores of its type (`parallel`); a parallel
//! operator runs alone; otherwise at most `tensor_cores` tensor-core operators and
//! `vector_cores` vector-core operators overlap; a fused operator occupies a tensor core
//! and a vector core at once; `none` operators take no time and no core but keep their
//! precedence paths. archplace adds one resource the reference lacks: `link` operators
//! (tensor-parallel all-reduces) use the network, one at a time, and no core — they may
//! overlap anything. And one bound the reference lacks: the chip's cores share its
//! off-chip memory, so a series part takes at least the sum of its operators' memory
//! times ([`Task::memory`], when the latency model reports them). The reference prices
//! every operator as if it had the whole memory bandwidth, so two memory-bound operators
//! side by side on two cores took the time of one; here they take the time of both. Where
//! that floor binds, the operators keep their places and durations and the part ends at the
//! floor (a fluid model of the sharing: no schedule can move the part's bytes sooner, and
//! the durations the latency model gives for one operator alone stay what the checker
//! checks).
//!
//! How it is solved, cheapest first, for each *series part* of the instance — the operators
//! between two cuts that every operator before precedes every operator after (a
//! tensor-parallel all-reduce is one), which run one part after another, so the optimum is
//! the sum of the parts' optima:
//! 1. a lower bound — the critical path; the work of each core type where a parallel
//!    operator's time counts in full because it runs alone; and the two combined along
//!    every path;
//! 2. a list schedule with mode choice, improved by flipping modes; when it meets the
//!    bound it is optimal and no MIP is built;
//! 3. otherwise a MIP (good_lp + HiGHS) warm-started with that schedule: order variables
//!    only for pairs that no path orders and that can conflict (no transitivity rows: the
//!    start times imply them, and they measured slower), big-M from the time windows, core-assignment variables only for a
//!    core type whose operators can outnumber its cores (the width of their precedence
//!    order exceeds the core count). Always under a time limit; a schedule that hit it is
//!    reported with its gap, not as optimal.

// Operators are indices into several parallel arrays; index loops read best here.
#![allow(clippy::needless_range_loop)]

// In their order: each imports only those before it (a tidy test checks it); one per
// group, as rustfmt would sort consecutive declarations.
mod prep;

mod bounds;

mod heuristic;

mod mip;

mod check;

mod skeleton;

pub use check::check;
use check::place;
pub(crate) use prep::Prep;
pub use skeleton::Skeleton;

use crate::options::ScheduleOptions;
use serde::Serialize;
use std::sync::OnceLock;
use std::time::Instant;

/// What an operator occupies while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Tensor,
    Vector,
    /// A tensor core and a vector core at once.
    Fused,
    /// The network links; no core.
    Link,
    /// Takes no time and nothing.
    None,
}

impl Resource {
    pub(crate) fn uses_tensor(self) -> bool {
        matches!(self, Resource::Tensor | Resource::Fused)
    }
    pub(crate) fn uses_vector(self) -> bool {
        matches!(self, Resource::Vector | Resource::Fused)
    }
    pub(crate) fn is_core(self) -> bool {
        matches!(self, Resource::Tensor | Resource::Vector | Resource::Fused)
    }
}

/// One operator: its resource and its duration on one core and on all cores of its type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Task {
    pub resource: Resource,
    pub single: f64,
    pub parallel: f64,
    /// Seconds its off-chip memory traffic takes with the chip's whole memory bandwidth,
    /// in the mode that moves the least; 0 when unknown (or for link operators, which
    /// the network bounds).
    pub memory: f64,
}

impl Task {
    /// An operator with no memory time known.
    pub fn new(resource: Resource, single: f64, parallel: f64) -> Task {
        Task {
            resource,
            single,
            parallel,
            memory: 0.0,
        }
    }
}

/// A scheduling problem.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Instance {
    pub tensor_cores: u32,
    pub vector_cores: u32,
    pub tasks: Vec<Task>,
    /// `(a, b)`: `a` finishes before `b` starts.
    pub edges: Vec<(usize, usize)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Single,
    Parallel,
}

/// Where and when one operator runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Placement {
    pub mode: Mode,
    pub start: f64,
    pub finish: f64,
    /// The tensor core of a single-mode tensor or fused operator.
    pub tensor_core: Option<u32>,
    /// The vector core of a single-mode vector or fused operator.
    pub vector_core: Option<u32>,
}

/// How the schedule's quality is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// The list schedule met the lower bound: optimal, no MIP.
    Bounds,
    /// Solved by the MIP.
    Mip,
}

/// A schedule and what is known of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Schedule {
    pub makespan: f64,
    /// The sum of the operators' memory times: the least time the chip's memory takes to
    /// move the layer's bytes. The makespan is at least this.
    pub memory_seconds: f64,
    /// How much of the makespan the memory floor adds to the cores' schedule (0 where the
    /// cores, not the memory, set every part's time).
    pub memory_bound_seconds: f64,
    pub lower_bound: f64,
    pub optimal: bool,
    /// Relative gap between the makespan and the best bound (0 when optimal).
    pub gap: f64,
    pub method: Method,
    /// The MIP's wall-clock safety net fired: this schedule depends on the machine.
    pub hit_time_limit: bool,
    /// The MIP stopped at its node limit (reproducibly) before proving optimality.
    pub hit_node_limit: bool,
    /// MIPs this call ran: fewer than the parts a MIP solved where a [`CoresTrace`] knew
    /// them already ([`solve_with`]).
    #[serde(skip)]
    pub mips_run: usize,
    pub solve_seconds: f64,
    pub placements: Vec<Placement>,
}

impl Schedule {
    /// Average fraction of the tensor and vector cores busy over the makespan.
    pub fn utilisation(&self, inst: &Instance) -> (f64, f64) {
        if self.makespan <= 0.0 {
            return (0.0, 0.0);
        }
        let (mut tc, mut vc) = (0.0, 0.0);
        for (t, p) in inst.tasks.iter().zip(&self.placements) {
            let d = p.finish - p.start;
            let share = |cores: u32| {
                if p.mode == Mode::Parallel {
                    d
                } else {
                    d / cores.max(1) as f64
                }
            };
            if t.resource.uses_tensor() {
                tc += share(inst.tensor_cores);
            }
            if t.resource.uses_vector() {
                vc += share(inst.vector_cores);
            }
        }
        (tc / self.makespan, vc / self.makespan)
    }

    /// The time the network links are busy while no core is: the communication the
    /// schedule leaves exposed (all of it when collectives run alone; what computation
    /// does not hide when they may overlap it).
    pub fn exposed_link_seconds(&self, inst: &Instance) -> f64 {
        let intervals = |link: bool| -> Vec<(f64, f64)> {
            let mut v: Vec<(f64, f64)> = inst
                .tasks
                .iter()
                .zip(&self.placements)
                .filter(|(t, p)| {
                    p.finish > p.start
                        && match t.resource {
                            Resource::Link => link,
                            Resource::None => false,
                            _ => !link,
                        }
                })
                .map(|(_, p)| (p.start, p.finish))
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        };
        let compute = merged(intervals(false));
        merged(intervals(true))
            .into_iter()
            .map(|(a, b)| {
                let covered: f64 = compute
                    .iter()
                    .map(|&(c, d)| (b.min(d) - a.max(c)).max(0.0))
                    .sum();
                (b - a - covered).max(0.0)
            })
            .sum()
    }
}

/// `sorted` (by start) intervals merged where they overlap or touch.
fn merged(sorted: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
    for (a, b) in sorted {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    #[error("operator {0}: latencies must be finite and not negative (single {1}, parallel {2})")]
    BadLatency(usize, f64, f64),
    #[error("operator {0}: its memory time must be finite and not negative ({1})")]
    BadMemory(usize, f64),
    #[error("the operators' latencies add up to more than a float can hold")]
    Overflow,
    #[error("edge {0} → {1} names no operator")]
    BadEdge(usize, usize),
    #[error("the precedence graph has a cycle")]
    Cycle,
    #[error(
        "a core operator needs at least one core of its type (tensor cores {0}, vector cores {1})"
    )]
    NoCores(u32, u32),
    #[error("the MIP solver failed: {0}")]
    Solver(String),
}

/// Solves `inst`.
pub fn solve(inst: &Instance, options: &ScheduleOptions) -> Result<Schedule, ScheduleError> {
    solve_with(inst, options, &CoresTrace::default())
}

/// What solving an instance's cores finds, whatever its memory times: per series part, its
/// lower bound, its list schedule, and — the first time a memory floor below that list
/// schedule asks for it — the rest of its solution (the MIP's, if one ran). Instances that
/// differ only in their memory times (chips that differ only in their buffer) have the
/// same cores' solutions: sharing a trace, they solve each part's cores once. The memory
/// floor only decides whether the list schedule settles a part (it does when the floor
/// reaches it) and lifts the part's makespan, so a schedule solved through a trace is,
/// field for field, the one a fresh [`solve`] returns (the solver is deterministic: node
/// limits; a part the wall-clock safety net stopped is not kept). A trace must only be
/// shared by instances whose cores, operators, durations and dependencies are the same.
#[derive(Default)]
pub struct CoresTrace {
    parts: OnceLock<Vec<PartTrace>>,
}

/// One series part's entry in a [`CoresTrace`]: nothing for a part of one operator (its
/// list schedule meets its bound at once: nothing to save, and most parts are such).
enum PartTrace {
    One,
    Many(Box<Traced>),
}

/// What a [`CoresTrace`] keeps of a part of several operators.
struct Traced {
    lower: f64,
    listed: (f64, Vec<f64>, Vec<Mode>),
    /// The part's cores' schedule where the memory floor stays below the list schedule.
    rest: OnceLock<Part>,
}

impl Traced {
    fn of(p: &Prep) -> Traced {
        Traced {
            lower: p.lower_bound(),
            listed: heuristic::best(p),
            rest: OnceLock::new(),
        }
    }
}

/// Solves `inst`, taking what `trace` already knows of its cores' schedules and adding to
/// it what this instance solves ([`CoresTrace`]): the same schedule as [`solve`], with
/// [`Schedule::mips_run`] counting only the MIPs this call ran.
pub fn solve_with(
    inst: &Instance,
    options: &ScheduleOptions,
    trace: &CoresTrace,
) -> Result<Schedule, ScheduleError> {
    let started = Instant::now();
    let prep = Prep::new(inst)?;
    let m = prep.len();
    let (mut starts, mut modes) = (Vec::with_capacity(m), Vec::with_capacity(m));
    let (mut span, mut lower, mut bound) = (0.0, 0.0, 0.0);
    let (mut memory, mut memory_bound) = (0.0, 0.0);
    let (mut optimal, mut mip, mut hit_time, mut hit_nodes) = (true, false, false, false);
    let mut mips_run = 0;
    if m > 0 {
        let ranges = prep.series_parts();
        let parts: Vec<Prep> = ranges.into_iter().map(|r| prep.slice(r)).collect();
        let traced = trace.parts.get_or_init(|| {
            parts
                .iter()
                .map(|p| {
                    if p.len() == 1 {
                        PartTrace::One
                    } else {
                        PartTrace::Many(Box::new(Traced::of(p)))
                    }
                })
                .collect()
        });
        if traced.len() != parts.len() {
            return Err(ScheduleError::Solver(
                "a cores trace shared by instances of different shapes".into(),
            ));
        }
        for (p, t) in parts.iter().zip(traced) {
            let (part, ran) = match t {
                PartTrace::One => solve_part(p, options, &Traced::of(p))?,
                PartTrace::Many(t) => solve_part(p, options, t)?,
            };
            mips_run += usize::from(ran);
            starts.extend(part.starts.iter().map(|s| s + span));
            modes.extend(part.modes);
            span += part.makespan;
            memory += part.memory;
            memory_bound += part.memory_bound;
            lower += part.lower;
            bound += part.bound;
            optimal &= part.optimal;
            mip |= part.mip;
            hit_time |= part.hit_time_limit;
            hit_nodes |= part.hit_node_limit;
        }
    }
    let gap = if optimal || span <= 0.0 {
        0.0
    } else {
        ((span - bound) / span).max(0.0)
    };
    Ok(Schedule {
        makespan: span,
        memory_seconds: memory,
        memory_bound_seconds: memory_bound,
        lower_bound: lower,
        optimal,
        gap,
        method: if mip { Method::Mip } else { Method::Bounds },
        hit_time_limit: hit_time,
        hit_node_limit: hit_nodes && !optimal,
        mips_run,
        solve_seconds: started.elapsed().as_secs_f64(),
        placements: place(inst, &prep, &starts, &modes),
    })
}

/// The steps of each weight the path-and-work bound tries in [`makespan_lower_bound`]: on
/// the GPT-3 example's 29,360 chips, 2 steps bound them in 25 s where the solver's 20 take
/// 46 s, and a proven search evaluates 508 chips instead of 502 (1 step: 566).
const UNSOLVED_PATH_WORK_STEPS: usize = 2;

/// A lower bound on the makespan of every schedule [`solve`] returns for `inst`, without
/// solving it: per series part, the bounds [`solve`] starts from (critical path, each core
/// type's work, along every path) held to the part's memory floor, summed over the parts
/// — [`solve`]'s makespan is the sum of the parts' and each part's is at least both. A
/// few microseconds for a layer; what a proven search bounds candidates with.
pub fn makespan_lower_bound(inst: &Instance) -> Result<f64, ScheduleError> {
    let prep = Prep::new(inst)?;
    if prep.len() == 0 {
        return Ok(0.0);
    }
    Ok(prep
        .series_parts()
        .into_iter()
        .map(|r| {
            let part = prep.slice(r);
            let floor: f64 = part.memory.iter().sum();
            part.lower_bound_with(UNSOLVED_PATH_WORK_STEPS).max(floor)
        })
        .sum())
}

/// The schedule of one series part ([`Prep::series_parts`]), its starts from 0.
#[derive(Clone)]
struct Part {
    makespan: f64,
    starts: Vec<f64>,
    modes: Vec<Mode>,
    /// The part's lower bound, and the best bound known (the MIP's, if it ran).
    lower: f64,
    bound: f64,
    optimal: bool,
    mip: bool,
    hit_time_limit: bool,
    hit_node_limit: bool,
    /// The part's memory floor (the sum of its memory times), and how much it adds to the
    /// cores' schedule.
    memory: f64,
    memory_bound: f64,
}

impl Part {
    /// This part held to the memory floor `floor`: the makespan is at least the floor, and
    /// so are both bounds (every schedule is); the part is optimal when the floor binds or
    /// the cores' schedule was optimal already (the least of `max(cores, floor)` over the
    /// schedules is `max(least cores, floor)`).
    fn floored(mut self, floor: f64) -> Part {
        self.memory = floor;
        if floor > self.makespan {
            self.memory_bound = floor - self.makespan;
            self.makespan = floor;
            self.optimal = true;
            self.hit_node_limit = false;
        }
        self.lower = self.lower.max(floor);
        self.bound = if self.optimal {
            self.makespan
        } else {
            self.bound.max(floor)
        };
        self
    }
}

/// The list schedule `(span, starts, modes)` as the part's schedule if the bound `lower`
/// settles it: proven optimal when it meets the bound, accepted (with its gap) when it is
/// within the accepted gap or no MIP may be built.
fn settled(
    listed: &(f64, Vec<f64>, Vec<Mode>),
    lower: f64,
    options: &ScheduleOptions,
    no_mip: bool,
) -> Option<Part> {
    let span = listed.0;
    let optimal = span <= lower + 1e-9 * span.max(1e-300);
    let accepted =
        no_mip || (options.relative_gap > 0.0 && span - lower <= options.relative_gap * span);
    (optimal || accepted).then(|| listed_part(listed, lower, optimal))
}

/// The list schedule as the part's schedule, `optimal` or not.
fn listed_part(
    (span, starts, modes): &(f64, Vec<f64>, Vec<Mode>),
    lower: f64,
    optimal: bool,
) -> Part {
    Part {
        makespan: *span,
        starts: starts.clone(),
        modes: modes.clone(),
        lower,
        bound: if optimal { *span } else { lower },
        optimal,
        mip: false,
        hit_time_limit: false,
        hit_node_limit: false,
        memory: 0.0,
        memory_bound: 0.0,
    }
}

/// The part's schedule held to its memory floor ([`Part::floored`]), and whether a MIP ran
/// for it here. The bounds and the list schedule come from `trace`; a list schedule within
/// the floor settles the part (no schedule of the cores can make it shorter); otherwise the
/// floor plays no part in the cores' schedule, which `trace` keeps once solved.
fn solve_part(
    prep: &Prep,
    options: &ScheduleOptions,
    trace: &Traced,
) -> Result<(Part, bool), ScheduleError> {
    let floor: f64 = prep.memory.iter().sum();
    let no_mip = options.heuristic_only || trace.listed.0 <= floor;
    if let Some(part) = settled(&trace.listed, trace.lower, options, no_mip) {
        return Ok((part.floored(floor), false));
    }
    if let Some(part) = trace.rest.get() {
        return Ok((part.clone().floored(floor), false));
    }
    let part = solve_rest(prep, options, trace.lower, &trace.listed)?;
    let ran = part.mip;
    // A part the wall-clock safety net stopped depends on the machine: not kept.
    if !part.hit_time_limit {
        let _ = trace.rest.set(part.clone());
    }
    Ok((part.floored(floor), ran))
}

/// What follows a list schedule that the bounds did not settle: the bound by the modes,
/// then a deeper list schedule, and only then the MIP warm-started with it.
fn solve_rest(
    prep: &Prep,
    options: &ScheduleOptions,
    lower: f64,
    listed: &(f64, Vec<f64>, Vec<Mode>),
) -> Result<Part, ScheduleError> {
    // Before a MIP: the bound by the modes, which often meets the list schedule.
    let lower = match prep.mode_bound() {
        Some(b) if b > lower => b.min(listed.0),
        _ => lower,
    };
    if let Some(part) = settled(listed, lower, options, false) {
        return Ok(part);
    }
    // Then a deeper list-schedule search (pairs of mode flips).
    let deeper = heuristic::deeper(prep, listed.clone());
    if let Some(part) = settled(&deeper, lower, options, false) {
        return Ok(part);
    }
    let (h_span, h_starts, h_modes) = deeper;
    let r = mip::solve(prep, lower, h_span, (&h_starts, &h_modes), options)?;
    let (span, starts, modes) = if r.makespan < h_span {
        (r.makespan, r.starts, r.modes)
    } else {
        (h_span, h_starts, h_modes)
    };
    let bound = r.bound.max(lower).min(span);
    let optimal = r.optimal || span - bound <= 1e-9 * span.max(1e-300);
    Ok(Part {
        makespan: span,
        starts,
        modes,
        lower,
        bound: if optimal { span } else { bound },
        optimal,
        mip: true,
        hit_time_limit: r.hit_time_limit,
        hit_node_limit: r.hit_node_limit && !optimal,
        memory: 0.0,
        memory_bound: 0.0,
    })
}

#[cfg(test)]
mod tests;
