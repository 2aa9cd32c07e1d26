//! A layer's operator graph as a scheduling instance on one accelerator: every operator's
//! duration on one core and on all cores of its type, from the latency model.

use super::estimate::estimate;
use super::model::{Core, OpGraph};
use super::schedule::{Instance, Resource, Task};
use archplace_plugin_sdk::{
    AcceleratorConfig, CoreConfig, EstimateError, LatencyModel, Op, OpCost,
};

/// The scheduling instance of `graph` on `config`, with `cost` answering for one operator
/// on some cores (the search passes its memo; [`instance`] asks the model directly).
pub fn instance_with(
    graph: &OpGraph,
    config: &AcceleratorConfig,
    mut cost: impl FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
) -> Result<Instance, EstimateError> {
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
            Core::Tensor => (
                Resource::Tensor,
                cost(&tc_one, &node.op)?,
                cost(&tc_all, &node.op)?,
            ),
            Core::Fused => (
                Resource::Fused,
                cost(&tc_one, &node.op)?,
                cost(&tc_all, &node.op)?,
            ),
            Core::Vector => (
                Resource::Vector,
                cost(&vc_one, &node.op)?,
                cost(&vc_all, &node.op)?,
            ),
            // All-reduces use the links, whatever the cores.
            Core::Link => {
                let c = cost(&vc_one, &node.op)?;
                (Resource::Link, c, c)
            }
        };
        tasks.push(Task {
            resource,
            single: one.seconds,
            parallel: all.seconds,
        });
    }
    Ok(Instance {
        tensor_cores: config.tensor_cores,
        vector_cores: config.vector_cores,
        tasks,
        edges: graph.edges.clone(),
    })
}

/// The scheduling instance of `graph` on `config`, estimated by `model`.
pub fn instance(
    graph: &OpGraph,
    config: &AcceleratorConfig,
    model: &dyn LatencyModel,
) -> Result<Instance, EstimateError> {
    instance_with(graph, config, |core, op| {
        Ok(estimate(model, core, std::slice::from_ref(op))?[0])
    })
}
