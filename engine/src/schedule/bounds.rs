//! Lower bounds on a layer schedule's makespan: the critical path and each core type's
//! work, combined along every path, and the bound by the modes (the two-window argument
//! around each operator that runs alone). A list schedule that meets the bound is optimal
//! and no MIP is built.

use super::Resource;
use super::prep::Prep;

/// The working vectors of [`Prep::lower_bound_in`], kept between calls.
#[derive(Default)]
pub(super) struct Scratch {
    head: Vec<f64>,
    a: Vec<f64>,
    b: Vec<f64>,
    w: Vec<f64>,
    longest: Vec<f64>,
    first: Vec<usize>,
    pred_list: Vec<usize>,
}

impl Prep {
    /// A lower bound on the makespan.
    pub(super) fn lower_bound(&self) -> f64 {
        self.lower_bound_with(Self::PATH_WORK_STEPS)
    }

    /// The steps of each weight [`Prep::path_work_bound`] tries by default.
    pub(super) const PATH_WORK_STEPS: usize = 20;

    /// [`Prep::lower_bound`] with the path-and-work bound tried at `steps` steps of each
    /// weight (fewer: cheaper and no stronger; any number is a valid bound).
    pub(super) fn lower_bound_with(&self, steps: usize) -> f64 {
        self.lower_bound_in(steps, &mut Scratch::default())
    }

    /// [`Prep::lower_bound_with`], its working vectors in `scratch` (reused from one call
    /// to the next: a proven search's bound pass bounds every series part of every layer of
    /// every candidate, and allocating them each time took a third of it).
    pub(super) fn lower_bound_in(&self, steps: usize, scratch: &mut Scratch) -> f64 {
        let m = self.len();
        let head = &mut scratch.head;
        self.heads_into(head);
        let critical = (0..m)
            .map(|i| head[i] + self.min_duration(i))
            .fold(0.0, f64::max);
        // Parallel operators run alone, so T ≥ Σ_parallel p + max(W_tc / tc, W_vc / vc)
        // ≥ Σ_i min(p_i, λ a_i + (1 − λ) b_i) for every λ in [0, 1].
        let (a, b) = (&mut scratch.a, &mut scratch.b);
        a.clear();
        a.extend((0..m).map(|i| {
            if self.res[i].uses_tensor() {
                self.single[i] / self.tc as f64
            } else {
                0.0
            }
        }));
        b.clear();
        b.extend((0..m).map(|i| {
            if self.res[i].uses_vector() {
                self.single[i] / self.vc as f64
            } else {
                0.0
            }
        }));
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
        // λ = 0, 1, and where p_i = λ a_i + (1 − λ) b_i.
        let mut work_bound = work(0.0).max(work(1.0));
        for i in 0..m {
            let denom = a[i] - b[i];
            if denom.abs() > 0.0 {
                let l = (self.parallel[i] - b[i]) / denom;
                if (0.0..=1.0).contains(&l) {
                    work_bound = work_bound.max(work(l));
                }
            }
        }
        let path_work = self.path_work_bound(steps, scratch);
        critical.max(work_bound).max(path_work)
    }

    /// The most operators whose modes [`Prep::mode_bound`] enumerates (2^16 assignments, a
    /// few milliseconds: computed only before a MIP, which costs more).
    pub(super) const MODE_BOUND_MAX_CHOICES: usize = 16;

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
    pub(super) fn mode_bound(&self) -> Option<f64> {
        self.mode_bound_with(Self::MODE_BOUND_MAX_CHOICES)
    }

    /// [`Prep::mode_bound`] enumerating the modes of at most `most` operators.
    pub(super) fn mode_bound_with(&self, most: usize) -> Option<f64> {
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
    pub(super) fn path_work_bound(&self, steps: usize, scratch: &mut Scratch) -> f64 {
        let m = self.len();
        let link: f64 = (0..m)
            .filter(|&i| self.res[i] == Resource::Link)
            .map(|i| self.single[i])
            .sum();
        let steps = steps.max(1);
        let mut best = link;
        let Scratch {
            a,
            b,
            w,
            longest,
            first,
            pred_list,
            ..
        } = scratch;
        w.clear();
        w.resize(m, 0.0);
        longest.clear();
        longest.resize(m, 0.0);
        // Each operator's predecessors, in the order of the edges (the longest path below
        // visits them 231 times: listed once, not found by scanning every edge each time),
        // in one list: `pred_list[first[j]..first[j + 1]]`.
        first.clear();
        first.resize(m + 1, 0);
        for &(_, j) in &self.edges {
            first[j + 1] += 1;
        }
        for j in 0..m {
            first[j + 1] += first[j];
        }
        pred_list.clear();
        pred_list.resize(self.edges.len(), 0);
        // Filled in the edges' order, each `first[j]` moving to the end of `j`'s range
        // (the start of `j + 1`'s), then moved back one place.
        for &(x, j) in &self.edges {
            pred_list[first[j]] = x;
            first[j] += 1;
        }
        for j in (1..=m).rev() {
            first[j] = first[j - 1];
        }
        first[0] = 0;
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
                    for &x in &pred_list[first[j]..first[j + 1]] {
                        longest[j] = longest[j].max(longest[x] + w[j]);
                    }
                    top = top.max(longest[j]);
                }
                best = best.max(base + top);
            }
        }
        best
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
