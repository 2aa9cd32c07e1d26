//! The layer schedule (design doc §7): for one layer's forward or backward operator graph
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
//! overlap anything.
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

mod heuristic;
mod mip;

use serde::Serialize;
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
    fn uses_tensor(self) -> bool {
        matches!(self, Resource::Tensor | Resource::Fused)
    }
    fn uses_vector(self) -> bool {
        matches!(self, Resource::Vector | Resource::Fused)
    }
    fn is_core(self) -> bool {
        matches!(self, Resource::Tensor | Resource::Vector | Resource::Fused)
    }
}

/// One operator: its resource and its duration on one core and on all cores of its type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Task {
    pub resource: Resource,
    pub single: f64,
    pub parallel: f64,
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
    pub lower_bound: f64,
    pub optimal: bool,
    /// Relative gap between the makespan and the best bound (0 when optimal).
    pub gap: f64,
    pub method: Method,
    /// The MIP's wall-clock safety net fired: this schedule depends on the machine.
    pub hit_time_limit: bool,
    /// The MIP stopped at its node limit (reproducibly) before proving optimality.
    pub hit_node_limit: bool,
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
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    #[error("operator {0}: latencies must be finite and not negative (single {1}, parallel {2})")]
    BadLatency(usize, f64, f64),
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

/// The most branch-and-bound nodes one layer-schedule MIP may explore: in effect no limit
/// (a million takes minutes on one layer); what `archplace schedule` uses to prove a
/// schedule optimal.
pub const MAX_NODE_LIMIT: u64 = 1_000_000;

/// Branch-and-bound nodes of one layer-schedule MIP in a search, by default: the work
/// limit that makes a search's result independent of the machine, its load and its thread
/// count (issue 16). With the root kept cheap (see `mip.rs`) it is as fast as the
/// reference's 0.1 s wall-clock limit on the default spec and faster on BERT-large; see
/// `schedule_node_limit` in docs/spec.md for the measurements.
pub const DEFAULT_NODE_LIMIT: u64 = 100;

/// Solver settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Options {
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

impl Default for Options {
    fn default() -> Self {
        Options {
            node_limit: MAX_NODE_LIMIT,
            time_limit_seconds: 10.0,
            heuristic_only: false,
            relative_gap: 0.0,
        }
    }
}

/// The instance restricted to operators that take time, with precedence through the
/// `none` operators kept.
pub(crate) struct Prep {
    /// Original index of each real operator.
    pub real: Vec<usize>,
    pub res: Vec<Resource>,
    pub single: Vec<f64>,
    pub parallel: Vec<f64>,
    /// Whether parallel mode can ever help (it is shorter than single mode).
    pub can_parallel: Vec<bool>,
    /// reach[i][j]: a path leads from real i to real j.
    pub reach: Vec<Vec<bool>>,
    /// Precedence between real operators, transitively reduced.
    pub edges: Vec<(usize, usize)>,
    pub tc: u32,
    pub vc: u32,
}

impl Prep {
    fn new(inst: &Instance) -> Result<Prep, ScheduleError> {
        let n = inst.tasks.len();
        for (i, t) in inst.tasks.iter().enumerate() {
            let ok = |x: f64| x.is_finite() && x >= 0.0;
            if t.resource != Resource::None && !(ok(t.single) && ok(t.parallel)) {
                return Err(ScheduleError::BadLatency(i, t.single, t.parallel));
            }
            if (t.resource.uses_tensor() && inst.tensor_cores == 0)
                || (t.resource.uses_vector() && inst.vector_cores == 0)
            {
                return Err(ScheduleError::NoCores(inst.tensor_cores, inst.vector_cores));
            }
        }
        let mut succ = vec![Vec::new(); n];
        let mut indeg = vec![0; n];
        for &(a, b) in &inst.edges {
            if a >= n || b >= n {
                return Err(ScheduleError::BadEdge(a, b));
            }
            succ[a].push(b);
            indeg[b] += 1;
        }
        let mut ready: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
        ready.reverse();
        let mut topo = Vec::with_capacity(n);
        while let Some(u) = ready.pop() {
            topo.push(u);
            for &v in &succ[u] {
                indeg[v] -= 1;
                if indeg[v] == 0 {
                    ready.push(v);
                }
            }
        }
        if topo.len() != n {
            return Err(ScheduleError::Cycle);
        }
        // Full reachability, in reverse topological order.
        let mut full = vec![vec![false; n]; n];
        for &u in topo.iter().rev() {
            let mut row = vec![false; n];
            for &v in &succ[u] {
                row[v] = true;
                for (r, &x) in row.iter_mut().zip(&full[v]) {
                    *r |= x;
                }
            }
            full[u] = row;
        }
        let real: Vec<usize> = topo
            .iter()
            .copied()
            .filter(|&i| inst.tasks[i].resource != Resource::None)
            .collect();
        let m = real.len();
        let reach: Vec<Vec<bool>> = real
            .iter()
            .map(|&i| real.iter().map(|&j| full[i][j]).collect())
            .collect();
        let mut edges = Vec::new();
        for i in 0..m {
            for j in 0..m {
                if reach[i][j] && !(0..m).any(|k| reach[i][k] && reach[k][j]) {
                    edges.push((i, j));
                }
            }
        }
        let res: Vec<Resource> = real.iter().map(|&i| inst.tasks[i].resource).collect();
        let single: Vec<f64> = real.iter().map(|&i| inst.tasks[i].single).collect();
        let parallel: Vec<f64> = real
            .iter()
            .map(|&i| {
                if inst.tasks[i].resource.is_core() {
                    inst.tasks[i].parallel
                } else {
                    inst.tasks[i].single
                }
            })
            .collect();
        let can_parallel = (0..m)
            .map(|i| res[i].is_core() && parallel[i] < single[i])
            .collect();
        Ok(Prep {
            real,
            res,
            single,
            parallel,
            can_parallel,
            reach,
            edges,
            tc: inst.tensor_cores,
            vc: inst.vector_cores,
        })
    }

    fn len(&self) -> usize {
        self.real.len()
    }

    /// The instance cut into parts that run one after another: a cut falls between two
    /// operators of the topological order wherever every operator before it precedes every
    /// operator after it (a transformer block's tensor-parallel all-reduces and norms are
    /// such cuts). Such a split is a prefix of every topological order, so checking the
    /// prefixes of this one finds them all. In any schedule each part ends before the next
    /// begins, so the optimum is the sum of the parts' optima: each is solved alone, with
    /// a smaller MIP where one is needed.
    fn series_parts(&self) -> Vec<std::ops::Range<usize>> {
        let m = self.len();
        let mut parts = Vec::new();
        let mut start = 0;
        for k in 1..m {
            if (0..k).all(|a| (k..m).all(|b| self.reach[a][b])) {
                parts.push(start..k);
                start = k;
            }
        }
        parts.push(start..m);
        parts
    }

    /// The operators of `r` (a range of the topological order) as an instance of their own.
    fn slice(&self, r: std::ops::Range<usize>) -> Prep {
        let reach = self.reach[r.clone()]
            .iter()
            .map(|row| row[r.clone()].to_vec())
            .collect();
        let edges = self
            .edges
            .iter()
            .filter(|&&(a, b)| r.contains(&a) && r.contains(&b))
            .map(|&(a, b)| (a - r.start, b - r.start))
            .collect();
        Prep {
            real: self.real[r.clone()].to_vec(),
            res: self.res[r.clone()].to_vec(),
            single: self.single[r.clone()].to_vec(),
            parallel: self.parallel[r.clone()].to_vec(),
            can_parallel: self.can_parallel[r].to_vec(),
            reach,
            edges,
            tc: self.tc,
            vc: self.vc,
        }
    }

    fn comparable(&self, i: usize, j: usize) -> bool {
        self.reach[i][j] || self.reach[j][i]
    }

    /// Shortest duration of operator `i`.
    fn min_duration(&self, i: usize) -> f64 {
        if self.can_parallel[i] {
            self.parallel[i]
        } else {
            self.single[i]
        }
    }

    fn duration(&self, i: usize, mode: Mode) -> f64 {
        match mode {
            Mode::Single => self.single[i],
            Mode::Parallel => self.parallel[i],
        }
    }

    /// Earliest start (head) and time after finish (tail) of each operator with shortest
    /// durations.
    fn heads_tails(&self) -> (Vec<f64>, Vec<f64>) {
        let m = self.len();
        let mut head = vec![0.0f64; m];
        let mut tail = vec![0.0f64; m];
        // Real operators are numbered in topological order, so every edge goes a → b > a.
        for j in 0..m {
            for &(a, b) in self.edges.iter().filter(|e| e.1 == j) {
                head[b] = head[b].max(head[a] + self.min_duration(a));
            }
        }
        for i in (0..m).rev() {
            for &(a, b) in self.edges.iter().filter(|e| e.0 == i) {
                tail[a] = tail[a].max(tail[b] + self.min_duration(b));
            }
        }
        (head, tail)
    }

    /// A lower bound on the makespan.
    fn lower_bound(&self) -> f64 {
        let m = self.len();
        let (head, _) = self.heads_tails();
        let critical = (0..m)
            .map(|i| head[i] + self.min_duration(i))
            .fold(0.0, f64::max);
        // Parallel operators run alone, so T ≥ Σ_parallel p + max(W_tc / tc, W_vc / vc)
        // ≥ Σ_i min(p_i, λ a_i + (1 − λ) b_i) for every λ in [0, 1].
        let a: Vec<f64> = (0..m)
            .map(|i| {
                if self.res[i].uses_tensor() {
                    self.single[i] / self.tc as f64
                } else {
                    0.0
                }
            })
            .collect();
        let b: Vec<f64> = (0..m)
            .map(|i| {
                if self.res[i].uses_vector() {
                    self.single[i] / self.vc as f64
                } else {
                    0.0
                }
            })
            .collect();
        let work = |lambda: f64| -> f64 {
            (0..m)
                .filter(|&i| self.res[i].is_core())
                .map(|i| {
                    let w = lambda * a[i] + (1.0 - lambda) * b[i];
                    if self.can_parallel[i] {
                        w.min(self.parallel[i])
                    } else {
                        w
                    }
                })
                .sum()
        };
        let mut lambdas = vec![0.0, 1.0];
        for i in 0..m {
            // Where p_i = λ a_i + (1 − λ) b_i.
            let denom = a[i] - b[i];
            if denom.abs() > 0.0 {
                let l = (self.parallel[i] - b[i]) / denom;
                if (0.0..=1.0).contains(&l) {
                    lambdas.push(l);
                }
            }
        }
        let work_bound = lambdas.into_iter().map(work).fold(0.0, f64::max);
        critical.max(work_bound).max(self.path_work_bound(&a, &b))
    }

    /// The most operators whose modes [`Prep::mode_bound`] enumerates (2^16 assignments, a
    /// few milliseconds: computed only before a MIP, which costs more).
    const MODE_BOUND_MAX_CHOICES: usize = 16;

    /// A lower bound by the modes: for each assignment of modes to the operators for which
    /// all cores are faster, parallel operators run alone (no core operator beside them), so
    /// the makespan is at least the sum of their durations plus the single-core operators
    /// of any path (links excluded: they may run beside a parallel operator), plus each
    /// core type's single-core work over its cores; and at least the critical path with
    /// those durations, and the links one at a time. The bound is the least of these over
    /// every assignment (an operator for which all cores are not faster only loses by
    /// running on them, so it is single here). Beyond [`Self::MODE_BOUND_MAX_CHOICES`]
    /// operators with a choice, the shortest of them count as taking no time (a relaxation:
    /// an instance with shorter operators has no longer optimum), which loses at most their
    /// durations.
    fn mode_bound(&self) -> Option<f64> {
        self.mode_bound_with(Self::MODE_BOUND_MAX_CHOICES)
    }

    /// [`Prep::mode_bound`] enumerating the modes of at most `most` operators.
    fn mode_bound_with(&self, most: usize) -> Option<f64> {
        let m = self.len();
        let mut choices: Vec<usize> = (0..m).filter(|&i| self.can_parallel[i]).collect();
        let mut ignored = vec![false; m];
        if choices.len() > most {
            choices.sort_by(|&a, &b| self.single[b].total_cmp(&self.single[a]).then(a.cmp(&b)));
            for &i in &choices[most..] {
                ignored[i] = true;
            }
            choices.truncate(most);
        }
        if choices.is_empty() {
            return None;
        }
        let link: f64 = (0..m)
            .filter(|&i| self.res[i] == Resource::Link)
            .map(|i| self.single[i])
            .sum();
        let preds: Vec<Vec<usize>> = (0..m)
            .map(|j| {
                self.edges
                    .iter()
                    .filter(|e| e.1 == j)
                    .map(|e| e.0)
                    .collect()
            })
            .collect();
        let windows = Windows::new(self);
        let mut parallel = vec![false; m];
        let mut on_path = vec![0.0f64; m];
        let mut critical = vec![0.0f64; m];
        let mut best = f64::INFINITY;
        for mask in 0u32..(1u32 << choices.len()) {
            let mut par_sum = 0.0;
            for (bit, &i) in choices.iter().enumerate() {
                parallel[i] = mask & (1 << bit) != 0;
                if parallel[i] {
                    par_sum += self.parallel[i];
                }
            }
            if par_sum >= best {
                continue;
            }
            let (mut tc_work, mut vc_work) = (0.0, 0.0);
            let (mut path, mut crit) = (0.0f64, 0.0f64);
            for j in 0..m {
                let (mut p_in, mut c_in) = (0.0f64, 0.0f64);
                for &a in &preds[j] {
                    p_in = p_in.max(on_path[a]);
                    c_in = c_in.max(critical[a]);
                }
                if ignored[j] {
                    on_path[j] = p_in;
                    critical[j] = c_in;
                    continue;
                }
                let core_single = self.res[j].is_core() && !parallel[j];
                if core_single {
                    if self.res[j].uses_tensor() {
                        tc_work += self.single[j];
                    }
                    if self.res[j].uses_vector() {
                        vc_work += self.single[j];
                    }
                }
                let d = if parallel[j] {
                    self.parallel[j]
                } else {
                    self.single[j]
                };
                let w = if core_single { self.single[j] } else { 0.0 };
                on_path[j] = p_in + w;
                critical[j] = c_in + d;
                path = path.max(on_path[j]);
                crit = crit.max(critical[j]);
            }
            let mut bound = (par_sum
                + path
                    .max(tc_work / self.tc.max(1) as f64)
                    .max(vc_work / self.vc.max(1) as f64))
            .max(crit)
            .max(link);
            if bound < best
                && let Some(w) = &windows
            {
                let singles = (0..m)
                    .filter(|&j| !ignored[j] && self.res[j].is_core() && !parallel[j])
                    .fold(0u128, |b, j| b | 1 << j);
                for (bit, &pj) in choices.iter().enumerate() {
                    if mask & (1 << bit) != 0 {
                        bound = bound.max(par_sum + w.around(pj, singles, &self.single));
                        if bound >= best {
                            break;
                        }
                    }
                }
            }
            best = best.min(bound);
        }
        Some(best)
    }

    /// Parallel operators run alone, so for every path C:
    /// `T ≥ Σ_parallel p + max(Σ_{single core ops on C} l, W_tc / tc, W_vc / vc)`. A convex
    /// combination (μ_path, μ_tc, μ_vc) of the three turns the choice of modes into
    /// `Σ_j min(p_j, r_j)` plus the longest path of what lying on the path adds; the best
    /// μ of a grid is kept. (Links may overlap parallel operators: they count only in
    /// their own bound, one all-reduce at a time.)
    fn path_work_bound(&self, a: &[f64], b: &[f64]) -> f64 {
        let m = self.len();
        let link: f64 = (0..m)
            .filter(|&i| self.res[i] == Resource::Link)
            .map(|i| self.single[i])
            .sum();
        let steps = 20;
        let mut best = link;
        let mut w = vec![0.0f64; m];
        let mut longest = vec![0.0f64; m];
        for ia in 0..=steps {
            for ib in 0..=steps - ia {
                let mu_path = ia as f64 / steps as f64;
                let mu_tc = ib as f64 / steps as f64;
                let mu_vc = 1.0 - mu_path - mu_tc;
                let mut base = 0.0;
                for j in 0..m {
                    if !self.res[j].is_core() {
                        w[j] = 0.0;
                        continue;
                    }
                    let r = mu_tc * a[j] + mu_vc * b[j];
                    let off = if self.can_parallel[j] {
                        r.min(self.parallel[j])
                    } else {
                        r
                    };
                    let on_r = r + mu_path * self.single[j];
                    let on = if self.can_parallel[j] {
                        on_r.min(self.parallel[j])
                    } else {
                        on_r
                    };
                    base += off;
                    w[j] = on - off;
                }
                // Longest path of w (indices are topological).
                let mut top = 0.0f64;
                for j in 0..m {
                    longest[j] = w[j];
                    for &(x, _) in self.edges.iter().filter(|e| e.1 == j) {
                        longest[j] = longest[j].max(longest[x] + w[j]);
                    }
                    top = top.max(longest[j]);
                }
                best = best.max(base + top);
            }
        }
        best
    }

    /// Size of the largest set of pairwise unordered operators among `members` (Dilworth:
    /// members minus a maximum matching of the comparability relation).
    fn width(&self, members: &[usize]) -> usize {
        let k = members.len();
        let mut match_right: Vec<Option<usize>> = vec![None; k];
        fn augment(
            p: &Prep,
            members: &[usize],
            u: usize,
            seen: &mut [bool],
            mr: &mut [Option<usize>],
        ) -> bool {
            for v in 0..members.len() {
                if p.reach[members[u]][members[v]] && !seen[v] {
                    seen[v] = true;
                    if mr[v].is_none_or(|w| augment(p, members, w, seen, mr)) {
                        mr[v] = Some(u);
                        return true;
                    }
                }
            }
            false
        }
        let mut matching = 0;
        for u in 0..k {
            let mut seen = vec![false; k];
            if augment(self, members, u, &mut seen, &mut match_right) {
                matching += 1;
            }
        }
        k - matching
    }
}

/// Which operators come before and after each one, as bit sets, for the two-window bound
/// of [`Prep::mode_bound`]: a parallel operator `P` runs alone, so every single-core
/// operator runs wholly before it or wholly after it, and the time outside the parallel
/// operators is at least the longest single-core operator before `P` plus the longest
/// after it — those that must come before (its ancestors) or after (its descendants), and
/// the others on the side that costs least.
struct Windows {
    ancestors: Vec<u128>,
    descendants: Vec<u128>,
    /// Operators, longest single-core duration first.
    longest_first: Vec<usize>,
}

impl Windows {
    /// `None` beyond 128 operators (the bit sets' width).
    fn new(p: &Prep) -> Option<Windows> {
        let m = p.len();
        if m > 128 {
            return None;
        }
        let mut ancestors = vec![0u128; m];
        let mut descendants = vec![0u128; m];
        for i in 0..m {
            for j in 0..m {
                if p.reach[i][j] {
                    descendants[i] |= 1 << j;
                    ancestors[j] |= 1 << i;
                }
            }
        }
        let mut longest_first: Vec<usize> = (0..m).collect();
        longest_first.sort_by(|&a, &b| p.single[b].total_cmp(&p.single[a]).then(a.cmp(&b)));
        Some(Windows {
            ancestors,
            descendants,
            longest_first,
        })
    }

    /// The least single-core time outside the parallel operators with `pj` parallel and
    /// `singles` on one core: the longest before plus the longest after, with each operator
    /// free to go either way on the side that costs least.
    fn around(&self, pj: usize, singles: u128, single: &[f64]) -> f64 {
        let longest = |set: u128| {
            self.longest_first
                .iter()
                .find(|&&i| set >> i & 1 == 1)
                .map_or(0.0, |&i| single[i])
        };
        let before = longest(singles & self.ancestors[pj]);
        let after = longest(singles & self.descendants[pj]);
        let free = singles & !self.ancestors[pj] & !self.descendants[pj];
        // The free operators, longest first: those longer than one side's length go to the
        // other side. Try each free length (and none) as the shorter side's bound.
        let mut best = f64::INFINITY;
        for (low, high) in [(before, after), (after, before)] {
            // `low` side takes every free operator up to `cap`; the rest go to `high`.
            let mut caps = vec![low];
            caps.extend(
                self.longest_first
                    .iter()
                    .filter(|&&i| free >> i & 1 == 1 && single[i] > low)
                    .map(|&i| single[i]),
            );
            for cap in caps {
                let rest = self
                    .longest_first
                    .iter()
                    .find(|&&i| free >> i & 1 == 1 && single[i] > cap)
                    .map_or(0.0, |&i| single[i]);
                best = best.min(cap + high.max(rest));
            }
        }
        best
    }
}

/// Checks that `placements` is a valid schedule of `inst` (with a relative tolerance).
pub fn check(inst: &Instance, placements: &[Placement]) -> Result<(), String> {
    let n = inst.tasks.len();
    if placements.len() != n {
        return Err(format!("{} placements for {n} operators", placements.len()));
    }
    let span = placements.iter().map(|p| p.finish).fold(0.0, f64::max);
    let eps = 1e-6 * span.max(1e-12);
    for (i, (t, p)) in inst.tasks.iter().zip(placements).enumerate() {
        let want = match (t.resource, p.mode) {
            (Resource::None, _) => 0.0,
            (Resource::Link, _) => t.single,
            (_, Mode::Single) => t.single,
            (_, Mode::Parallel) => t.parallel,
        };
        if ((p.finish - p.start) - want).abs() > eps || p.start < -eps {
            return Err(format!(
                "operator {i} runs {} instead of {want}",
                p.finish - p.start
            ));
        }
    }
    for &(a, b) in &inst.edges {
        if placements[a].finish > placements[b].start + eps {
            return Err(format!(
                "operator {b} starts at {} before {a} finishes at {}",
                placements[b].start, placements[a].finish
            ));
        }
    }
    let overlap = |i: usize, j: usize| {
        let (p, q) = (&placements[i], &placements[j]);
        p.start + eps < q.finish
            && q.start + eps < p.finish
            && p.finish - p.start > eps
            && q.finish - q.start > eps
    };
    for i in 0..n {
        let ri = inst.tasks[i].resource;
        for j in i + 1..n {
            let rj = inst.tasks[j].resource;
            if !overlap(i, j) {
                continue;
            }
            let parallel = (ri.is_core() && placements[i].mode == Mode::Parallel && rj.is_core())
                || (rj.is_core() && placements[j].mode == Mode::Parallel && ri.is_core());
            if parallel {
                return Err(format!(
                    "operators {i} and {j} overlap although one runs in parallel mode"
                ));
            }
            if ri == Resource::Link && rj == Resource::Link {
                return Err(format!("all-reduces {i} and {j} overlap"));
            }
            let same_tc = ri.uses_tensor()
                && rj.uses_tensor()
                && placements[i].tensor_core == placements[j].tensor_core;
            let same_vc = ri.uses_vector()
                && rj.uses_vector()
                && placements[i].vector_core == placements[j].vector_core;
            if same_tc || same_vc {
                return Err(format!("operators {i} and {j} overlap on the same core"));
            }
        }
    }
    for (i, (t, p)) in inst.tasks.iter().zip(placements).enumerate() {
        if p.mode == Mode::Single {
            if t.resource.uses_tensor() && p.tensor_core.is_none_or(|c| c >= inst.tensor_cores) {
                return Err(format!("operator {i} has no valid tensor core"));
            }
            if t.resource.uses_vector() && p.vector_core.is_none_or(|c| c >= inst.vector_cores) {
                return Err(format!("operator {i} has no valid vector core"));
            }
        }
    }
    Ok(())
}

/// Turns real-operator starts and modes into placements of every operator: cores by
/// interval colouring, `none` operators at the finish of their last predecessor.
fn place(inst: &Instance, prep: &Prep, starts: &[f64], modes: &[Mode]) -> Vec<Placement> {
    let n = inst.tasks.len();
    let mut out: Vec<Placement> = vec![
        Placement {
            mode: Mode::Single,
            start: 0.0,
            finish: 0.0,
            tensor_core: None,
            vector_core: None
        };
        n
    ];
    for (k, &i) in prep.real.iter().enumerate() {
        out[i].mode = if prep.res[k].is_core() {
            modes[k]
        } else {
            Mode::Single
        };
        out[i].start = starts[k];
        out[i].finish = starts[k] + prep.duration(k, out[i].mode);
    }
    // Cores: lowest free core at each start, in order of start.
    let mut by_start: Vec<usize> = (0..prep.len())
        .filter(|&k| prep.res[k].is_core() && modes[k] == Mode::Single)
        .collect();
    by_start.sort_by(|&a, &b| starts[a].total_cmp(&starts[b]).then(a.cmp(&b)));
    let mut tc_free = vec![f64::NEG_INFINITY; prep.tc as usize];
    let mut vc_free = vec![f64::NEG_INFINITY; prep.vc as usize];
    let span = starts
        .iter()
        .zip(0..)
        .map(|(s, k)| s + prep.duration(k, modes[k]))
        .fold(0.0, f64::max);
    let eps = 1e-9 * span.max(1e-12);
    for k in by_start {
        let i = prep.real[k];
        let (s, f) = (out[i].start, out[i].finish);
        let take = |free: &mut Vec<f64>| {
            let c = free.iter().position(|&x| x <= s + eps).unwrap_or(0);
            free[c] = f;
            c as u32
        };
        if prep.res[k].uses_tensor() {
            out[i].tensor_core = Some(take(&mut tc_free));
        }
        if prep.res[k].uses_vector() {
            out[i].vector_core = Some(take(&mut vc_free));
        }
    }
    // `none` operators: at the latest finish of their predecessors, in topological order.
    let mut preds = vec![Vec::new(); n];
    for &(a, b) in &inst.edges {
        preds[b].push(a);
    }
    let mut done = vec![false; n];
    for &i in &prep.real {
        done[i] = true;
    }
    let mut changed = true;
    while changed {
        changed = false;
        for i in 0..n {
            if !done[i] && preds[i].iter().all(|&p| done[p]) {
                let t = preds[i].iter().map(|&p| out[p].finish).fold(0.0, f64::max);
                out[i] = Placement {
                    mode: Mode::Single,
                    start: t,
                    finish: t,
                    tensor_core: None,
                    vector_core: None,
                };
                done[i] = true;
                changed = true;
            }
        }
    }
    out
}

/// Solves `inst`.
pub fn solve(inst: &Instance, options: &Options) -> Result<Schedule, ScheduleError> {
    let started = Instant::now();
    let prep = Prep::new(inst)?;
    let m = prep.len();
    let (mut starts, mut modes) = (Vec::with_capacity(m), Vec::with_capacity(m));
    let (mut span, mut lower, mut bound) = (0.0, 0.0, 0.0);
    let (mut optimal, mut mip, mut hit_time, mut hit_nodes) = (true, false, false, false);
    if m > 0 {
        for r in prep.series_parts() {
            let part = solve_part(&prep.slice(r), options)?;
            starts.extend(part.starts.iter().map(|s| s + span));
            modes.extend(part.modes);
            span += part.makespan;
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
        lower_bound: lower,
        optimal,
        gap,
        method: if mip { Method::Mip } else { Method::Bounds },
        hit_time_limit: hit_time,
        hit_node_limit: hit_nodes && !optimal,
        solve_seconds: started.elapsed().as_secs_f64(),
        placements: place(inst, &prep, &starts, &modes),
    })
}

/// The schedule of one series part ([`Prep::series_parts`]), its starts from 0.
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
}

/// The list schedule `(span, starts, modes)` as the part's schedule if the bound `lower`
/// settles it: proven optimal when it meets the bound, accepted (with its gap) when it is
/// within the accepted gap or no MIP may be built.
fn settled(
    (span, starts, modes): &(f64, Vec<f64>, Vec<Mode>),
    lower: f64,
    options: &Options,
    no_mip: bool,
) -> Option<Part> {
    let optimal = *span <= lower + 1e-9 * span.max(1e-300);
    let accepted =
        no_mip || (options.relative_gap > 0.0 && span - lower <= options.relative_gap * span);
    (optimal || accepted).then(|| Part {
        makespan: *span,
        starts: starts.clone(),
        modes: modes.clone(),
        lower,
        bound: if optimal { *span } else { lower },
        optimal,
        mip: false,
        hit_time_limit: false,
        hit_node_limit: false,
    })
}

/// Bounds, then the list schedule, then (if they do not meet within the accepted gap) the
/// bound by the modes and a deeper list schedule, and only then the MIP warm-started with
/// it.
fn solve_part(prep: &Prep, options: &Options) -> Result<Part, ScheduleError> {
    let lower = prep.lower_bound();
    let listed = heuristic::best(prep);
    if let Some(part) = settled(&listed, lower, options, options.heuristic_only) {
        return Ok(part);
    }
    // Before a MIP: the bound by the modes, which often meets the list schedule.
    let lower = match prep.mode_bound() {
        Some(b) if b > lower => b.min(listed.0),
        _ => lower,
    };
    if let Some(part) = settled(&listed, lower, options, false) {
        return Ok(part);
    }
    // Then a deeper list-schedule search (pairs of mode flips).
    let deeper = heuristic::deeper(prep, listed);
    if let Some(part) = settled(&deeper, lower, options, false) {
        return Ok(part);
    }
    let (h_span, h_starts, h_modes) = deeper;
    let r = mip::solve(prep, lower, h_span, &h_starts, &h_modes, options)?;
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
    })
}

#[cfg(test)]
mod tests;
