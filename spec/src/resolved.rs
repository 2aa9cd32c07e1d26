//! `archplace validate --print-resolved`: a spec as archplace understands it, with every
//! default written out — the answer to "what does leaving `[cluster]` out mean?". The
//! output is itself a spec: read back, it gives the same search (tested), so it can be kept
//! as the explicit version of a short one. Models are written out in full (no preset), and
//! quantities exactly, in the largest unit that divides them.

use super::{CostModelSpec, EstimateSpec, ModelSpec, Spec};
use archplace_cost_port::PluginRef;
use archplace_engine::execution::{CrossEntropy, Fp8Library, KernelFusion};
use archplace_engine::model::{AttentionKernel, Head};
use archplace_engine::search::Strategy;
use archplace_engine::space::{AreaBudget, SpaceSpec};
use archplace_engine::step::{ContextMethod, StepPlan};
use archplace_engine::training::{
    Cluster, MemoryModel, Precision, RecomputeModule, RecomputeModules, Training,
};
use archplace_plugin_sdk::AcceleratorConfig;
use serde::Serialize;
use toml::{Table, Value};

/// `bytes` exactly: "80 GiB", or "1000 B" when no binary unit divides it.
fn bytes(b: u64) -> Value {
    for (unit, name) in [
        (1u64 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ] {
        if b >= unit && b.is_multiple_of(unit) {
            return Value::String(format!("{} {name}", b / unit));
        }
    }
    Value::String(format!("{b} B"))
}

/// A bandwidth exactly: "4 GiB/s", "25 GB/s", or bytes per second.
fn rate(bytes_per_second: f64) -> Value {
    let x = bytes_per_second;
    if x.fract() == 0.0 && (1.0..9.0e15).contains(&x) {
        let n = x as u64;
        for (unit, name) in [
            (1u64 << 30, "GiB/s"),
            (1_000_000_000, "GB/s"),
            (1 << 20, "MiB/s"),
        ] {
            if n.is_multiple_of(unit) {
                return Value::String(format!("{} {name}", n / unit));
            }
        }
    }
    Value::String(format!("{x} B/s"))
}

/// An enum as the spec names it (its serde name).
fn name<T: Serialize>(x: &T) -> Value {
    match serde_json::to_value(x) {
        Ok(serde_json::Value::String(s)) => Value::String(s),
        _ => Value::String(String::new()),
    }
}

fn int(x: u64) -> Value {
    Value::Integer(i64::try_from(x).unwrap_or(i64::MAX))
}

fn ints<T: Copy + Into<u64>>(xs: &[T]) -> Value {
    Value::Array(xs.iter().map(|&x| int(x.into())).collect())
}

fn modules(m: RecomputeModules) -> Value {
    Value::Array(
        m.iter()
            .map(|m| Value::String(RecomputeModule::name(m).into()))
            .collect(),
    )
}

fn bools(xs: &[bool]) -> Value {
    Value::Array(xs.iter().map(|&b| Value::Boolean(b)).collect())
}

fn plugin(r: &PluginRef) -> Value {
    if r.version.is_none() && r.blake3.is_none() {
        return Value::String(r.name.clone());
    }
    let mut t = Table::new();
    t.insert("plugin".into(), Value::String(r.name.clone()));
    if let Some(v) = &r.version {
        t.insert("version".into(), Value::String(v.clone()));
    }
    if let Some(h) = &r.blake3 {
        t.insert("blake3".into(), Value::String(h.clone()));
    }
    Value::Table(t)
}

/// A chip's six axes, as `[accelerator]` and an area budget's `reference_config` write
/// them.
fn chip(k: &AcceleratorConfig) -> Table {
    let mut t = Table::new();
    t.insert("tensor_cores".into(), int(k.tensor_cores.into()));
    t.insert("vector_cores".into(), int(k.vector_cores.into()));
    t.insert("width".into(), int(k.width.into()));
    t.insert("depth".into(), int(k.depth.into()));
    t.insert("vector_width".into(), int(k.vector_width.into()));
    t.insert("buffer".into(), bytes(k.buffer_bytes));
    t
}

/// The spec with every default written out, as TOML.
pub fn resolved(spec: &Spec) -> String {
    let mut doc = Table::new();
    doc.insert("schema_version".into(), Value::Integer(1));
    doc.insert("name".into(), Value::String(spec.name.clone()));
    if let Some(d) = &spec.description {
        doc.insert("description".into(), Value::String(d.clone()));
    }
    doc.insert(
        "models".into(),
        Value::Array(spec.models.iter().map(model).collect()),
    );
    doc.insert("training".into(), Value::Table(training(&spec.training)));
    doc.insert("cluster".into(), Value::Table(cluster(&spec.cluster)));
    doc.insert("search".into(), Value::Table(search(&spec.space)));
    doc.insert(
        "cost_model".into(),
        Value::Table(cost_model(&spec.cost_model)),
    );
    if let Some(e) = &spec.estimate {
        let (accelerator, plan) = estimate(e);
        doc.insert("accelerator".into(), Value::Table(accelerator));
        doc.insert("plan".into(), Value::Table(plan));
    }
    let body = toml::to_string(&doc).unwrap_or_default();
    format!(
        "# `{}` with every default written out (archplace validate --print-resolved).\n{body}",
        spec.name
    )
}

/// A `[[models]]` table: the model in full (no preset) and its baseline.
fn model(m: &ModelSpec) -> Value {
    let c = &m.config;
    let mut t = Table::new();
    t.insert("name".into(), Value::String(c.name.clone()));
    for (k, v) in [
        ("layers", c.layers),
        ("hidden", c.hidden),
        ("heads", c.heads),
        ("kv_heads", c.kv_heads),
        ("ffn", c.ffn),
        ("vocab", c.vocab),
        ("vocab_pad_multiple", c.vocab_pad_multiple),
        ("seq_len", c.seq_len),
        ("max_positions", c.max_positions),
        ("token_types", c.token_types),
        ("max_tensor_parallel", c.max_tensor_parallel),
    ] {
        t.insert(k.into(), int(v));
    }
    for (k, v) in [
        ("gated_mlp", c.gated_mlp),
        ("biases", c.biases),
        ("tied_embeddings", c.tied_embeddings),
        ("dropout", c.dropout),
        ("causal", c.causal),
    ] {
        t.insert(k.into(), Value::Boolean(v));
    }
    t.insert("activation".into(), name(&c.activation));
    t.insert("norm".into(), name(&c.norm));
    t.insert("norm_position".into(), name(&c.norm_position));
    t.insert("positions".into(), name(&c.positions));
    t.insert("attention".into(), name(&c.attention));
    if let Some(e) = c.embedding_dim {
        t.insert("embedding_dim".into(), int(e));
    }
    if let Some(d) = c.head_dim {
        t.insert("head_dim".into(), int(d));
    }
    t.insert("qk_norm".into(), Value::Boolean(c.qk_norm));
    if let Some(m) = c.mla.filter(|_| c.attention == AttentionKernel::Mla) {
        for (k, v) in [
            ("q_lora_rank", m.q_lora_rank.unwrap_or(0)),
            ("kv_lora_rank", m.kv_lora_rank),
            ("qk_nope_head_dim", m.qk_nope_head_dim),
            ("qk_rope_head_dim", m.qk_rope_head_dim),
            ("v_head_dim", m.v_head_dim),
        ] {
            t.insert(k.into(), int(v));
        }
    }
    if let Some(moe) = c.moe {
        for (k, v) in [
            ("experts", moe.experts),
            ("experts_per_token", moe.experts_per_token),
            ("expert_ffn", moe.expert_ffn),
            ("shared_experts", moe.shared_experts),
            ("dense_layers", c.dense_layers),
        ] {
            t.insert(k.into(), int(v));
        }
        t.insert(
            "routing_imbalance".into(),
            Value::Float(moe.routing_imbalance),
        );
        if let Some(c) = moe.capacity_factor {
            t.insert("capacity_factor".into(), Value::Float(c));
        }
    }
    if c.mtp_depth > 0 {
        t.insert("mtp_depth".into(), int(c.mtp_depth));
    }
    match c.head {
        Head::LanguageModel => {
            t.insert("head".into(), Value::String("language_model".into()));
        }
        Head::Classifier { classes } => {
            t.insert("head".into(), Value::String("classifier".into()));
            t.insert("classes".into(), int(classes));
        }
    }
    if m.weight != 1.0 {
        t.insert("weight".into(), Value::Float(m.weight));
    }
    if let Some(b) = m.baseline {
        let mut bt = Table::new();
        bt.insert("pipeline".into(), int(b.pipeline));
        bt.insert("data".into(), int(b.data));
        bt.insert("tensor".into(), int(b.tensor));
        t.insert("baseline".into(), Value::Table(bt));
    }
    Value::Table(t)
}

/// `[training]`.
fn training(tr: &Training) -> Table {
    let mut t = Table::new();
    t.insert("global_batch".into(), int(tr.global_batch));
    t.insert("micro_batch_sizes".into(), ints(&tr.micro_batch_sizes));
    t.insert(
        "activation_recomputation".into(),
        Value::Array(tr.activation_recomputation.iter().map(name).collect()),
    );
    t.insert("optimizer".into(), name(&tr.optimizer));
    t.insert("memory_model".into(), name(&tr.memory_model));
    match tr.memory_model {
        MemoryModel::Megatron => {
            t.insert(
                "precision".into(),
                Value::Array(tr.precisions.iter().map(name).collect()),
            );
            if tr.precisions.contains(&Precision::Fp8Hybrid) {
                t.insert("fp8_recipe".into(), name(&tr.fp8_scaling));
            }
            if tr.precisions.iter().any(|p| p.is_quantised()) {
                t.insert(
                    "fp8_param_gather".into(),
                    Value::Boolean(tr.fp8_param_gather),
                );
            }
            if tr.zero_stages.is_empty() {
                t.insert(
                    "distributed_optimizer".into(),
                    bools(&tr.distributed_optimizer),
                );
            } else {
                t.insert("zero_stage".into(), ints(&tr.zero_stages));
            }
            // One value as before; a list when the search tries several.
            let reshard = match tr.reshard_after_forward.as_slice() {
                [one] => Value::Boolean(*one),
                many => bools(many),
            };
            t.insert("reshard_after_forward".into(), reshard);
            t.insert(
                "data_parallel_overlap".into(),
                Value::Boolean(tr.data_parallel_overlap),
            );
            t.insert("sequence_parallel".into(), bools(&tr.sequence_parallel));
            t.insert(
                "pipeline_interleaving".into(),
                ints(&tr.pipeline_interleaving),
            );
            // Only when given (specs without it resolve as before).
            if !tr.pipeline_schedules.is_empty() {
                let names = tr
                    .pipeline_schedules
                    .iter()
                    .map(|s| Value::String(s.name().into()))
                    .collect();
                t.insert("pipeline_schedule".into(), Value::Array(names));
            }
            // Only with context parallelism (specs without it resolve as before).
            if tr.context_parallel.iter().any(|&cp| cp > 1) {
                t.insert("context_parallel".into(), ints(&tr.context_parallel));
                let method = tr.context_exchange.method;
                t.insert(
                    "context_parallel_exchange".into(),
                    Value::String(method.name().into()),
                );
                if method == ContextMethod::Ring {
                    t.insert(
                        "context_parallel_overlap".into(),
                        Value::Boolean(tr.context_exchange.overlap),
                    );
                }
            }
        }
        MemoryModel::Reference => {
            t.insert("bytes_per_element".into(), int(tr.bytes_per_element));
        }
    }
    t.insert("expert_parallel".into(), ints(&tr.expert_parallel));
    if tr.recompute_modules != RecomputeModules::default() {
        t.insert("recompute_modules".into(), modules(tr.recompute_modules));
    }
    if tr.all_to_all_overlap {
        t.insert("all_to_all_overlap".into(), Value::Boolean(true));
    }
    if tr.pipeline_parallel_overlap {
        t.insert("pipeline_parallel_overlap".into(), Value::Boolean(true));
    }
    t.insert("operator_execution".into(), name(&tr.execution.operators));
    t.insert(
        "tensor_parallel_overlap".into(),
        name(&tr.execution.tensor_parallel_overlap),
    );
    if tr.execution.kernels != KernelFusion::Fused {
        t.insert("kernel_fusion".into(), name(&tr.execution.kernels));
    }
    if tr.execution.fp8_library != Fp8Library::TransformerEngine {
        t.insert("fp8_library".into(), name(&tr.execution.fp8_library));
    }
    if tr.execution.cross_entropy != CrossEntropy::Fused {
        t.insert("cross_entropy".into(), name(&tr.execution.cross_entropy));
    }
    t
}

/// `[cluster]`.
fn cluster(c: &Cluster) -> Table {
    let mut t = Table::new();
    t.insert("devices".into(), int(c.devices));
    if c.network.node_size == u64::MAX {
        t.insert("link_bandwidth".into(), rate(c.link_bytes_per_second));
    } else {
        let n = &c.network;
        if c.domains.is_empty() {
            t.insert("node_size".into(), int(n.node_size));
            t.insert(
                "intra_node_bandwidth".into(),
                rate(n.intra_node.bytes_per_second),
            );
        } else {
            // Scale-up domain sizes a search tries, each with its intra-node bandwidth.
            let sizes: Vec<u64> = c.domains.iter().map(|d| d.node_size).collect();
            t.insert("node_size".into(), ints(&sizes));
            t.insert(
                "intra_node_bandwidth".into(),
                Value::Array(
                    c.domains
                        .iter()
                        .map(|d| rate(d.intra_node.bytes_per_second))
                        .collect(),
                ),
            );
        }
        t.insert(
            "inter_node_bandwidth".into(),
            rate(n.inter_node.bytes_per_second),
        );
        t.insert(
            "intra_node_latency".into(),
            Value::String(format!("{} s", n.intra_node.latency_seconds)),
        );
        t.insert(
            "inter_node_latency".into(),
            Value::String(format!("{} s", n.inter_node.latency_seconds)),
        );
    }
    if let Some(host) = c.network.host_bytes_per_second {
        t.insert("host_bandwidth".into(), rate(host));
    }
    t.insert(
        "hbm".into(),
        Value::Array(c.hbm_bytes.iter().map(|&b| bytes(b)).collect()),
    );
    t
}

/// `[search]`.
fn search(s: &SpaceSpec) -> Table {
    let mut t = Table::new();
    t.insert("tensor_cores".into(), ints(&s.tensor_cores));
    t.insert("vector_cores".into(), ints(&s.vector_cores));
    t.insert("width".into(), ints(&s.width));
    t.insert("depth".into(), ints(&s.depth));
    if let Some(v) = &s.vector_width {
        t.insert("vector_width".into(), ints(v));
    }
    t.insert(
        "buffer".into(),
        Value::Array(s.buffer_bytes.iter().map(|&b| bytes(b)).collect()),
    );
    let budget = match &s.area_budget {
        AreaBudget::Um2(a) => Value::String(format!("{a} um2")),
        AreaBudget::ReferenceConfig(k) => {
            let mut b = Table::new();
            b.insert("reference_config".into(), Value::Table(chip(k)));
            Value::Table(b)
        }
    };
    t.insert("area_budget".into(), budget);
    t.insert(
        "min_area_fraction".into(),
        Value::Float(s.min_area_fraction),
    );
    t.insert(
        "single_core_exempt".into(),
        Value::Boolean(s.single_core_exempt),
    );
    t.insert(
        "area_bucket".into(),
        Value::String(format!("{} um2", s.bucket_um2)),
    );
    t.insert(
        "convergence_window".into(),
        int(s.convergence_window.into()),
    );
    // `exhaustive` as before, and `strategy` for the walks it cannot say (the converging
    // walk is no longer the default: read back, the text must say it).
    t.insert(
        "exhaustive".into(),
        Value::Boolean(s.strategy == Strategy::Exhaustive),
    );
    if s.strategy != Strategy::Exhaustive {
        t.insert("strategy".into(), Value::String(s.strategy.name().into()));
    }
    if s.objective != Default::default() {
        t.insert("objective".into(), Value::String(s.objective.name().into()));
    }
    t.insert("use_all_devices".into(), Value::Boolean(s.use_all_devices));
    if let Some(axis) = s.plot_colour_by {
        t.insert("plot_colour_by".into(), Value::String(axis.name().into()));
    }
    t.insert("schedule_gap".into(), Value::Float(s.schedule_gap));
    t.insert("schedule_node_limit".into(), int(s.schedule_node_limit));
    t.insert(
        "schedule_time_limit_seconds".into(),
        Value::Float(s.schedule_time_limit_seconds),
    );
    t
}

/// `[cost_model]`.
fn cost_model(cm: &CostModelSpec) -> Table {
    let mut t = Table::new();
    t.insert("area".into(), plugin(&cm.area));
    t.insert("latency".into(), plugin(&cm.latency));
    if !cm.parameters.is_empty() {
        let params = cm
            .parameters
            .iter()
            .map(|(p, kv)| {
                let kv = kv
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect();
                (p.clone(), Value::Table(kv))
            })
            .collect();
        t.insert("parameters".into(), Value::Table(params));
    }
    t
}

/// `[accelerator]` and `[plan]`.
fn estimate(e: &EstimateSpec) -> (Table, Table) {
    let mut a = chip(&e.accelerator);
    a.insert("hbm".into(), bytes(e.hbm_bytes));
    if let Some(f) = e.peak_flops_per_second {
        a.insert("peak_flops".into(), Value::String(format!("{f} FLOP/s")));
    }
    (a, plan_table(&e.plan))
}

/// A plan as a `[plan]` table gives it: every choice written out, `stage_layers` when the
/// split is not even.
pub fn plan_table(p: &StepPlan) -> Table {
    let mut t = Table::new();
    t.insert("tensor_parallel".into(), int(p.tensor_parallel));
    t.insert("pipeline_parallel".into(), int(p.pipeline_parallel));
    t.insert("data_parallel".into(), int(p.data_parallel));
    t.insert("micro_batch".into(), int(p.micro_batch));
    t.insert("interleaving".into(), int(p.interleaving));
    let schedule = p.schedule();
    if schedule != archplace_engine::pipeline::PipelineSchedule::implied(p.interleaving) {
        t.insert(
            "pipeline_schedule".into(),
            Value::String(schedule.name().into()),
        );
    }
    t.insert("recomputation".into(), name(&p.recomputation));
    t.insert(
        "sequence_parallel".into(),
        Value::Boolean(p.sequence_parallel),
    );
    t.insert("precision".into(), name(&p.precision));
    if p.precision == Precision::Fp8Hybrid {
        t.insert("fp8_recipe".into(), name(&p.fp8_scaling));
    }
    if p.precision.is_quantised() {
        t.insert(
            "fp8_param_gather".into(),
            Value::Boolean(p.fp8_param_gather),
        );
    }
    t.insert(
        "distributed_optimizer".into(),
        Value::Boolean(p.distributed_optimizer),
    );
    let z = &p.sharding;
    if z.zero_stage > 0 {
        t.insert("zero_stage".into(), int(z.zero_stage));
    }
    if z.zero_stage == 3 && !z.reshard_after_forward {
        t.insert("reshard_after_forward".into(), Value::Boolean(false));
    }
    if z.data_parallel_overlap {
        t.insert("data_parallel_overlap".into(), Value::Boolean(true));
    }
    if let Some(g) = z.sharding_group {
        t.insert("sharding_group".into(), int(g));
    }
    if p.recompute_modules != RecomputeModules::default() {
        t.insert("recompute_modules".into(), modules(p.recompute_modules));
    }
    if let Some(n) = p.recompute_layers {
        t.insert("recompute_layers".into(), int(n));
    }
    if p.activation_offload_layers > 0 {
        t.insert(
            "activation_offload_layers".into(),
            int(p.activation_offload_layers),
        );
    }
    if p.all_to_all_overlap {
        t.insert("all_to_all_overlap".into(), Value::Boolean(true));
    }
    if p.pipeline_parallel_overlap {
        t.insert("pipeline_parallel_overlap".into(), Value::Boolean(true));
    }
    if p.expert_parallel != 1 || p.expert_tensor_parallel != 1 {
        t.insert("expert_parallel".into(), int(p.expert_parallel));
        t.insert(
            "expert_tensor_parallel".into(),
            int(p.expert_tensor_parallel),
        );
    }
    if p.context_parallel != 1 {
        t.insert("context_parallel".into(), int(p.context_parallel));
        t.insert(
            "context_parallel_exchange".into(),
            Value::String(p.context_exchange.method.name().into()),
        );
        if p.context_exchange.method == ContextMethod::Ring {
            t.insert(
                "context_parallel_overlap".into(),
                Value::Boolean(p.context_exchange.overlap),
            );
        }
    }
    if let Some(list) = &p.stage_layers {
        t.insert(
            "stage_layers".into(),
            Value::Array(list.iter().map(|&b| int(b)).collect()),
        );
    }
    t
}

/// A chip and a plan as the text of `[accelerator]` and `[plan]` tables, ready to paste
/// into the spec for `archplace estimate` (which prices the plan as the search did); with
/// the chip's peak FLOP/s when known, so that the estimate gives its MFU.
pub fn estimate_toml(
    accelerator: &AcceleratorConfig,
    hbm_bytes: u64,
    peak_flops_per_second: Option<f64>,
    plan: &StepPlan,
) -> String {
    let mut a = chip(accelerator);
    a.insert("hbm".into(), bytes(hbm_bytes));
    if let Some(f) = peak_flops_per_second {
        a.insert("peak_flops".into(), Value::String(format!("{f} FLOP/s")));
    }
    let mut doc = Table::new();
    doc.insert("accelerator".into(), Value::Table(a));
    doc.insert("plan".into(), Value::Table(plan_table(plan)));
    toml::to_string(&doc).unwrap_or_default()
}
