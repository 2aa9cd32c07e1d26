//! `archplace plugin check FILE.wasm`: loads a component the way the daemon does, runs a
//! golden batch (areas of fixed configurations, latencies of every kind of operator on
//! tensor and vector cores), runs it again on fresh instances to check determinism, and
//! measures it. A plugin that faults, rejects its default parameters, does not support an
//! operator, or answers differently twice while claiming determinism is unfit.

use super::{Host, Loaded, PluginError};
use archplace_plugin_sdk::{
    AcceleratorConfig, CoreConfig, Direction, EstimateError, FusedOp, Gemm, ModelInfo, Op, OpCost,
    OpKind, Parameter, VectorKind,
};
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// The golden batch's configurations: corners and middle of the default space.
pub fn golden_configs() -> Vec<AcceleratorConfig> {
    let mut v = Vec::new();
    for (t, w, d, vc, vw, mib) in [
        (1, 16, 16, 1, 16, 8),
        (1, 64, 64, 1, 64, 8),
        (2, 128, 128, 2, 128, 32),
        (4, 128, 64, 4, 256, 64),
        (8, 64, 128, 8, 64, 16),
        (16, 32, 32, 16, 32, 128),
        (2, 256, 256, 2, 256, 128),
        (64, 16, 16, 64, 16, 8),
        (256, 16, 16, 256, 16, 8),
        (256, 256, 256, 256, 256, 128),
    ] {
        v.push(AcceleratorConfig {
            tensor_cores: t,
            vector_cores: vc,
            width: w,
            depth: d,
            vector_width: vw,
            buffer_bytes: mib << 20,
        });
    }
    v
}

/// The golden batch's tensor-core operators (GEMMs, some with fused epilogues, an
/// all-reduce, and a causal grouped-query fused attention kernel both ways).
pub fn golden_tensor_ops() -> Vec<Op> {
    let mut ops = Vec::new();
    for (batch, m, n, k) in [
        (1, 2048, 12288, 12288),
        (1, 2048, 4608, 12288),
        (96, 2048, 2048, 128),
        (96, 2048, 128, 2048),
        (1, 512, 1024, 4096),
        (1, 8, 8, 8),
        (4, 1, 50257, 1600),
    ] {
        for direction in [Direction::Forward, Direction::Backward] {
            ops.push(Op {
                kind: OpKind::Gemm(Gemm { batch, m, n, k }),
                direction,
                fused: vec![],
                element: archplace_plugin_sdk::ElementType::Bf16,
            });
        }
    }
    ops.push(Op {
        kind: OpKind::Gemm(Gemm {
            batch: 1,
            m: 2048,
            n: 4096,
            k: 1024,
        }),
        direction: Direction::Forward,
        fused: vec![
            FusedOp {
                kind: VectorKind::BiasAdd,
                elements: 2048 * 4096,
            },
            FusedOp {
                kind: VectorKind::Gelu,
                elements: 2048 * 4096,
            },
        ],
        element: archplace_plugin_sdk::ElementType::Bf16,
    });
    ops.push(Op {
        kind: OpKind::AllReduce {
            bytes: 2048 * 12288 * 2,
            group: 8,
            link_bytes_per_second: 4 << 30,
        },
        direction: Direction::Forward,
        fused: vec![],
        element: archplace_plugin_sdk::ElementType::Bf16,
    });
    for direction in [Direction::Forward, Direction::Backward] {
        ops.push(Op {
            kind: OpKind::Attention(archplace_plugin_sdk::Attention {
                batch: 1,
                heads: 32,
                kv_heads: 8,
                seq: 4096,
                head_dim: 128,
                value_dim: 128,
                causal: true,
            }),
            direction,
            fused: vec![],
            element: archplace_plugin_sdk::ElementType::Bf16,
        });
    }
    ops
}

/// The golden batch's vector-core operators: every kind, both directions.
pub fn golden_vector_ops() -> Vec<Op> {
    let mut ops = Vec::new();
    for kind in VectorKind::ALL {
        let row = match kind {
            VectorKind::Softmax => 2048,
            VectorKind::CrossEntropy => 50304,
            VectorKind::LayerNorm | VectorKind::RmsNorm => 4096,
            _ => 1,
        };
        for direction in [Direction::Forward, Direction::Backward] {
            ops.push(Op {
                kind: OpKind::Vector {
                    kind,
                    elements: 2048 * 4096,
                    row,
                },
                direction,
                fused: vec![],
                element: archplace_plugin_sdk::ElementType::Bf16,
            });
        }
    }
    ops
}

/// What `plugin check` found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The component checked.
    pub path: String,
    /// Its blake3 hash, hex.
    pub blake3: String,
    /// Its size.
    pub size_bytes: u64,
    /// What it says of itself.
    pub info: ModelInfo,
    /// The interface version it exports.
    pub interface: String,
    /// Compiling it.
    pub compile_seconds: f64,
    /// Loading it again from the compilation cache.
    pub cached_load_seconds: f64,
    /// Golden configurations asked of its area model.
    pub configurations: usize,
    /// Of those, the ones it said are outside its domain.
    pub configurations_out_of_domain: usize,
    /// Latency calls made.
    pub latency_calls: usize,
    /// Operators those calls carried.
    pub operators_estimated: usize,
    /// Of the GEMMs and vector operators answered, those with a memory time (interface
    /// 1.1): without them archplace cannot hold overlapping operators to the chip's memory
    /// bandwidth nor tell a compute-bound chip from a memory-bound one.
    pub operators_with_memory_time: usize,
    /// Of those, the ones without.
    pub operators_without_memory_time: usize,
    /// A plugin that says it is deterministic answered the golden batch twice alike.
    pub deterministic_as_claimed: bool,
    /// Wall time per operator in a batch.
    pub seconds_per_operator: f64,
    /// Fuel per operator in a batch.
    pub fuel_per_operator: f64,
    /// Largest fraction of a call's fuel budget that one golden call used.
    pub max_fuel_fraction: f64,
    /// blake3 over the bits of every answer: equal digests mean identical answers.
    pub digest: String,
    /// Why it is not fit to use (empty when it is).
    pub problems: Vec<String>,
    /// What a vendor should know but does not make it unfit.
    pub warnings: Vec<String>,
    /// Whether archplace can use it.
    pub fit: bool,
}

struct Answers {
    areas: Vec<Result<f64, EstimateError>>,
    costs: Vec<Result<Vec<OpCost>, EstimateError>>,
    calls: usize,
    ops: usize,
    seconds: f64,
    fuel: u64,
    max_fuel_fraction: f64,
    /// GEMMs and vector operators answered with and without a memory time (collectives,
    /// which the links bound, are not counted).
    memory_times: (usize, usize),
}

fn golden_run(
    host: &Host,
    loaded: &Arc<Loaded>,
    parameters: &[Parameter],
) -> Result<Answers, PluginError> {
    let session = host.open(
        loaded,
        parameters.to_vec(),
        Arc::new(AtomicBool::new(false)),
    )?;
    let configs = golden_configs();
    let info = &loaded.info;
    let areas = if info.provides.area {
        match archplace_plugin_sdk::AreaModel::area_um2(session.as_ref(), &configs) {
            Ok(a) => a,
            Err(e) => vec![Err(e); configs.len()],
        }
    } else {
        Vec::new()
    };
    let mut costs = Vec::new();
    let (tensor_ops, vector_ops) = (golden_tensor_ops(), golden_vector_ops());
    let limits = *session.limits();
    let mut max_fraction: f64 = 0.0;
    let mut ops_estimated = 0;
    let mut memory_times = (0, 0);
    let t = Instant::now();
    if info.provides.latency {
        'configs: for c in &configs {
            let cores: [(CoreConfig, &[Op]); 4] = [
                (c.tensor_core(c.tensor_cores), &tensor_ops),
                (c.tensor_core(1), &tensor_ops),
                (c.vector_core(c.vector_cores), &vector_ops),
                (c.vector_core(1), &vector_ops),
            ];
            for (core, ops) in cores {
                let before = session.counters.fuel.load(Ordering::Relaxed);
                let r = session.latency_uncached(&core, ops);
                let used = session.counters.fuel.load(Ordering::Relaxed) - before;
                let budget = limits.fuel_budget(ops.len());
                max_fraction = max_fraction.max(used as f64 / budget as f64);
                ops_estimated += ops.len();
                if let Ok(costs) = &r {
                    for (op, c) in ops.iter().zip(costs) {
                        match (&op.kind, c.memory_seconds) {
                            (OpKind::AllReduce { .. }, _) => {}
                            (_, Some(_)) => memory_times.0 += 1,
                            (_, None) => memory_times.1 += 1,
                        }
                    }
                }
                let fatal = matches!(&r, Err(e) if !matches!(e, EstimateError::OutOfDomain(_)));
                costs.push(r);
                if fatal {
                    // The plugin is unfit; no need to make it fault again and again.
                    break 'configs;
                }
            }
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    Ok(Answers {
        areas,
        calls: costs.len(),
        ops: ops_estimated,
        costs,
        seconds,
        fuel: session.counters.fuel.load(Ordering::Relaxed),
        max_fuel_fraction: max_fraction,
        memory_times,
    })
}

fn digest(a: &Answers) -> String {
    let mut h = blake3::Hasher::new();
    for r in &a.areas {
        match r {
            Ok(x) => h.update(&x.to_bits().to_le_bytes()),
            Err(e) => h.update(e.to_string().as_bytes()),
        };
    }
    for r in &a.costs {
        match r {
            Ok(v) => {
                for c in v {
                    h.update(&c.seconds.to_bits().to_le_bytes());
                    h.update(&c.joules.to_bits().to_le_bytes());
                    if let Some(m) = c.memory_seconds {
                        h.update(&m.to_bits().to_le_bytes());
                    }
                }
            }
            Err(e) => {
                h.update(e.to_string().as_bytes());
            }
        }
    }
    h.finalize().to_hex().to_string()
}

/// Checks the component at `path` with `parameters` (none: its defaults).
pub fn check(host: &Host, path: &Path, parameters: &[Parameter]) -> Result<Report, PluginError> {
    let loaded = host.load_file(path)?;
    // A second load as the daemon's next start would do it: from the disk cache.
    let cached_load_seconds = match super::Host::new(host.options().clone()) {
        Ok(fresh) => {
            let t = Instant::now();
            fresh
                .load_file(path)
                .map(|_| t.elapsed().as_secs_f64())
                .unwrap_or(f64::NAN)
        }
        Err(_) => f64::NAN,
    };
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let first = golden_run(host, &loaded, parameters)?;
    for (i, r) in first.costs.iter().enumerate() {
        if let Err(e) = r {
            match e {
                EstimateError::OutOfDomain(_) => {}
                other => {
                    problems.push(format!(
                        "latency call {i} of the golden batch failed: {other}"
                    ));
                }
            }
        }
    }
    for (i, r) in first.areas.iter().enumerate() {
        if let Err(e) = r
            && !matches!(e, EstimateError::OutOfDomain(_))
        {
            problems.push(format!("area of golden configuration {i} failed: {e}"));
        }
    }
    // Determinism: the same batch on fresh instances (only worth it if the first passed).
    let d1 = digest(&first);
    let same = if problems.is_empty() {
        digest(&golden_run(host, &loaded, parameters)?) == d1
    } else {
        true
    };
    if loaded.info.deterministic && !same {
        problems.push(
            "it claims to be deterministic, but two runs of the golden batch on fresh instances differ"
                .into(),
        );
    }
    if !loaded.info.deterministic {
        warnings.push(
            "it says it is not deterministic: its estimates are not memoised across searches"
                .into(),
        );
    }
    if first.max_fuel_fraction > 0.5 {
        warnings.push(format!(
            "one golden call used {:.0}% of its fuel budget: larger batches may run out (raise the plugin's limits)",
            100.0 * first.max_fuel_fraction
        ));
    }
    let (with_memory, without_memory) = first.memory_times;
    if without_memory > 0 && loaded.info.provides.latency {
        warnings.push(format!(
            "{without_memory} of {} operators have no memory time (interface 1.1's `memory_seconds`): overlapping operators are not held to the chip's memory bandwidth, and explanations cannot tell compute from memory bandwidth",
            with_memory + without_memory
        ));
    }
    problems.dedup();
    let out_of_domain = first
        .areas
        .iter()
        .filter(|a| matches!(a, Err(EstimateError::OutOfDomain(_))))
        .count();
    Ok(Report {
        path: path.display().to_string(),
        blake3: loaded.hash.to_hex().to_string(),
        size_bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        info: loaded.info.clone(),
        interface: format!("archplace:cost-model@{}", loaded.interface),
        compile_seconds: loaded.compile_seconds,
        cached_load_seconds,
        configurations: golden_configs().len(),
        configurations_out_of_domain: out_of_domain,
        latency_calls: first.calls,
        operators_estimated: first.ops,
        operators_with_memory_time: with_memory,
        operators_without_memory_time: without_memory,
        deterministic_as_claimed: !loaded.info.deterministic || same,
        seconds_per_operator: first.seconds / first.ops.max(1) as f64,
        fuel_per_operator: first.fuel as f64 / first.ops.max(1) as f64,
        max_fuel_fraction: first.max_fuel_fraction,
        digest: d1,
        fit: problems.is_empty(),
        problems,
        warnings,
    })
}
