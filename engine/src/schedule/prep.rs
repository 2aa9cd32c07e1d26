//! The instance as the solver works on it ([`Prep`]): the operators that take time, their
//! durations, which ones precede which (transitively), and its series parts.

use super::{Instance, Mode, Resource, ScheduleError, Task};

/// The instance restricted to operators that take time, with precedence through the
/// `none` operators kept.
pub(crate) struct Prep {
    /// Original index of each real operator.
    pub real: Vec<usize>,
    pub res: Vec<Resource>,
    pub single: Vec<f64>,
    pub parallel: Vec<f64>,
    /// Memory time of each real operator ([`super::Task::memory`]; 0 for links).
    pub memory: Vec<f64>,
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
    pub(super) fn new(inst: &Instance) -> Result<Prep, ScheduleError> {
        let n = inst.tasks.len();
        check_tasks(&inst.tasks, inst.tensor_cores, inst.vector_cores)?;
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
        let memory: Vec<f64> = real
            .iter()
            .map(|&i| {
                let t = &inst.tasks[i];
                if t.resource.is_core() { t.memory } else { 0.0 }
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
            memory,
            can_parallel,
            reach,
            edges,
            tc: inst.tensor_cores,
            vc: inst.vector_cores,
        })
    }

    /// No operators: what [`Prep::fill_for_bounds`] fills.
    pub(super) fn empty() -> Prep {
        Prep {
            real: Vec::new(),
            res: Vec::new(),
            single: Vec::new(),
            parallel: Vec::new(),
            memory: Vec::new(),
            can_parallel: Vec::new(),
            reach: Vec::new(),
            edges: Vec::new(),
            tc: 0,
            vc: 0,
        }
    }

    /// This, made the operators `real` (original indices, in their order here) of `tasks`
    /// with the precedence `edges` among them (indices into `real`), for the bounds alone:
    /// the bounds read durations, resources and edges, never `reach`, which stays empty.
    /// What [`super::Skeleton`] bounds an instance's series parts with, one after another
    /// in the same vectors, without the precedence closure.
    pub(super) fn fill_for_bounds(
        &mut self,
        tasks: &[Task],
        real: &[usize],
        edges: &[(usize, usize)],
        tc: u32,
        vc: u32,
    ) {
        self.real.clear();
        self.real.extend_from_slice(real);
        self.res.clear();
        self.res.extend(real.iter().map(|&i| tasks[i].resource));
        self.single.clear();
        self.single.extend(real.iter().map(|&i| tasks[i].single));
        self.parallel.clear();
        self.parallel.extend(real.iter().map(|&i| {
            let t = &tasks[i];
            if t.resource.is_core() {
                t.parallel
            } else {
                t.single
            }
        }));
        self.memory.clear();
        self.memory.extend(real.iter().map(|&i| {
            let t = &tasks[i];
            if t.resource.is_core() { t.memory } else { 0.0 }
        }));
        self.can_parallel.clear();
        self.can_parallel.extend(
            (0..real.len()).map(|i| self.res[i].is_core() && self.parallel[i] < self.single[i]),
        );
        self.reach.clear();
        self.edges.clear();
        self.edges.extend_from_slice(edges);
        self.tc = tc;
        self.vc = vc;
    }

    pub(super) fn len(&self) -> usize {
        self.real.len()
    }

    /// The instance cut into parts that run one after another: a cut falls between two
    /// operators of the topological order wherever every operator before it precedes every
    /// operator after it (a transformer block's tensor-parallel all-reduces and norms are
    /// such cuts). Such a split is a prefix of every topological order, so checking the
    /// prefixes of this one finds them all. In any schedule each part ends before the next
    /// begins, so the optimum is the sum of the parts' optima: each is solved alone, with
    /// a smaller MIP where one is needed.
    pub(super) fn series_parts(&self) -> Vec<std::ops::Range<usize>> {
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
    pub(super) fn slice(&self, r: std::ops::Range<usize>) -> Prep {
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
            memory: self.memory[r.clone()].to_vec(),
            can_parallel: self.can_parallel[r].to_vec(),
            reach,
            edges,
            tc: self.tc,
            vc: self.vc,
        }
    }

    pub(super) fn comparable(&self, i: usize, j: usize) -> bool {
        self.reach[i][j] || self.reach[j][i]
    }

    /// Shortest duration of operator `i`.
    pub(super) fn min_duration(&self, i: usize) -> f64 {
        if self.can_parallel[i] {
            self.parallel[i]
        } else {
            self.single[i]
        }
    }

    pub(super) fn duration(&self, i: usize, mode: Mode) -> f64 {
        match mode {
            Mode::Single => self.single[i],
            Mode::Parallel => self.parallel[i],
        }
    }

    /// Earliest start (head) and time after finish (tail) of each operator with shortest
    /// durations.
    pub(super) fn heads_tails(&self) -> (Vec<f64>, Vec<f64>) {
        let m = self.len();
        let mut head = Vec::new();
        self.heads_into(&mut head);
        let mut tail = vec![0.0f64; m];
        for i in (0..m).rev() {
            for &(a, b) in self.edges.iter().filter(|e| e.0 == i) {
                tail[a] = tail[a].max(tail[b] + self.min_duration(b));
            }
        }
        (head, tail)
    }

    /// The heads of [`Prep::heads_tails`], into `head` (a vector the caller reuses).
    pub(super) fn heads_into(&self, head: &mut Vec<f64>) {
        let m = self.len();
        head.clear();
        head.resize(m, 0.0);
        // Real operators are numbered in topological order, so every edge goes a → b > a.
        for j in 0..m {
            for &(a, b) in self.edges.iter().filter(|e| e.1 == j) {
                head[b] = head[b].max(head[a] + self.min_duration(a));
            }
        }
    }

    /// Size of the largest set of pairwise unordered operators among `members` (Dilworth:
    /// members minus a maximum matching of the comparability relation).
    pub(super) fn width(&self, members: &[usize]) -> usize {
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

/// The checks of an instance's operators [`Prep::new`] starts with: durations and memory
/// times finite and not negative, cores for every operator, a sum a float holds.
pub(super) fn check_tasks(tasks: &[Task], tc: u32, vc: u32) -> Result<(), ScheduleError> {
    for (i, t) in tasks.iter().enumerate() {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        if t.resource != Resource::None && !(ok(t.single) && ok(t.parallel)) {
            return Err(ScheduleError::BadLatency(i, t.single, t.parallel));
        }
        if !ok(t.memory) {
            return Err(ScheduleError::BadMemory(i, t.memory));
        }
        if (t.resource.uses_tensor() && tc == 0) || (t.resource.uses_vector() && vc == 0) {
            return Err(ScheduleError::NoCores(tc, vc));
        }
    }
    // Every schedule's makespan is at most the sum of the durations it uses: if that
    // sum has no finite float, neither may a schedule.
    let total: f64 = tasks
        .iter()
        .filter(|t| t.resource != Resource::None)
        .map(|t| t.single.max(t.parallel).max(t.memory))
        .sum();
    if !total.is_finite() {
        return Err(ScheduleError::Overflow);
    }
    Ok(())
}
