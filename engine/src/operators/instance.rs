//! A layer's operator graph as a scheduling instance on one accelerator: every operator's
//! duration on one core and on all cores of its type, from the latency model, restricted
//! to what the [`Execution`] allows.

use super::estimate::estimate;
use crate::execution::{Execution, TensorParallelOverlap};
use crate::model::{Core, OpGraph};
use crate::schedule::{Instance, Resource, ScheduleError, Skeleton, Task};
use archplace_plugin_sdk::OpKind;
use archplace_plugin_sdk::{
    AcceleratorConfig, CoreConfig, EstimateError, Gemm, LatencyModel, Op, OpCost,
};

/// The scheduling instance of `graph` on `config` under `execution`, with `cost`
/// answering for one operator on some cores (the search passes its memo; [`instance`] asks
/// the model directly). Sequential execution asks only for all-cores durations.
pub fn instance_with(
    graph: &OpGraph,
    config: &AcceleratorConfig,
    execution: Execution,
    cost: impl FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
) -> Result<Instance, EstimateError> {
    Ok(super::restrict(
        Instance {
            tensor_cores: config.tensor_cores,
            vector_cores: config.vector_cores,
            tasks: unrestricted_tasks(graph, config, execution, cost)?,
            edges: graph.edges.clone(),
        },
        execution,
    ))
}

/// The operators of [`instance_with`]'s instance (of an acyclic graph), without its
/// dependencies: what a layer's [`skeleton`] bounds it with.
pub fn tasks_with(
    graph: &OpGraph,
    config: &AcceleratorConfig,
    execution: Execution,
    cost: impl FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
) -> Result<Vec<Task>, EstimateError> {
    let mut tasks = unrestricted_tasks(graph, config, execution, cost)?;
    if execution != Execution::DATAFLOW {
        super::restrict::restrict_durations(&mut tasks, execution);
    }
    Ok(tasks)
}

/// The structure of `graph`'s instances under `execution` on any chip ([`Skeleton`]):
/// an error for a cyclic or malformed graph (whose instances [`crate::schedule`] refuses).
pub fn skeleton(graph: &OpGraph, execution: Execution) -> Result<Skeleton, ScheduleError> {
    let resources: Vec<Resource> = graph.nodes.iter().map(|n| resource(n.core)).collect();
    let edges = super::restrict::restricted_edges(&resources, &graph.edges, execution)
        .ok_or(ScheduleError::Cycle)?;
    Skeleton::new(&resources, &edges)
}

/// The resource an operator of `core` occupies.
fn resource(core: Core) -> Resource {
    match core {
        Core::Tensor => Resource::Tensor,
        Core::Fused => Resource::Fused,
        Core::Vector => Resource::Vector,
        Core::Link => Resource::Link,
    }
}

/// The operators' durations before [`super::restrict`].
fn unrestricted_tasks(
    graph: &OpGraph,
    config: &AcceleratorConfig,
    execution: Execution,
    mut cost: impl FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
) -> Result<Vec<Task>, EstimateError> {
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
    if execution.all_cores_only() {
        match execution.tensor_parallel_overlap {
            TensorParallelOverlap::None => {}
            TensorParallelOverlap::Pipelined => {
                pipeline_collectives(graph, &mut tasks, execution.overlap_efficiency.0);
            }
            TensorParallelOverlap::Async => {
                let share = execution.overlap_efficiency.0;
                decompose_collective_gemms(graph, &mut tasks, (&tc_all, share), &mut cost)?;
            }
        }
    }
    Ok(tasks)
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

/// The time a collective of `collective` seconds adds to the GEMM it is pipelined with
/// (`gemm` seconds), both cut into `chunks`: the all-gather's ring exchanges feed the
/// GEMM chunk by chunk, the reduce-scatter's take its output chunk by chunk, so one
/// chunk of the collective is exposed while the GEMM is the longer (`collective / k`),
/// and all but `k − 1` chunks of the GEMM while the collective is
/// (`collective − gemm·(k − 1)/k`): `k` steps of `max(c, g)/k` plus one chunk of the
/// other. NVIDIA's description of the overlap: NeMo's "Communication Overlap" page
/// (tensor-parallel section), Transformer Engine's `comm_gemm_overlap`.
pub fn pipelined_exposure(collective: f64, gemm: f64, chunks: u32) -> f64 {
    let k = f64::from(chunks.max(1));
    (collective / k).max(collective - gemm * (k - 1.0) / k)
}

/// With sequential operators and tensor-parallel overlap (Transformer Engine's
/// `tp_comm_overlap`, which Megatron-LM allows only with sequence parallelism): each
/// sequence-parallel collective ([`crate::model::OpNode::pipelined`]) is pipelined with
/// the GEMM it feeds (an all-gather) or else the GEMM it drains (a reduce-scatter), in
/// as many chunks as the group has ranks, so its task keeps only what
/// [`pipelined_exposure`] leaves exposed. The collectives with no such dependency (the
/// backward pass's extra all-gather for the weight gradient, the input gradient's
/// reduce-scatter under the weight-gradient GEMM) overlap as the graph lets them: NVIDIA's
/// "bulk" overlap. Beside the GEMM a chunk moves at its rate alone for `share` of the
/// GEMM's time (the cluster's `overlap_efficiency`).
fn pipeline_collectives(graph: &OpGraph, tasks: &mut [Task], share: f64) {
    for p in partners(graph) {
        let Some(gemm) = p.gemms.iter().map(|&j| tasks[j].parallel).reduce(f64::max) else {
            continue;
        };
        let gemm = share * gemm;
        let t = &mut tasks[p.collective];
        let exposed = pipelined_exposure(t.parallel, gemm, p.group);
        t.single = exposed;
        t.parallel = exposed;
    }
}

/// A sequence-parallel collective and the GEMMs it is overlapped with.
struct Partner {
    collective: usize,
    /// The GEMMs it feeds (an all-gather), or else those it drains (a reduce-scatter).
    gemms: Vec<usize>,
    group: u32,
    /// The collective gathers the GEMMs' input (else it reduce-scatters their output).
    gathers: bool,
}

/// Each pipelined collective of `graph` ([`crate::model::OpNode::pipelined`]) with the
/// GEMMs it feeds (an all-gather), or else those it drains (a reduce-scatter): from the
/// graph alone, so that a memo's prefetch asks for the operators the instance will.
fn partners(graph: &OpGraph) -> Vec<Partner> {
    let gemms = |ends: Vec<usize>| -> Vec<usize> {
        ends.into_iter()
            .filter(|&j| matches!(graph.nodes[j].op.kind, OpKind::Gemm(_)))
            .collect()
    };
    let mut found = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let OpKind::AllReduce { group, .. } = node.op.kind else {
            continue;
        };
        if !node.pipelined {
            continue;
        }
        let consumers = gemms(
            graph
                .edges
                .iter()
                .filter(|e| e.0 == i)
                .map(|e| e.1)
                .collect(),
        );
        let (gemms, gathers) = if consumers.is_empty() {
            let producers = graph.edges.iter().filter(|e| e.1 == i).map(|e| e.0);
            (gemms(producers.collect()), false)
        } else {
            (consumers, true)
        };
        if !gemms.is_empty() {
            found.push(Partner {
                collective: i,
                gemms,
                group,
                gathers,
            });
        }
    }
    found
}

/// With PyTorch's asynchronous tensor parallelism ([`TensorParallelOverlap::Async`]):
/// the GEMMs each sequence-parallel collective feeds (all of them whose rows are the
/// gathered tokens: PyTorch fuses one all-gather with every such matmul of the gathered
/// input; a weight gradient, which sums over the tokens, is not one) or drains run as
/// `group` GEMMs of `1/group` of their rows (the rows are the tokens the collective
/// gathers or scatters),
/// each priced by the latency model — their sum is the decomposed GEMM's time, more than
/// the whole's where the smaller GEMMs fill the chip less. The collective keeps what the
/// decomposition leaves exposed: an all-gather's first GEMMs take the rank's own shard,
/// so the `group − 1` transfers hide behind the `group − 1` shards' GEMMs after them
/// (`max(0, c − g·(k − 1)/k)`, `g` the GEMMs' decomposed time); a reduce-scatter's last
/// shard goes out after its GEMM ([`pipelined_exposure`]). Beside the GEMMs the transfers
/// move at their rate alone for `share` of the GEMMs' time (the cluster's
/// `overlap_efficiency`).
fn decompose_collective_gemms(
    graph: &OpGraph,
    tasks: &mut [Task],
    (tensor_cores, share): (&CoreConfig, f64),
    cost: &mut impl FnMut(&CoreConfig, &Op) -> Result<OpCost, EstimateError>,
) -> Result<(), EstimateError> {
    let mut decomposed = vec![false; tasks.len()];
    for mut p in partners(graph) {
        let k = p.group.max(1);
        // A weight gradient contracts over the tokens the collective gathers: its row
        // shards each need every token, and PyTorch's pattern (`fused_all_gather_matmul`,
        // the gathered operand's rows) leaves it out; its collective overlaps only the
        // GEMMs that take the tokens as their rows, or nothing.
        p.gemms
            .retain(|&j| !graph.nodes[j].name.contains(".grad_weight"));
        if p.gemms.is_empty() {
            continue;
        }
        for &j in &p.gemms {
            if decomposed[j] || k <= 1 {
                continue;
            }
            let OpKind::Gemm(g) = graph.nodes[j].op.kind else {
                continue;
            };
            if g.m < u64::from(k) {
                continue;
            }
            let mut shard = graph.nodes[j].op.clone();
            shard.kind = OpKind::Gemm(Gemm {
                m: g.m.div_ceil(u64::from(k)),
                ..g
            });
            let c = cost(tensor_cores, &shard)?;
            let t = &mut tasks[j];
            let whole = f64::from(k) * c.seconds;
            t.single = whole;
            t.parallel = whole;
            t.memory = f64::from(k) * c.memory_seconds.unwrap_or(0.0);
            decomposed[j] = true;
        }
        let gemm: f64 = share * p.gemms.iter().map(|&j| tasks[j].parallel).sum::<f64>();
        let t = &mut tasks[p.collective];
        let kf = f64::from(k);
        let exposed = if p.gathers {
            (t.parallel - gemm * (kf - 1.0) / kf).max(0.0)
        } else {
            pipelined_exposure(t.parallel, gemm, k)
        };
        t.single = exposed;
        t.parallel = exposed;
    }
    Ok(())
}
