//! A layer's operator graph as a scheduling instance on one accelerator: every operator's
//! duration on one core and on all cores of its type, from the latency model, restricted
//! to what the [`Execution`] allows.

use super::estimate::estimate;
use crate::execution::Execution;
use crate::model::{Core, OpGraph};
use crate::schedule::{Instance, Resource, Task};
use archplace_plugin_sdk::{
    AcceleratorConfig, CoreConfig, EstimateError, LatencyModel, Op, OpCost,
};

/// The scheduling instance of `graph` on `config` under `execution`, with `cost`
/// answering for one operator on some cores (the search passes its memo; [`instance`] asks
/// the model directly). Sequential execution asks only for all-cores durations.
pub fn instance_with(
    graph: &OpGraph,
    config: &AcceleratorConfig,
    execution: Execution,
    mut cost: impl FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
) -> Result<Instance, EstimateError> {
    let all_only = execution.all_cores_only();
    let (tc_all, tc_one) = (
        config.tensor_core(config.tensor_cores),
        config.tensor_core(1),
    );
    let (vc_all, vc_one) = (
        config.vector_core(config.vector_cores),
        config.vector_core(1),
    );
    let mut tasks = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let (resource, one, all) = match node.core {
            Core::Tensor | Core::Fused => {
                let all = cost(&tc_all, &node.op)?;
                let one = if all_only {
                    all
                } else {
                    cost(&tc_one, &node.op)?
                };
                let r = if node.core == Core::Tensor {
                    Resource::Tensor
                } else {
                    Resource::Fused
                };
                (r, one, all)
            }
            Core::Vector => {
                let all = cost(&vc_all, &node.op)?;
                let one = if all_only {
                    all
                } else {
                    cost(&vc_one, &node.op)?
                };
                (Resource::Vector, one, all)
            }
            // All-reduces use the links, whatever the cores.
            Core::Link => {
                let c = cost(&vc_one, &node.op)?;
                (Resource::Link, c, c)
            }
        };
        // The mode that moves the least bytes: a bound whichever mode the schedule picks.
        let memory = if resource == Resource::Link {
            0.0
        } else {
            one.memory_seconds
                .unwrap_or(0.0)
                .min(all.memory_seconds.unwrap_or(0.0))
        };
        tasks.push(Task {
            resource,
            single: one.seconds,
            parallel: all.seconds,
            memory,
        });
    }
    Ok(super::restrict(
        Instance {
            tensor_cores: config.tensor_cores,
            vector_cores: config.vector_cores,
            tasks,
            edges: graph.edges.clone(),
        },
        execution,
    ))
}

/// The scheduling instance of `graph` on `config` under `execution`, estimated by `model`.
pub fn instance(
    graph: &OpGraph,
    config: &AcceleratorConfig,
    execution: Execution,
    model: &dyn LatencyModel,
) -> Result<Instance, EstimateError> {
    instance_with(graph, config, execution, |core, op| {
        Ok(estimate(model, core, std::slice::from_ref(op))?[0])
    })
}
