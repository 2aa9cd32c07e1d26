//! A layer's scheduling instance restricted to what the framework allows ([`Execution`]):
//! by precedence edges and durations, so the bounds, the list schedule and the MIP need no
//! special case, and a serial instance is proven optimal by its bound at once.

use crate::execution::{Execution, OperatorExecution};
use crate::schedule::{Instance, Resource, Task};
use std::collections::HashSet;

/// A topological order of the `n` operators of `edges` (smallest index first among the ready
/// ones), or `None` for a cyclic or malformed graph — which [`crate::schedule::solve`]
/// then reports.
fn topological_order(n: usize, edges: &[(usize, usize)]) -> Option<Vec<usize>> {
    let mut indegree = vec![0usize; n];
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in edges {
        if a >= n || b >= n {
            return None;
        }
        next[a].push(b);
        indegree[b] += 1;
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
        .filter(|&i| indegree[i] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(u)) = ready.pop() {
        order.push(u);
        for &v in &next[u] {
            indegree[v] -= 1;
            if indegree[v] == 0 {
                ready.push(std::cmp::Reverse(v));
            }
        }
    }
    (order.len() == n).then_some(order)
}

/// `inst` restricted to what `execution` allows.
///
/// * Sequential operators: every core operator (and every collective, unless collectives
///   overlap) is chained in one topological order, and runs on all the cores of its type
///   whatever mode the schedule picks (its single-core duration is its all-cores one).
/// * Collectives that do not overlap: each is ordered after every operator before it in
///   the topological order and before every operator after it — a barrier.
///
/// Every added edge goes forward in one topological order, so no cycle is created.
pub fn restrict(mut inst: Instance, execution: Execution) -> Instance {
    if execution == Execution::DATAFLOW {
        return inst;
    }
    let resources: Vec<Resource> = inst.tasks.iter().map(|t| t.resource).collect();
    let Some(edges) = restricted_edges(&resources, &inst.edges, execution) else {
        return inst;
    };
    inst.edges = edges;
    restrict_durations(&mut inst.tasks, execution);
    inst
}

/// The dependencies of [`restrict`]'s instance, from the operators' `resources` and
/// dependencies `edges` alone (the durations play no part): `None` for a cyclic or
/// malformed graph, which [`restrict`] leaves as it is.
pub fn restricted_edges(
    resources: &[Resource],
    edges: &[(usize, usize)],
    execution: Execution,
) -> Option<Vec<(usize, usize)>> {
    if execution == Execution::DATAFLOW {
        return Some(edges.to_vec());
    }
    let n = resources.len();
    let order = topological_order(n, edges)?;
    let mut existing: HashSet<(usize, usize)> = edges.iter().copied().collect();
    let mut add = |edges: &mut Vec<(usize, usize)>, a: usize, b: usize| {
        if existing.insert((a, b)) {
            edges.push((a, b));
        }
    };
    let is_link = |i: usize| resources[i] == Resource::Link;
    let takes_part = |i: usize| match resources[i] {
        Resource::None => false,
        Resource::Link => !execution.tensor_parallel_overlap.overlaps(),
        _ => true,
    };
    let mut edges = edges.to_vec();
    match execution.operators {
        OperatorExecution::Sequential => {
            let chain: Vec<usize> = order.iter().copied().filter(|&i| takes_part(i)).collect();
            for w in chain.windows(2) {
                add(&mut edges, w[0], w[1]);
            }
        }
        OperatorExecution::Concurrent => {
            if !execution.tensor_parallel_overlap.overlaps() {
                let position: Vec<usize> = {
                    let mut p = vec![0; order.len()];
                    for (k, &i) in order.iter().enumerate() {
                        p[i] = k;
                    }
                    p
                };
                for l in (0..n).filter(|&i| is_link(i)) {
                    for x in (0..n).filter(|&x| x != l && takes_part(x)) {
                        if position[x] < position[l] {
                            add(&mut edges, x, l);
                        } else {
                            add(&mut edges, l, x);
                        }
                    }
                }
            }
        }
    }
    Some(edges)
}

/// The durations of [`restrict`]'s instance (of an acyclic graph): with sequential
/// operators, every core operator runs on all the cores of its type, whatever the mode.
pub fn restrict_durations(tasks: &mut [Task], execution: Execution) {
    if execution.operators == OperatorExecution::Sequential {
        for t in tasks {
            if t.resource != Resource::Link && t.resource != Resource::None {
                t.single = t.parallel;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::execution::TensorParallelOverlap;
    use crate::options::ScheduleOptions;
    use crate::schedule::{self, Task};

    fn task(resource: Resource, single: f64, parallel: f64) -> Task {
        Task::new(resource, single, parallel)
    }

    /// Two independent GEMMs, a vector op after the first, a collective after the vector
    /// op and an independent vector op: concurrent, sequential and barrier semantics give
    /// the makespans worked out by hand.
    fn layer() -> Instance {
        Instance {
            tensor_cores: 2,
            vector_cores: 2,
            tasks: vec![
                task(Resource::Tensor, 4.0, 2.0), // 0
                task(Resource::Tensor, 4.0, 2.0), // 1
                task(Resource::Vector, 2.0, 1.0), // 2 after 0
                task(Resource::Link, 3.0, 3.0),   // 3 after 2
                task(Resource::Vector, 2.0, 1.0), // 4 after 1
            ],
            edges: vec![(0, 2), (2, 3), (1, 4)],
        }
    }

    fn makespan(inst: &Instance) -> (f64, bool) {
        let s = schedule::solve(inst, &ScheduleOptions::default()).unwrap();
        (s.makespan, s.optimal)
    }

    #[test]
    fn dataflow_leaves_the_instance_alone() {
        assert_eq!(restrict(layer(), Execution::DATAFLOW), layer());
        // An operator on all cores runs alone, but the link overlaps anything: 0 (0–2),
        // 2 (2–3), then the link (3–6) under 1 (3–5) and 4 (5–6): 6.
        assert_eq!(makespan(&layer()).0, 6.0);
    }

    #[test]
    fn sequential_runs_one_operator_at_a_time_on_all_cores() {
        let seq = Execution {
            operators: OperatorExecution::Sequential,
            tensor_parallel_overlap: TensorParallelOverlap::None,
            kernels: Default::default(),
            fp8_library: Default::default(),
            cross_entropy: Default::default(),
            overlap_efficiency: Default::default(),
        };
        let inst = restrict(layer(), seq);
        // 2 + 2 + 1 + 3 + 1, proven by the bound alone.
        assert_eq!(makespan(&inst), (9.0, true));
        // The collective may overlap the compute stream: it starts after op 2 (at 5) and
        // ends at 8, op 4 runs 5..6 under it.
        let overlap = restrict(
            layer(),
            Execution {
                operators: OperatorExecution::Sequential,
                tensor_parallel_overlap: TensorParallelOverlap::Pipelined,
                kernels: Default::default(),
                fp8_library: Default::default(),
                cross_entropy: Default::default(),
                overlap_efficiency: Default::default(),
            },
        );
        assert_eq!(makespan(&overlap), (8.0, true));
    }

    #[test]
    fn a_collective_without_overlap_is_a_barrier() {
        let inst = restrict(
            layer(),
            Execution {
                operators: OperatorExecution::Concurrent,
                tensor_parallel_overlap: TensorParallelOverlap::None,
                kernels: Default::default(),
                fp8_library: Default::default(),
                cross_entropy: Default::default(),
                overlap_efficiency: Default::default(),
            },
        );
        // Op 4 comes after the link in topological order and ops 0–2 before it: 0 (0–2),
        // 1 (2–4), 2 (4–5), the link (5–8), then 4 (8–9).
        assert_eq!(makespan(&inst), (9.0, true));
        assert!(inst.edges.contains(&(3, 4)) && inst.edges.contains(&(1, 3)));
    }

    #[test]
    fn a_cyclic_instance_is_left_for_the_solver_to_reject() {
        let mut inst = layer();
        inst.edges.push((3, 0));
        let restricted = restrict(
            inst.clone(),
            Execution {
                operators: OperatorExecution::Sequential,
                tensor_parallel_overlap: TensorParallelOverlap::None,
                kernels: Default::default(),
                fp8_library: Default::default(),
                cross_entropy: Default::default(),
                overlap_efficiency: Default::default(),
            },
        );
        assert_eq!(restricted, inst);
    }

    #[test]
    fn names_round_trip() {
        for e in OperatorExecution::ALL {
            assert_eq!(OperatorExecution::from_name(e.name()), Some(e));
        }
        assert_eq!(OperatorExecution::from_name("parallel"), None);
    }
}
