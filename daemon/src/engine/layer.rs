//! A layer's operator graph as a scheduling instance on one accelerator: every operator's
//! duration on one core and on all cores of its type, from the latency model.

use super::estimate::estimate;
use super::model::{Core, OpGraph};
use super::schedule::{Instance, Resource, Task};
use archplace_plugin_sdk::{AcceleratorConfig, EstimateError, LatencyModel};

/// The scheduling instance of `graph` on `config`.
pub fn instance(
    graph: &OpGraph,
    config: &AcceleratorConfig,
    model: &dyn LatencyModel,
) -> Result<Instance, EstimateError> {
    let tc_all = config.tensor_core(config.tensor_cores);
    let tc_one = config.tensor_core(1);
    let vc_all = config.vector_core(config.vector_cores);
    let vc_one = config.vector_core(1);
    let mut tasks = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let ops = std::slice::from_ref(&node.op);
        let (resource, one, all) = match node.core {
            Core::Tensor | Core::Fused => (
                if node.core == Core::Tensor {
                    Resource::Tensor
                } else {
                    Resource::Fused
                },
                estimate(model, &tc_one, ops)?,
                estimate(model, &tc_all, ops)?,
            ),
            Core::Vector => (
                Resource::Vector,
                estimate(model, &vc_one, ops)?,
                estimate(model, &vc_all, ops)?,
            ),
            Core::Link => {
                let c = estimate(model, &vc_one, ops)?;
                (Resource::Link, c.clone(), c)
            }
        };
        tasks.push(Task {
            resource,
            single: one[0].seconds,
            parallel: all[0].seconds,
        });
    }
    Ok(Instance {
        tensor_cores: config.tensor_cores,
        vector_cores: config.vector_cores,
        tasks,
        edges: graph.edges.clone(),
    })
}
