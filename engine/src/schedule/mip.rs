//! The exact layer schedule as a MIP (design doc §7.2–7.3, tightened), solved by HiGHS.
//!
//! Times are divided by the list schedule's makespan, so the big-M is 1 and the solver's
//! tolerances are relative. Variables: the makespan `T`; per operator its start `s` and,
//! when parallel mode can help, `y` (parallel); per pair that no path orders and that can
//! conflict, `x_ij` (i finishes before j starts; big-M from the time windows); per
//! operator of a core type whose
//! operators can outnumber its cores, `z_ic` (single-mode on core c). Besides the
//! disjunctions, two energy rows (parallel operators run alone, so each core type's
//! single-mode work must fit beside them) tighten the relaxation.

// Operators are indices into several parallel arrays; index loops read best here.
#![allow(clippy::needless_range_loop)]

use super::{Mode, Options, Prep, Resource, ScheduleError};
use good_lp::solvers::highs::highs;
use good_lp::{Expression, ProblemVariables, SolverModel, Variable, constraint, variable};
use highs::HighsModelStatus;
use std::collections::BTreeMap;

pub(super) struct MipResult {
    pub makespan: f64,
    pub starts: Vec<f64>,
    pub modes: Vec<Mode>,
    /// Best lower bound the solver proved.
    pub bound: f64,
    pub optimal: bool,
    /// The wall-clock safety net stopped the solver: the result depends on the machine.
    pub hit_time_limit: bool,
    /// The node limit stopped the solver: not proven optimal, but reproducible.
    pub hit_node_limit: bool,
}

/// Variables with their column numbers (good_lp creates HiGHS columns in this order).
struct Vars {
    vars: ProblemVariables,
    count: usize,
}

impl Vars {
    fn add(&mut self, def: good_lp::VariableDefinition) -> (Variable, usize) {
        let v = self.vars.add(def);
        self.count += 1;
        (v, self.count - 1)
    }
}

/// Which core types can have more operators at once than cores.
fn binding(p: &Prep) -> (bool, bool) {
    let users =
        |f: fn(Resource) -> bool| -> Vec<usize> { (0..p.len()).filter(|&i| f(p.res[i])).collect() };
    let tc = users(Resource::uses_tensor);
    let vc = users(Resource::uses_vector);
    (p.width(&tc) > p.tc as usize, p.width(&vc) > p.vc as usize)
}

pub(super) fn solve(
    p: &Prep,
    lower: f64,
    upper: f64,
    h_starts: &[f64],
    h_modes: &[Mode],
    options: &Options,
) -> Result<MipResult, ScheduleError> {
    let m = p.len();
    let scale = upper;
    let sd = |i: usize| p.single[i] / scale;
    let pd = |i: usize| p.parallel[i] / scale;
    let (head, tail) = p.heads_tails();
    let (tc_binds, vc_binds) = binding(p);

    let mut v = Vars {
        vars: ProblemVariables::new(),
        count: 0,
    };
    // Upper bounds get a little slack: the list schedule meets them exactly, and rounding
    // after scaling must not cut it off.
    const SLACK: f64 = 1e-7;
    let (t_var, _) = v.add(variable().min(lower / scale).max(1.0 + SLACK).initial(1.0));
    let mut s = Vec::with_capacity(m);
    let mut s_col = Vec::with_capacity(m);
    for i in 0..m {
        let lo = head[i] / scale;
        let hi = (1.0 - (tail[i] + p.min_duration(i)) / scale).max(lo);
        let init = (h_starts[i] / scale).clamp(lo, hi);
        let (var, col) = v.add(variable().min(lo).max(hi + SLACK).initial(init));
        s.push(var);
        s_col.push(col);
    }
    let mut y: Vec<Option<(Variable, usize)>> = Vec::with_capacity(m);
    for i in 0..m {
        y.push(p.can_parallel[i].then(|| {
            let init = if h_modes[i] == Mode::Parallel {
                1.0
            } else {
                0.0
            };
            v.add(variable().binary().initial(init))
        }));
    }
    let dur = |i: usize| -> Expression {
        match y[i] {
            Some((yv, _)) => sd(i) + (pd(i) - sd(i)) * yv,
            None => Expression::from(sd(i)),
        }
    };
    let h_finish: Vec<f64> = (0..m)
        .map(|i| h_starts[i] + p.duration(i, h_modes[i]))
        .collect();
    let eps = 1e-9 * upper;

    // Order variables for pairs that can conflict.
    let uses = |i: usize, tensor: bool| {
        if tensor {
            p.res[i].uses_tensor()
        } else {
            p.res[i].uses_vector()
        }
    };
    let conflict = |i: usize, j: usize| {
        let (ri, rj) = (p.res[i], p.res[j]);
        (ri.is_core() && rj.is_core() && (p.can_parallel[i] || p.can_parallel[j]))
            || (ri == Resource::Link && rj == Resource::Link)
            || (tc_binds && ri.uses_tensor() && rj.uses_tensor())
            || (vc_binds && ri.uses_vector() && rj.uses_vector())
    };
    let mut x: BTreeMap<(usize, usize), Variable> = BTreeMap::new();
    for i in 0..m {
        for j in 0..m {
            if i != j && !p.comparable(i, j) && conflict(i, j) {
                let before = h_finish[i] <= h_starts[j] + eps;
                let (var, _) = v.add(variable().binary().initial(if before { 1.0 } else { 0.0 }));
                x.insert((i, j), var);
            }
        }
    }

    // Core assignment, only where the cores can run out (and more than one core exists).
    let mut z: BTreeMap<(usize, u32, bool), Variable> = BTreeMap::new();
    for (tensor, binds, cores) in [(true, tc_binds, p.tc), (false, vc_binds, p.vc)] {
        if !binds || cores <= 1 {
            continue;
        }
        // The heuristic's cores, for the warm start.
        let mut order: Vec<usize> = (0..m)
            .filter(|&i| uses(i, tensor) && h_modes[i] == Mode::Single)
            .collect();
        order.sort_by(|&a, &b| h_starts[a].total_cmp(&h_starts[b]).then(a.cmp(&b)));
        let mut free = vec![f64::NEG_INFINITY; cores as usize];
        let mut warm: BTreeMap<usize, u32> = BTreeMap::new();
        for i in order {
            let c = free
                .iter()
                .position(|&f| f <= h_starts[i] + eps)
                .unwrap_or(0);
            free[c] = h_finish[i];
            warm.insert(i, c as u32);
        }
        for (rank, i) in (0..m).filter(|&i| uses(i, tensor)).enumerate() {
            // Symmetry: the k-th operator of this type uses one of the first k + 1 cores.
            for c in 0..cores.min(rank as u32 + 1) {
                let init = if warm.get(&i) == Some(&c) { 1.0 } else { 0.0 };
                let (var, _) = v.add(variable().binary().initial(init));
                z.insert((i, c, tensor), var);
            }
        }
    }

    let mut problem = v.vars.minimise(t_var).using(highs);
    let mut rows = 0usize;
    for i in 0..m {
        // Every operator is followed by at least its tail.
        problem.add_constraint(constraint!(s[i] + dur(i) + tail[i] / scale <= t_var));
        rows += 1;
    }
    // Parallel operators run alone, so each core type's single-mode work fits in the time
    // left by them: T ≥ Σ p_i y_i + Σ_{i on type} l_i (1 − y_i) / cores.
    for (tensor, cores) in [(true, p.tc), (false, p.vc)] {
        let mut energy = Expression::from(0.0);
        let mut any = false;
        for i in 0..m {
            if let Some((yi, _)) = y[i] {
                energy += pd(i) * yi;
            }
            if uses(i, tensor) {
                any = true;
                let share = sd(i) / cores as f64;
                energy += match y[i] {
                    Some((yi, _)) => share - share * yi,
                    None => Expression::from(share),
                };
            }
        }
        if any {
            problem.add_constraint(constraint!(energy <= t_var));
            rows += 1;
        }
    }
    for &(a, b) in &p.edges {
        problem.add_constraint(constraint!(s[a] + dur(a) <= s[b]));
        rows += 1;
    }
    for (&(i, j), &xij) in &x {
        // Big-M from the time windows: latest finish of i minus earliest start of j.
        let big_m = ((upper - tail[i] - head[j]) / scale).max(0.0) + 2.0 * SLACK;
        problem.add_constraint(constraint!(s[i] + dur(i) - s[j] <= big_m * (1.0 - xij)));
        rows += 1;
        if i < j {
            let xji = x[&(j, i)];
            problem.add_constraint(constraint!(xij + xji <= 1.0));
            let (ri, rj) = (p.res[i], p.res[j]);
            if ri.is_core() && rj.is_core() {
                for k in [i, j] {
                    if let Some((yk, _)) = y[k] {
                        problem.add_constraint(constraint!(xij + xji >= yk));
                        rows += 1;
                    }
                }
            }
            let single_core = |tensor: bool, cores: u32, binds: bool| {
                binds && cores == 1 && uses(i, tensor) && uses(j, tensor)
            };
            if (ri == Resource::Link && rj == Resource::Link)
                || single_core(true, p.tc, tc_binds)
                || single_core(false, p.vc, vc_binds)
            {
                problem.add_constraint(constraint!(xij + xji >= 1.0));
                rows += 1;
            }
            for (tensor, cores) in [(true, p.tc), (false, p.vc)] {
                for c in 0..cores {
                    if let (Some(&zi), Some(&zj)) = (z.get(&(i, c, tensor)), z.get(&(j, c, tensor)))
                    {
                        problem.add_constraint(constraint!(xij + xji >= zi + zj - 1.0));
                        rows += 1;
                    }
                }
            }
            rows += 1;
        }
    }
    for (tensor, cores) in [(true, p.tc), (false, p.vc)] {
        for i in (0..m).filter(|&i| uses(i, tensor)) {
            let vars: Vec<Variable> = (0..cores)
                .filter_map(|c| z.get(&(i, c, tensor)).copied())
                .collect();
            if vars.is_empty() {
                continue;
            }
            let sum: Expression = vars.iter().copied().sum();
            match y[i] {
                Some((yi, _)) => problem.add_constraint(constraint!(sum + yi == 1.0)),
                None => problem.add_constraint(constraint!(sum == 1.0)),
            };
            rows += 1;
        }
    }
    // No transitivity rows (x_ik ≥ x_ij + x_jk − 1): with start-time variables they are
    // implied, and on the reference fixtures they made HiGHS slower (808 ms vs 707 ms for
    // the twelve cases).
    tracing::debug!(
        operators = m,
        columns = v.count,
        rows,
        x = x.len(),
        z = z.len(),
        tc_binds,
        vc_binds,
        lower,
        upper,
        "layer-schedule MIP"
    );

    let mut model = problem
        .try_into_inner()
        .map_err(|e| ScheduleError::Solver(e.to_string()))?;
    model.make_quiet();
    model.set_option("time_limit", options.time_limit_seconds.max(0.001));
    // The work limit that makes a search reproducible: with one thread, HiGHS explores
    // the same nodes in the same order on any machine under any load.
    let node_limit = i32::try_from(options.node_limit.max(1)).unwrap_or(i32::MAX);
    model.set_option("mip_max_nodes", node_limit);
    model.set_option("mip_rel_gap", options.relative_gap.max(1e-9));
    model.set_option("mip_abs_gap", 1e-12);
    model.set_option("mip_feasibility_tolerance", 1e-9);
    model.set_option("primal_feasibility_tolerance", 1e-9);
    model.set_option("threads", 1);
    // We hand HiGHS the list schedule as its incumbent; its own primal heuristics cost
    // more than they find on these small models.
    model.set_option("mip_heuristic_effort", 0.0);
    // Keep the root cheap: with a node limit, the root is where the time goes (presolve,
    // probing, strong branching, the root heuristics). Measured on the default spec and
    // BERT-large at 100 nodes (debug build, 2 cores): the feasibility-jump, RINS, RENS
    // and root reduced-cost heuristics, strong branching until pseudo-costs are reliable,
    // symmetry detection and restarts cost 2.3× the time and found nothing better.
    model.set_option("mip_heuristic_run_feasibility_jump", false);
    model.set_option("mip_heuristic_run_rins", false);
    model.set_option("mip_heuristic_run_rens", false);
    model.set_option("mip_heuristic_run_root_reduced_cost", false);
    model.set_option("mip_pscost_minreliable", 0);
    model.set_option("mip_detect_symmetry", false);
    model.set_option("mip_allow_restart", false);
    let t0 = std::time::Instant::now();
    let solved = model
        .try_solve()
        .map_err(|e| ScheduleError::Solver(format!("{e:?}")))?;
    let status = solved.status();
    let hit_time_limit = matches!(
        status,
        HighsModelStatus::ReachedTimeLimit | HighsModelStatus::ReachedMemoryLimit
    );
    let hit_node_limit = matches!(
        status,
        HighsModelStatus::ReachedSolutionLimit | HighsModelStatus::ReachedIterationLimit
    );
    tracing::debug!(
        ?status,
        seconds = t0.elapsed().as_secs_f64(),
        operators = m,
        "layer-schedule MIP solved"
    );
    let has_solution = solved.primal_solution_status() == highs::HighsSolutionStatus::Feasible;
    if !has_solution {
        // Keep the list schedule; what the solver proved is only the bound we had.
        return Ok(MipResult {
            makespan: f64::INFINITY,
            starts: Vec::new(),
            modes: Vec::new(),
            bound: lower,
            optimal: false,
            hit_time_limit,
            hit_node_limit,
        });
    }
    let sol = solved.get_solution();
    let cols = sol.columns();
    let starts: Vec<f64> = s_col
        .iter()
        .map(|&c| cols.get(c).copied().unwrap_or(0.0).max(0.0) * scale)
        .collect();
    let modes: Vec<Mode> = (0..m)
        .map(|i| match y[i] {
            Some((_, col)) if cols.get(col).copied().unwrap_or(0.0) > 0.5 => Mode::Parallel,
            _ => Mode::Single,
        })
        .collect();
    let makespan = (0..m)
        .map(|i| starts[i] + p.duration(i, modes[i]))
        .fold(0.0, f64::max);
    let gap = solved.mip_gap();
    let objective = solved.objective_value() * scale;
    let optimal = status == HighsModelStatus::Optimal && gap.is_finite() && gap <= 1e-6;
    let bound = if gap.is_finite() {
        objective * (1.0 - gap.clamp(0.0, 1.0))
    } else {
        lower
    };
    Ok(MipResult {
        makespan,
        starts,
        modes,
        bound: if optimal {
            makespan.min(objective)
        } else {
            bound
        },
        optimal,
        hit_time_limit,
        hit_node_limit,
    })
}
