//! What a layer's instance is apart from its durations ([`Skeleton`]): the operators that
//! take time in their order, the precedence among them and the series parts. A proven
//! search bounds every layer of every candidate; the candidates differ in durations only,
//! so the structure — the precedence closure, its transitive reduction and the cuts,
//! cubic in the operators — is worked out once per layer graph, not once per candidate.

use super::bounds::Scratch;
use super::prep::{Prep, check_tasks};
use super::{Instance, Resource, ScheduleError, Task, UNSOLVED_PATH_WORK_STEPS};
use std::ops::Range;

/// The structure of the instances of one layer graph: the resources of its operators and
/// what their precedence implies. [`Skeleton::makespan_lower_bound`] of an instance with
/// these resources and dependencies is [`super::makespan_lower_bound`] of it, bit for bit.
#[derive(Debug, Clone)]
pub struct Skeleton {
    resources: Vec<Resource>,
    /// Original index of each operator that takes time, in [`Prep`]'s order.
    real: Vec<usize>,
    parts: Vec<SeriesPart>,
}

thread_local! {
    /// Each thread's vectors for [`Skeleton::makespan_lower_bound`], reused from one call
    /// to the next (every one fills them anew): a proven search's bound pass makes
    /// millions of calls, whose allocations were a tenth of it.
    static BUFFERS: std::cell::RefCell<(Prep, Scratch)> =
        std::cell::RefCell::new((Prep::empty(), Scratch::default()));
}

/// A series part of a [`Skeleton`].
#[derive(Debug, Clone)]
struct SeriesPart {
    /// Its operators: a range of the skeleton's `real`.
    ops: Range<usize>,
    /// Its transitively reduced dependencies (indices into the range).
    edges: Vec<(usize, usize)>,
}

impl Skeleton {
    /// The skeleton of instances whose operators have `resources` and depend on each
    /// other by `edges` (the instance's own, restrictions included): an error for a
    /// dependency that names no operator, or a cycle.
    pub fn new(
        resources: &[Resource],
        edges: &[(usize, usize)],
    ) -> Result<Skeleton, ScheduleError> {
        let inst = Instance {
            tensor_cores: 1,
            vector_cores: 1,
            tasks: resources.iter().map(|&r| Task::new(r, 0.0, 0.0)).collect(),
            edges: edges.to_vec(),
        };
        let prep = Prep::new(&inst)?;
        let parts = if prep.len() == 0 {
            Vec::new()
        } else {
            prep.series_parts()
                .into_iter()
                .map(|ops| SeriesPart {
                    edges: prep.slice(ops.clone()).edges,
                    ops,
                })
                .collect()
        };
        Ok(Skeleton {
            resources: resources.to_vec(),
            real: prep.real,
            parts,
        })
    }

    /// [`super::makespan_lower_bound`] of the instance of `tasks` (durations and memory
    /// times, with this skeleton's resources) on `tensor_cores` and `vector_cores`: the
    /// same checks, the same bound, without working out the structure again.
    pub fn makespan_lower_bound(
        &self,
        tasks: &[Task],
        tensor_cores: u32,
        vector_cores: u32,
    ) -> Result<f64, ScheduleError> {
        if tasks.len() != self.resources.len()
            || tasks
                .iter()
                .zip(&self.resources)
                .any(|(t, &r)| t.resource != r)
        {
            return Err(ScheduleError::Solver(
                "a layer skeleton applied to another layer's operators".into(),
            ));
        }
        check_tasks(tasks, tensor_cores, vector_cores)?;
        BUFFERS.with_borrow_mut(|(part, scratch)| {
            let mut sum = 0.0;
            for p in &self.parts {
                part.fill_for_bounds(
                    tasks,
                    &self.real[p.ops.clone()],
                    &p.edges,
                    tensor_cores,
                    vector_cores,
                );
                let floor: f64 = part.memory.iter().sum();
                sum += part
                    .lower_bound_in(UNSOLVED_PATH_WORK_STEPS, scratch)
                    .max(floor);
            }
            Ok(sum)
        })
    }
}
