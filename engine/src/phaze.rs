//! The reference system's device-placement file format (`docs/reference.md` §2), so that
//! `archplace placement` can be run on the reference's inputs and compared with its outputs.
//! Units are as given: the reference mixes milliseconds (latencies) with seconds
//! (`bytes / bandwidth`), and we keep that here, and only here.

use crate::placement::{
    self, Chain, Edge, Fixed, FixedError, Layer, MemoryRule, Plan, Resync, Settings,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Input {
    pub max_memory_per_device: f64,
    pub max_devices: f64,
    pub bandwidth: f64,
    pub mbs_in_batch: f64,
    pub nodes: BTreeMap<String, Vec<Node>>,
    pub edges: BTreeMap<String, Vec<InputEdge>>,
    pub activation_recomputation: bool,
    pub optimizer_algorithm: String,
    #[serde(rename = "fixedPP")]
    pub fixed_pp: Option<u64>,
    #[serde(rename = "fixedTMPC")]
    pub fixed_tmpc: Option<u64>,
    #[serde(rename = "fixedDP")]
    pub fixed_dp: Option<u64>,
    pub num_transformer_layers: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub id: i64,
    pub parameter_size: f64,
    pub activation_size: f64,
    pub optimal_latency_fw: f64,
    pub optimal_latency_bw: f64,
    pub is_tensor_parallelized: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InputEdge {
    pub source_id: i64,
    pub dest_id: i64,
    pub communication_cost: f64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputStage {
    pub nodes: Vec<i64>,
    pub devices_for_stage: u64,
}

/// The reference's output fields; `null` where it leaves them uninitialised.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    pub stages: Vec<OutputStage>,
    pub data_parallel_degree: Option<u64>,
    pub tensor_parallel_degree: Option<u64>,
    pub final_time_per_batch: Option<f64>,
    pub fixed_strategy_time_per_batch: Option<f64>,
    /// Why there is no placement or no fixed-strategy time, when there is not.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<String>,
}

/// A problem in an input file, with its place.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{location}: {message}")]
pub struct InputError {
    /// `line:column` for syntax and type errors, the field path otherwise.
    pub location: String,
    pub message: String,
}

fn invalid(location: impl Into<String>, message: impl Into<String>) -> InputError {
    InputError {
        location: location.into(),
        message: message.into(),
    }
}

/// Parses an input file.
pub fn parse(text: &str) -> Result<Input, InputError> {
    parse_json(text)
}

/// Deserializes JSON, locating an error by line, column and field.
fn parse_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, InputError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        invalid(
            format!(
                "line {}, column {} (field {})",
                inner.line(),
                inner.column(),
                path
            ),
            inner
                .to_string()
                .split(" at line")
                .next()
                .unwrap_or("")
                .to_string(),
        )
    })
}

/// The validated problem: one chain per width, in width order.
pub struct Problem {
    pub chains: Vec<Chain>,
    pub settings: Settings,
    pub fixed: Option<Fixed>,
}

/// Checks the input as the reference does and orders each width's layers along the chain.
pub fn problem(input: &Input) -> Result<Problem, InputError> {
    let optimizer_copies = check_settings(input)?;
    if input.nodes.is_empty() {
        return Err(invalid("nodes", "no tensor-parallel width"));
    }
    let widths: BTreeSet<&String> = input.nodes.keys().collect();
    if widths != input.edges.keys().collect() {
        return Err(invalid(
            "edges",
            "the widths of `edges` differ from those of `nodes`",
        ));
    }
    let mut chains = Vec::new();
    // Every width has the layers and edges of the first.
    let mut reference_ids: Option<BTreeSet<i64>> = None;
    let mut reference_edges: Option<BTreeSet<(i64, i64)>> = None;
    for (key, nodes) in &input.nodes {
        let width: u64 = key.parse().ok().filter(|&t: &u64| t >= 1).ok_or_else(|| {
            invalid(
                format!("nodes.{key}"),
                "width keys must be positive integers",
            )
        })?;
        let index = node_index(key, width, nodes)?;
        let ids: BTreeSet<i64> = index.keys().copied().collect();
        same_as_first(&mut reference_ids, ids, format!("nodes.{key}"), "layers")?;
        let edges = &input.edges[key];
        let lists = edge_lists(key, nodes.len(), edges, &index)?;
        same_as_first(
            &mut reference_edges,
            lists.pairs.clone(),
            format!("edges.{key}"),
            "edges",
        )?;
        let order = topological_order(key, lists)?;
        chains.push(chain(width, nodes, edges, &index, &order));
    }
    chains.sort_by_key(|c| c.width);
    let settings = Settings {
        memory_bytes: input.max_memory_per_device,
        devices: input.max_devices as u64,
        bandwidth: input.bandwidth,
        micro_batches: input.mbs_in_batch.trunc() as u64,
        recompute: input.activation_recomputation,
        memory: MemoryRule::Reference { optimizer_copies },
        resync: Resync::FirstStage,
        bubble_per_stage: 1.0,
        runnable: Default::default(),
    };
    let fixed = match (
        input.fixed_pp,
        input.fixed_tmpc,
        input.fixed_dp,
        input.num_transformer_layers,
    ) {
        (Some(pipeline), Some(tensor), Some(data), Some(transformer_layers)) => Some(Fixed {
            pipeline,
            tensor,
            data,
            transformer_layers,
        }),
        _ => None,
    };
    Ok(Problem {
        chains,
        settings,
        fixed,
    })
}

/// Checks the scalar settings; the optimizer's copies of the weights.
fn check_settings(input: &Input) -> Result<f64, InputError> {
    if !(1.0..=10000.0).contains(&input.max_devices) || input.max_devices.fract() != 0.0 {
        return Err(invalid(
            "maxDevices",
            format!(
                "{} devices: must be an integer from 1 to 10000",
                input.max_devices
            ),
        ));
    }
    if input.bandwidth.is_nan() || input.bandwidth <= 0.0 {
        return Err(invalid("bandwidth", "must be positive"));
    }
    if input.max_memory_per_device.is_nan() || input.max_memory_per_device <= 0.0 {
        return Err(invalid("maxMemoryPerDevice", "must be positive"));
    }
    if input.mbs_in_batch.is_nan() || input.mbs_in_batch < 1.0 {
        return Err(invalid("mbsInBatch", "must be at least 1"));
    }
    match input.optimizer_algorithm.as_str() {
        "SGD" => Ok(0.0),
        "Adam" => Ok(1.0),
        other => Err(invalid(
            "optimizerAlgorithm",
            format!("`{other}`: must be \"SGD\" or \"Adam\""),
        )),
    }
}

/// `found` where no width was seen yet; else an error at `field` unless it equals the
/// first width's (`what`: the layers or the edges).
fn same_as_first<T: PartialEq>(
    first: &mut Option<T>,
    found: T,
    field: String,
    what: &str,
) -> Result<(), InputError> {
    match first {
        None => *first = Some(found),
        Some(r) if *r != found => {
            return Err(invalid(
                field,
                format!("the {what} differ from those of the other widths"),
            ));
        }
        _ => {}
    }
    Ok(())
}

/// The index of each layer id among `nodes` (width `width`), every number checked.
fn node_index(key: &str, width: u64, nodes: &[Node]) -> Result<HashMap<i64, usize>, InputError> {
    let at = |i: usize, f: &str| format!("nodes.{key}[{i}].{f}");
    let mut index: HashMap<i64, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for (f, v) in [
            ("parameterSize", n.parameter_size),
            ("activationSize", n.activation_size),
            ("optimalLatencyFw", n.optimal_latency_fw),
            ("optimalLatencyBw", n.optimal_latency_bw),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(
                    at(i, f),
                    format!("{v} is not a finite, non-negative number"),
                ));
            }
        }
        if width == 1 && n.is_tensor_parallelized {
            return Err(invalid(
                at(i, "isTensorParallelized"),
                "a layer cannot be tensor-parallel at width 1",
            ));
        }
        if index.insert(n.id, i).is_some() {
            return Err(invalid(
                at(i, "id"),
                format!("layer {} appears twice", n.id),
            ));
        }
    }
    Ok(index)
}

/// A width's edges: as id pairs, and as successor lists and in-degrees by layer index.
struct EdgeLists {
    pairs: BTreeSet<(i64, i64)>,
    succ: HashMap<usize, Vec<usize>>,
    indegree: Vec<usize>,
}

/// The edges of width `key` among its `n` layers, checked: known layers, no self-loop or
/// parallel edge, finite costs.
fn edge_lists(
    key: &str,
    n: usize,
    edges: &[InputEdge],
    index: &HashMap<i64, usize>,
) -> Result<EdgeLists, InputError> {
    let mut pairs = BTreeSet::new();
    let mut succ: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut indegree = vec![0usize; n];
    for (i, e) in edges.iter().enumerate() {
        let ea = |f: &str| format!("edges.{key}[{i}].{f}");
        let (Some(&u), Some(&v)) = (index.get(&e.source_id), index.get(&e.dest_id)) else {
            return Err(invalid(
                ea("sourceId"),
                format!(
                    "edge {} → {} names an unknown layer",
                    e.source_id, e.dest_id
                ),
            ));
        };
        if u == v {
            return Err(invalid(
                ea("destId"),
                format!("self-loop on layer {}", e.source_id),
            ));
        }
        if !pairs.insert((e.source_id, e.dest_id)) {
            return Err(invalid(
                ea("destId"),
                format!("parallel edge {} → {}", e.source_id, e.dest_id),
            ));
        }
        if !(e.communication_cost.is_finite() && e.communication_cost >= 0.0) {
            return Err(invalid(
                ea("communicationCost"),
                "must be a finite, non-negative number",
            ));
        }
        succ.entry(u).or_default().push(v);
        indegree[v] += 1;
    }
    Ok(EdgeLists {
        pairs,
        succ,
        indegree,
    })
}

/// A topological order of the layers: Kahn's algorithm with a LIFO ready list seeded in
/// input order (the reference's).
fn topological_order(key: &str, lists: EdgeLists) -> Result<Vec<usize>, InputError> {
    let EdgeLists {
        succ, mut indegree, ..
    } = lists;
    let n = indegree.len();
    let mut ready: Vec<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(u) = ready.pop() {
        order.push(u);
        for &v in succ.get(&u).map(Vec::as_slice).unwrap_or(&[]) {
            indegree[v] -= 1;
            if indegree[v] == 0 {
                ready.push(v);
            }
        }
    }
    if order.len() != n {
        return Err(invalid(
            format!("edges.{key}"),
            "the layer graph has a cycle",
        ));
    }
    Ok(order)
}

/// The chain of one width: its layers in `order`, its edges between their positions.
fn chain(
    width: u64,
    nodes: &[Node],
    edges: &[InputEdge],
    index: &HashMap<i64, usize>,
    order: &[usize],
) -> Chain {
    let mut position = vec![0; nodes.len()];
    for (p, &i) in order.iter().enumerate() {
        position[i] = p;
    }
    let layers = order
        .iter()
        .map(|&i| {
            let n = &nodes[i];
            Layer {
                id: n.id,
                parameter_bytes: n.parameter_size,
                activation_bytes: n.activation_size,
                workspace_bytes: 0.0,
                forward: n.optimal_latency_fw,
                backward: n.optimal_latency_bw,
                tensor_parallel: n.is_tensor_parallelized,
            }
        })
        .collect();
    let chain_edges = edges
        .iter()
        .map(|e| Edge {
            from: position[index[&e.source_id]],
            to: position[index[&e.dest_id]],
            bytes: e.communication_cost,
        })
        .collect();
    Chain {
        width,
        layers,
        edges: chain_edges,
    }
}

fn output_stages(chains: &[Chain], plan: &Plan) -> Vec<OutputStage> {
    let chain = chains.iter().find(|c| c.width == plan.tensor_parallel);
    plan.stages
        .iter()
        .map(|s| OutputStage {
            nodes: chain
                .map(|c| c.layers[s.start..s.end].iter().map(|l| l.id).collect())
                .unwrap_or_default(),
            devices_for_stage: s.devices,
        })
        .collect()
}

/// Solves an input file's problem and fills the reference's output fields.
pub fn solve(problem: &Problem) -> Result<Output, placement::PlacementError> {
    let best = placement::best_plan(&problem.chains, &problem.settings)?;
    let mut messages = Vec::new();
    let fixed: Option<Result<Plan, FixedError>> = problem
        .fixed
        .as_ref()
        .map(|f| placement::evaluate_fixed(&problem.chains, &problem.settings, f));
    let fixed_time = match fixed {
        Some(Ok(p)) => Some(p.time_per_batch),
        Some(Err(e)) => {
            messages.push(format!("the fixed strategy is infeasible: {e}"));
            None
        }
        None => None,
    };
    Ok(match best {
        Some(plan) => Output {
            stages: output_stages(&problem.chains, &plan),
            data_parallel_degree: Some(plan.data_parallel),
            tensor_parallel_degree: Some(plan.tensor_parallel),
            final_time_per_batch: Some(plan.time_per_batch),
            fixed_strategy_time_per_batch: fixed_time,
            messages,
        },
        None => {
            messages.insert(
                0,
                "no placement fits: at every width some layer needs more memory than a device has"
                    .into(),
            );
            Output {
                stages: Vec::new(),
                data_parallel_degree: None,
                tensor_parallel_degree: None,
                final_time_per_batch: None,
                fixed_strategy_time_per_batch: fixed_time,
                messages,
            }
        }
    })
}

/// The reference's single-layer scheduling problems (`tests/fixtures/schedule`; the format
/// is described in `docs/reference.md` §2).
pub mod schedule {
    use super::{InputError, invalid};
    use crate::schedule::{Instance, Mode, Resource, Schedule, Task};
    use serde::{Deserialize, Serialize};
    use std::collections::HashMap;

    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Input {
        pub tensor_cores: u32,
        pub vector_cores: u32,
        pub ops: Vec<InputOp>,
        pub edges: Vec<(i64, i64)>,
    }

    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct InputOp {
        pub id: i64,
        pub core: Core,
        pub latency: f64,
        pub parallel_latency: f64,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Core {
        Tensor,
        Vector,
        Fused,
        None,
    }

    #[derive(Debug, Clone, Serialize)]
    pub struct OutputOp {
        pub id: i64,
        pub core: Core,
        /// `single`, `parallel` (all cores of its type), or `none` for operators that take
        /// no time.
        pub mode: &'static str,
        pub tensor_core: Option<u32>,
        pub vector_core: Option<u32>,
        pub start: f64,
        pub finish: f64,
    }

    #[derive(Debug, Clone, Serialize)]
    pub struct Output {
        /// In the input's time unit.
        pub makespan: f64,
        pub lower_bound: f64,
        pub proven_optimal: bool,
        pub gap: f64,
        pub method: crate::schedule::Method,
        pub hit_time_limit: bool,
        pub solve_seconds: f64,
        pub ops: Vec<OutputOp>,
    }

    pub fn parse(text: &str) -> Result<Input, InputError> {
        super::parse_json(text)
    }

    /// The instance, with operators in input order.
    pub fn instance(input: &Input) -> Result<Instance, InputError> {
        let mut index = HashMap::new();
        for (i, op) in input.ops.iter().enumerate() {
            if index.insert(op.id, i).is_some() {
                return Err(invalid(
                    format!("ops[{i}].id"),
                    format!("operator {} appears twice", op.id),
                ));
            }
            for (f, v) in [
                ("latency", op.latency),
                ("parallel_latency", op.parallel_latency),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(invalid(
                        format!("ops[{i}].{f}"),
                        format!("{v} is not a finite, non-negative time"),
                    ));
                }
            }
        }
        let mut edges = Vec::new();
        for (k, &(a, b)) in input.edges.iter().enumerate() {
            match (index.get(&a), index.get(&b)) {
                (Some(&x), Some(&y)) => edges.push((x, y)),
                _ => {
                    return Err(invalid(
                        format!("edges[{k}]"),
                        format!("edge {a} → {b} names an unknown operator"),
                    ));
                }
            }
        }
        let tasks = input
            .ops
            .iter()
            .map(|op| {
                let resource = match op.core {
                    Core::Tensor => Resource::Tensor,
                    Core::Vector => Resource::Vector,
                    Core::Fused => Resource::Fused,
                    Core::None => Resource::None,
                };
                // The reference's format has no memory times.
                Task::new(resource, op.latency, op.parallel_latency)
            })
            .collect();
        Ok(Instance {
            tensor_cores: input.tensor_cores,
            vector_cores: input.vector_cores,
            tasks,
            edges,
        })
    }

    pub fn output(input: &Input, s: &Schedule) -> Output {
        let ops = input
            .ops
            .iter()
            .zip(&s.placements)
            .map(|(op, p)| OutputOp {
                id: op.id,
                core: op.core,
                mode: match (op.core, p.mode) {
                    (Core::None, _) => "none",
                    (_, Mode::Single) => "single",
                    (_, Mode::Parallel) => "parallel",
                },
                tensor_core: p.tensor_core,
                vector_core: p.vector_core,
                start: p.start,
                finish: p.finish,
            })
            .collect();
        Output {
            makespan: s.makespan,
            lower_bound: s.lower_bound,
            proven_optimal: s.optimal,
            gap: s.gap,
            method: s.method,
            hit_time_limit: s.hit_time_limit,
            solve_seconds: s.solve_seconds,
            ops,
        }
    }
}
