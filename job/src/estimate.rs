//! `archplace estimate`: one chip and one plan from a spec's `[accelerator]` and `[plan]`,
//! the step explained — and one operator on that chip, for comparing latency models.

use crate::explain::{HBM_LIMITS_FROM, hbm_busy_fraction};
use archplace_engine::execution::TensorParallelOverlap;
use archplace_engine::pipeline::PipelineSchedule;
use archplace_engine::step::{self, StepError, StepInput, StepReport};
use archplace_engine::training::Recomputation;
use archplace_plugin_sdk::text::thousands;
use archplace_plugin_sdk::units::format_bytes;
use archplace_plugin_sdk::{
    AcceleratorConfig, CoreConfig, Direction, EstimateError, Gemm, LatencyModel, Op, OpKind,
    VectorKind,
};
use archplace_spec::Spec;
use serde::Serialize;
use std::fmt::Write as _;

/// The answer printed with `--json`: the estimate and what it was made of, or why the
/// plan cannot run.
#[derive(Debug, Serialize)]
pub struct EstimateDoc<'a> {
    pub spec: &'a str,
    /// The software stack whose profile filled the spec's `[training]` defaults
    /// (`[training] stack`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<&'a str>,
    pub model: &'a str,
    pub parameters: u64,
    /// The parameters a token goes through (a Mixture-of-Experts model's: all but the
    /// experts it is not routed to).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_parameters: Option<u64>,
    /// The multi-token-prediction modules' parameters, trained with the model and not in
    /// `parameters` (DeepSeek-V3's 671 B leave its module out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp_parameters: Option<u64>,
    pub accelerator: AcceleratorConfig,
    pub plan: &'a step::StepPlan,
    pub devices: u64,
    pub global_batch: u64,
    pub network: archplace_engine::network::Network,
    pub execution: archplace_engine::execution::Execution,
    pub latency_model: &'a str,
    pub feasible: bool,
    /// Why the plan cannot run (with `feasible = false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub report: Option<&'a StepReport>,
    /// The memory that does not fit (with `feasible = false` for lack of memory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<step::MemoryBreakdown>,
    /// `step_seconds` from the parameters' uncertainty: 5th and 95th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_seconds_interval: Option<[f64; 2]>,
    /// `tokens_per_second_per_device` likewise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_second_per_device_interval: Option<[f64; 2]>,
    /// How the intervals were made (draws, level, sources).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncertainty: Option<&'a crate::calibrated::StepInterval>,
    /// The calibration applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<&'a crate::calibrated::Applied>,
}

/// The model's parameters (all ranks; a tied embedding once), without its
/// multi-token-prediction modules'.
pub fn parameters(input: &StepInput) -> u64 {
    whole_model(input).model_parameters_per_rank()
}

/// The multi-token-prediction modules' parameters, when the model has them.
pub fn mtp_parameters(input: &StepInput) -> Option<u64> {
    Some(whole_model(input).mtp_parameters_per_rank()).filter(|&n| n > 0)
}

/// The model on one rank without tensor parallelism.
fn whole_model(input: &StepInput) -> archplace_engine::model::ModelGraph {
    archplace_engine::model::build(
        &input.model,
        &archplace_engine::model::BuildOptions {
            recompute_modules: Default::default(),
            micro_batch: 1,
            tensor_parallel: 1,
            numerics: Default::default(),
            link_bytes_per_second: 1,
            sequence_parallel: false,
            experts: Default::default(),
            context_parallel: 1,
            kernels: Default::default(),
            fp8_library: Default::default(),
            cross_entropy: Default::default(),
        },
    )
}

/// The parameters a token goes through, for a Mixture-of-Experts model.
pub fn active_parameters(input: &StepInput) -> Option<u64> {
    let inactive = input.model.inactive_parameters()?;
    Some(parameters(input).saturating_sub(inactive))
}

/// One JSON object for `result`.
pub fn document<'a>(
    spec: &'a Spec,
    input: &'a StepInput,
    latency_model: &'a str,
    result: &'a Result<StepReport, StepError>,
) -> EstimateDoc<'a> {
    let (report, reason, memory) = match result {
        Ok(r) => (Some(r), None, None),
        Err(StepError::OutOfMemory { memory, .. }) => {
            (None, Some(result_reason(result)), Some(*memory))
        }
        Err(_) => (None, Some(result_reason(result)), None),
    };
    EstimateDoc {
        spec: &spec.name,
        stack: spec.stack.as_deref(),
        model: &input.model.name,
        parameters: parameters(input),
        active_parameters: active_parameters(input),
        mtp_parameters: mtp_parameters(input),
        accelerator: input.accelerator,
        plan: &input.plan,
        devices: input.devices,
        global_batch: input.global_batch,
        network: input.network,
        execution: input.execution,
        latency_model,
        feasible: report.is_some(),
        reason,
        report,
        memory_bytes: memory,
        step_seconds_interval: None,
        tokens_per_second_per_device_interval: None,
        uncertainty: None,
        calibration: None,
    }
}

impl<'a> EstimateDoc<'a> {
    /// The document with the calibration applied and the step's interval, when any.
    pub fn with_uncertainty(
        mut self,
        applied: Option<&'a crate::calibrated::Applied>,
        interval: Option<&'a crate::calibrated::StepInterval>,
    ) -> Self {
        self.calibration = applied;
        if let Some(i) = interval {
            self.step_seconds_interval = Some([i.step_seconds.lower, i.step_seconds.upper]);
            self.tokens_per_second_per_device_interval = Some([
                i.tokens_per_second_per_device.lower,
                i.tokens_per_second_per_device.upper,
            ]);
            self.uncertainty = Some(i);
        }
        self
    }
}

fn result_reason(r: &Result<StepReport, StepError>) -> String {
    match r {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

fn seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.3} µs", s * 1e6)
    }
}

fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
}

fn rate(flops: f64) -> String {
    format!("{:.1} TFLOP/s", flops / 1e12)
}

fn joules(j: f64) -> String {
    if j >= 1e6 {
        format!("{:.2} MJ", j / 1e6)
    } else if j >= 1e3 {
        format!("{:.2} kJ", j / 1e3)
    } else {
        format!("{j:.2} J")
    }
}

/// The calibration applied, one line per parameter.
pub fn render_calibration(a: &crate::calibrated::Applied) -> String {
    let mut out = format!(
        "calibration      {} (for {} {})",
        a.path, a.plugin.name, a.plugin.version
    );
    for p in &a.parameters {
        out.push_str(&format!(
            "\n  {:<38} × {:.3} → {:.4}{}",
            p.parameter.to_string(),
            p.factor,
            p.value,
            if p.unit.is_empty() {
                String::new()
            } else {
                format!(" {}", p.unit)
            }
        ));
    }
    for w in &a.warnings {
        out.push_str(&format!("\n  warning: {w}"));
    }
    out
}

/// The step's interval in one line.
pub fn render_interval(i: &crate::calibrated::StepInterval) -> String {
    format!(
        "interval (90%)   step {} to {}; {:.0} to {:.0} tokens/s per device ({} draws from {})",
        seconds(i.step_seconds.lower),
        seconds(i.step_seconds.upper),
        i.tokens_per_second_per_device.lower,
        i.tokens_per_second_per_device.upper,
        i.draws,
        i.from.join(" and ")
    )
}

/// The plan in one line.
pub fn describe_plan(input: &StepInput) -> String {
    let p = &input.plan;
    format!(
        "t = {}{}, p = {}, d = {}, micro-batch {}, {}, recomputation {}, sequence parallel {}, {}, {:?} optimizer{}",
        p.tensor_parallel,
        context_words(p),
        p.pipeline_parallel,
        p.data_parallel,
        p.micro_batch,
        if !matches!(
            p.schedule(),
            PipelineSchedule::OneFOneB | PipelineSchedule::Interleaved
        ) {
            let blocks = p
                .stage_layers
                .as_ref()
                .map(|list| {
                    let list: Vec<String> = list.iter().map(u64::to_string).collect();
                    format!(", blocks per stage {}", list.join(", "))
                })
                .unwrap_or_default();
            format!("{}{blocks}", p.schedule().describe())
        } else if p.interleaving > 1 {
            format!(
                "interleaved 1F1B ({} virtual stages per device{}){}",
                p.interleaving,
                if p.pipeline_parallel_overlap {
                    ", transfers overlapped with the steady state"
                } else {
                    ""
                },
                p.stage_layers
                    .as_ref()
                    .map(|list| {
                        let list: Vec<String> = list.iter().map(u64::to_string).collect();
                        format!(", blocks per stage {}", list.join(", "))
                    })
                    .unwrap_or_default()
            )
        } else {
            match &p.stage_layers {
                Some(list) => format!(
                    "1F1B, blocks per stage {}",
                    list.iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => "1F1B".to_string(),
            }
        },
        match (
            p.recomputation,
            p.recompute_layers,
            p.activation_offload_layers
        ) {
            (Recomputation::Selective, _, _) =>
                format!("selective ({})", p.recompute_modules.names()),
            (Recomputation::Full, Some(n), _) => format!(
                "full (the first {n} block{} of each model chunk)",
                if n == 1 { "" } else { "s" }
            ),
            (Recomputation::None, _, n) if n > 0 => format!(
                "none (the activations of the first {n} block{} offloaded to the host)",
                if n == 1 { "" } else { "s" }
            ),
            (r, _, _) => r.name().to_string(),
        },
        if p.sequence_parallel { "on" } else { "off" },
        precision_words(p),
        p.optimizer,
        match (p.zero_stage(), p.sharding.reshard_after_forward) {
            (0, _) => "",
            (1, _) => ", distributed",
            (2, _) => ", ZeRO-2 (optimizer state and gradients sharded)",
            (_, true) =>
                ", ZeRO-3 (FSDP: every state sharded, weights gathered per layer in forward and again in backward)",
            (_, false) =>
                ", ZeRO-3 (FSDP: every state sharded, weights gathered per layer and kept from forward to backward)",
        },
    ) + &p
        .sharding
        .sharding_group
        .map(|n| {
            format!(
                " over groups of {n} data-parallel ranks, replicated {} times (hybrid sharding)",
                p.gradient_group() / n.max(1)
            )
        })
        .unwrap_or_default()
        + if p.sharding.data_parallel_overlap {
            "; data-parallel traffic overlapped with computation"
        } else {
            ""
        }
        + &experts_words(p)
        + &format!(
            "; operators {}, tensor-parallel collectives {}",
            input.execution.operators.name(),
            match input.execution.tensor_parallel_overlap {
                TensorParallelOverlap::None => "not overlapped",
                TensorParallelOverlap::Pipelined => "overlapped (pipelined with their GEMMs)",
                TensorParallelOverlap::Async => "overlapped (async: decomposed GEMMs)",
            }
        )
}

/// The model FLOPs utilisation in words: against the dense 16-bit peak, also for an FP8
/// recipe (as NVIDIA's tables count FP8 runs).
fn utilisation_words(input: &StepInput, r: &StepReport) -> String {
    match r.model_flops_utilisation {
        Some(u) if input.plan.precision.is_quantised() => format!(
            " (MFU {:.1}% of the 16-bit peak, as NVIDIA's tables count FP8 runs)",
            100.0 * u
        ),
        Some(u) => format!(" (MFU {:.1}%)", 100.0 * u),
        None => " (no MFU: give [accelerator] peak_flops)".to_string(),
    }
}

/// The precision, with how an FP8 recipe scales.
fn precision_words(p: &step::StepPlan) -> String {
    match p.precision {
        archplace_engine::training::Precision::Fp8Hybrid => {
            format!("fp8-hybrid ({} scaling)", p.fp8_scaling.name())
        }
        archplace_engine::training::Precision::Mxfp8 => "mxfp8 (block scaling)".to_string(),
        other => other.name().to_string(),
    }
}

/// The context parallelism, when the plan splits sequences.
fn context_words(p: &step::StepPlan) -> String {
    if p.context_parallel == 1 {
        return String::new();
    }
    let how = match (p.context_exchange.method, p.context_exchange.overlap) {
        (step::ContextMethod::Ring, true) => "ring attention, transfers overlapped",
        (step::ContextMethod::Ring, false) => "ring attention, transfers not overlapped",
        (step::ContextMethod::AllGather, _) => "keys and values all-gathered",
        (step::ContextMethod::AllToAll, _) => "Ulysses all-to-all, the heads split over CP",
    };
    format!(", CP = {} ({how})", p.context_parallel)
}

/// The expert layout, when the plan splits experts.
fn experts_words(p: &step::StepPlan) -> String {
    if p.expert_parallel == 1 && p.expert_tensor_parallel == 1 {
        return String::new();
    }
    format!(
        "; experts over EP = {} × ETP = {} (expert-data-parallel {}){}",
        p.expert_parallel,
        p.expert_tensor_parallel,
        p.expert_data_parallel(),
        if p.all_to_all_overlap {
            ", all-to-all overlapped with computation"
        } else {
            ""
        }
    )
}

/// The exchanges computation hides in part — context parallelism's behind attention,
/// the all-to-all and FSDP's behind computation —: their whole traffic and the hidden
/// share, under the step's breakdown.
fn hidden_traffic(o: &mut String, input: &StepInput, r: &StepReport) {
    let kv = r.operator_seconds.context_parallel;
    if kv > 0.0 && kv > r.time.context_parallel_communication_seconds {
        let _ = writeln!(
            o,
            "  (context-parallel exchanges: {} of traffic, {} of it behind attention)",
            seconds(kv),
            seconds(kv - r.time.context_parallel_communication_seconds),
        );
    }
    let a2a = r.operator_seconds.all_to_all;
    if a2a > 0.0 && input.plan.all_to_all_overlap {
        let _ = writeln!(
            o,
            "  (all-to-all exchanges: {} of traffic, {} of it behind computation)",
            seconds(a2a),
            seconds(a2a - r.time.all_to_all_seconds),
        );
    }
    if r.activation_offload_traffic_seconds > 0.0 {
        let _ = writeln!(
            o,
            "  (activation offload: {} of copies to the host and back, {} of it beside the next blocks' passes)",
            seconds(r.activation_offload_traffic_seconds),
            seconds(r.activation_offload_traffic_seconds - r.time.activation_offload_seconds),
        );
    }
    if r.fsdp_traffic_seconds > 0.0 && input.plan.sharding.data_parallel_overlap {
        let _ = writeln!(
            o,
            "  (FSDP all-gathers and reduce-scatters: {} of traffic, {} of it behind computation)",
            seconds(r.fsdp_traffic_seconds),
            seconds(r.fsdp_traffic_seconds - r.time.fsdp_communication_seconds),
        );
    }
}

/// The estimate as text for people.
pub fn render(input: &StepInput, latency_model: &str, r: &StepReport) -> String {
    let mut o = String::new();
    let mut active = active_parameters(input)
        .map(|a| format!(", {} active", thousands(a)))
        .unwrap_or_default();
    if let Some(n) = mtp_parameters(input) {
        let _ = write!(active, "; multi-token prediction {} more", thousands(n));
    }
    let _ = writeln!(
        o,
        "{} ({} parameters{active}) on {} devices of {} buffer, {} HBM; latency model {latency_model}",
        input.model.name,
        thousands(parameters(input)),
        thousands(input.devices),
        crate::chip::short(&input.accelerator),
        format_bytes(input.hbm_bytes),
    );
    let _ = writeln!(o, "plan: {}", describe_plan(input));
    let _ = writeln!(
        o,
        "\nstep time {} for a global batch of {} ({} micro-batches per replica): {:.2} samples/s, {} tokens/s ({} per device)",
        seconds(r.step_seconds),
        thousands(input.global_batch),
        r.micro_batches_per_replica,
        r.samples_per_second,
        thousands(r.tokens_per_second.round() as u64),
        thousands(r.tokens_per_second_per_device.round() as u64),
    );
    for (name, s) in r.time.parts() {
        if step::OPTIONAL_PARTS.contains(&name) && s == 0.0 {
            continue; // A dense model or experts on every rank; no ZeRO-2/3.
        }
        let _ = writeln!(
            o,
            "  {name:<30} {:>12}  {:>5.1}%",
            seconds(s),
            100.0 * s / r.step_seconds
        );
    }
    if input.execution.tensor_parallel_overlap.overlaps() {
        let _ = writeln!(
            o,
            "  (tensor-parallel communication: the time computation does not hide; forward and backward are the cores' busy time)"
        );
    }
    hidden_traffic(&mut o, input, r);
    let _ = writeln!(o, "  limiting: {}", r.limiting);
    let _ = writeln!(
        o,
        "  by operator (each one's duration; they overlap, so these do not add up):"
    );
    for (name, s) in r.operator_seconds.parts() {
        if s > 0.0 {
            let _ = writeln!(
                o,
                "    {name:<28} {:>12}  {:>5.1}%",
                seconds(s),
                100.0 * s / r.step_seconds
            );
        }
    }
    let t = &r.time;
    let chip = t.forward_seconds + t.backward_seconds + t.recomputation_seconds;
    match (
        r.hbm_busy_seconds,
        hbm_busy_fraction(r.hbm_busy_seconds, chip),
    ) {
        (Some(busy), Some(f)) => {
            let _ = writeln!(
                o,
                "  HBM busy {} of the chip's {} ({:.0}%): the chip is limited by its {}",
                seconds(busy),
                seconds(chip),
                100.0 * f,
                if f >= HBM_LIMITS_FROM {
                    "HBM bandwidth"
                } else {
                    "compute"
                }
            );
        }
        (Some(_), None) => {}
        (None, _) => {
            let _ = writeln!(
                o,
                "  (the latency model does not report memory times: compute and HBM bandwidth are not told apart)"
            );
        }
    }
    let m = &r.memory_bytes;
    let _ = writeln!(
        o,
        "\nmemory per device, stage {} of {} (the most loaded): {} of {} HBM ({:.0}%)",
        r.memory_stage,
        input.plan.pipeline_parallel,
        gib(m.total),
        gib(input.hbm_bytes as f64),
        100.0 * m.total / input.hbm_bytes as f64
    );
    for (name, b) in [
        ("weights", m.weights),
        ("gradients", m.gradients),
        ("optimizer state", m.optimizer),
        ("activations", m.activations),
    ] {
        let _ = writeln!(o, "  {name:<30} {:>12}", gib(b));
    }
    let _ = writeln!(
        o,
        "\nmodel FLOPs {} per device{}; hardware FLOPs {} per device\n  (model FLOPs count attention unmasked, its backward twice its forward, as Megatron-LM's MFU does, and a balanced routing; hardware FLOPs are what the kernels run: recomputation counted, the half of attention a causal mask skips not, so they can be fewer)",
        rate(r.model_flops_per_second_per_device),
        utilisation_words(input, r),
        rate(r.hardware_flops_per_second_per_device),
    );
    let _ = writeln!(
        o,
        "energy per step {} (the latency model's operator joules, all devices)",
        joules(r.energy_per_step_joules)
    );
    if r.schedules_not_proven_optimal > 0 {
        let _ = writeln!(
            o,
            "note: {} of {} layer schedules are not proven optimal, within {:.1}% of their lower bounds (the step time is an upper bound; --mip tries to close the gap)",
            r.schedules_not_proven_optimal,
            r.layer_schedules,
            100.0 * r.schedules_max_gap
        );
    }
    o
}

/// One operator for `archplace estimate op`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OpRequest {
    /// A GEMM with inputs of an element type (bf16 unless asked).
    Gemm(Gemm, archplace_plugin_sdk::ElementType),
    Vector {
        kind: VectorKind,
        elements: u64,
        row: u64,
    },
}

/// What one operator costs on some cores of the chip.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpEstimate {
    pub op: Op,
    pub core: CoreConfig,
    pub seconds: f64,
    pub joules: f64,
    /// The time its off-chip memory traffic takes alone, when the latency model says
    /// (interface 1.1).
    pub memory_seconds: Option<f64>,
    /// `seconds × clock`, when the latency model has a clock.
    pub cycles: Option<f64>,
    pub clock_hz: Option<f64>,
    /// Matrix FLOP/s reached, for a GEMM.
    pub flops_per_second: Option<f64>,
}

/// Estimates one operator on `cores` of the chip's tensor (GEMM) or vector cores.
pub fn estimate_op(
    accelerator: &AcceleratorConfig,
    request: OpRequest,
    cores: Option<u32>,
    direction: Direction,
    latency: &dyn LatencyModel,
    clock_hz: Option<f64>,
) -> Result<OpEstimate, EstimateError> {
    let (kind, core) = match request {
        OpRequest::Gemm(g, _) => (
            OpKind::Gemm(g),
            accelerator.tensor_core(cores.unwrap_or(accelerator.tensor_cores)),
        ),
        OpRequest::Vector {
            kind,
            elements,
            row,
        } => (
            OpKind::Vector {
                kind,
                elements,
                row,
            },
            accelerator.vector_core(cores.unwrap_or(accelerator.vector_cores)),
        ),
    };
    let op = Op::new(kind, direction);
    let op = match request {
        OpRequest::Gemm(_, element) => op.with_element(element),
        OpRequest::Vector { .. } => op,
    };
    let cost = archplace_engine::operators::estimate(latency, &core, std::slice::from_ref(&op))?
        .first()
        .copied()
        .ok_or_else(|| EstimateError::Internal("no answer".into()))?;
    let flops = match request {
        OpRequest::Gemm(g, _) if cost.seconds > 0.0 => Some(g.flops() / cost.seconds),
        _ => None,
    };
    Ok(OpEstimate {
        op,
        core,
        seconds: cost.seconds,
        joules: cost.joules,
        memory_seconds: cost.memory_seconds,
        cycles: clock_hz.map(|c| c * cost.seconds),
        clock_hz,
        flops_per_second: flops,
    })
}

/// An operator in words: `GEMM 4096×4096×4096 (137.4 GFLOP)`, `softmax of 1,000,000
/// elements in rows of 1,000`, `all-reduce of 48.0 MiB over 8 devices at 300 GB/s`, with
/// what is fused into it and `backward` for a backward kernel.
pub fn op_words(op: &Op) -> String {
    let mut s = match &op.kind {
        OpKind::Gemm(g) => {
            let batch = if g.batch > 1 {
                format!("{} × ", thousands(g.batch))
            } else {
                String::new()
            };
            let typed = if op.element == archplace_plugin_sdk::ElementType::Bf16 {
                String::new()
            } else {
                format!(" in {}", op.element.name())
            };
            format!(
                "GEMM {batch}{}×{}×{}{typed} ({:.1} GFLOP)",
                g.m,
                g.n,
                g.k,
                g.flops() / 1e9
            )
        }
        OpKind::Cast(c) => format!(
            "cast of {} {} elements to {}{}",
            thousands(c.elements),
            op.element.name(),
            c.to.name(),
            if c.amax_pass {
                " (amax pass first)"
            } else {
                ""
            }
        ),
        OpKind::Vector {
            kind,
            elements,
            row,
        } => {
            let rows = if *row > 1 {
                format!(" in rows of {}", thousands(*row))
            } else {
                String::new()
            };
            format!("{} of {} elements{rows}", kind.name(), thousands(*elements))
        }
        OpKind::AllReduce {
            bytes,
            group,
            link_bytes_per_second,
        } => format!(
            "all-reduce of {} over {group} devices at {:.1} GB/s",
            format_bytes(*bytes),
            *link_bytes_per_second as f64 / 1e9
        ),
        OpKind::Attention(a) => format!(
            "fused attention, {} × {} heads ({} key/value) of {} tokens, head dim {}{} ({:.1} GFLOP)",
            thousands(a.batch),
            a.heads,
            a.kv_heads,
            thousands(a.seq),
            a.head_dim,
            if a.causal { ", causal" } else { "" },
            a.flops(op.direction) / 1e9
        ),
    };
    if !op.fused.is_empty() {
        let fused: Vec<String> = op
            .fused
            .iter()
            .map(|f| format!("{} of {} elements", f.kind.name(), thousands(f.elements)))
            .collect();
        s += &format!(", fused with {}", fused.join(", "));
    }
    if op.direction == Direction::Backward {
        s += ", backward";
    }
    s
}

/// Cores in words: `108 tensor cores of 32×32 MACs` or `108 vector cores of 64 lanes`,
/// with the buffer they share.
pub fn core_words(c: &CoreConfig) -> String {
    let plural = if c.cores == 1 { "" } else { "s" };
    let what = match c.kind {
        archplace_plugin_sdk::CoreKind::Tensor => {
            format!("tensor core{plural} of {}×{} MACs", c.width, c.depth)
        }
        archplace_plugin_sdk::CoreKind::Vector => {
            format!("vector core{plural} of {} lanes", c.width)
        }
    };
    format!(
        "{} {what}, {} buffer",
        c.cores,
        format_bytes(c.buffer_bytes)
    )
}

/// `archplace estimate op`'s answer in words and units.
pub fn render_op(e: &OpEstimate, latency_model: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} on {} ({latency_model})",
        op_words(&e.op),
        core_words(&e.core)
    );
    let _ = writeln!(o, "time    {}", seconds(e.seconds));
    match e.memory_seconds {
        Some(m) => {
            // As for the chip: the memory limits an operator busy with it long enough.
            let share = if e.seconds > 0.0 { m / e.seconds } else { 0.0 };
            let bound = if share >= HBM_LIMITS_FROM {
                "memory-bound"
            } else {
                "compute-bound"
            };
            let _ = writeln!(
                o,
                "memory  {} of off-chip traffic ({:.0}% of the time: {bound})",
                seconds(m),
                100.0 * share
            );
        }
        None => {
            let _ = writeln!(
                o,
                "memory  (the latency model does not report memory times)"
            );
        }
    }
    let energy = if e.joules >= 1.0 {
        joules(e.joules)
    } else if e.joules >= 1e-3 {
        format!("{:.3} mJ", e.joules * 1e3)
    } else {
        format!("{:.3} µJ", e.joules * 1e6)
    };
    let _ = writeln!(o, "energy  {energy}");
    match (e.cycles, e.clock_hz) {
        (Some(c), Some(hz)) => {
            let _ = writeln!(
                o,
                "cycles  {} at {:.3} GHz",
                thousands(c.round() as u64),
                hz / 1e9
            );
        }
        _ => {
            let _ = writeln!(o, "cycles  (the latency model has no `clock` parameter)");
        }
    }
    if let Some(f) = e.flops_per_second {
        let _ = writeln!(o, "rate    {}", rate(f));
    }
    o
}

/// Why a GEMM shape was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GemmShapeError {
    #[error("`{0}` is not a GEMM shape: write MxNxK or BATCHxMxNxK, e.g. 2048x12288x4096")]
    Syntax(String),
    #[error("`{0}`: every dimension must be 1 to 16,777,216")]
    OutOfRange(String),
}

/// Reads `"BATCHxMxNxK"` or `"MxNxK"`.
pub fn parse_gemm(text: &str) -> Result<Gemm, GemmShapeError> {
    let parts: Result<Vec<u64>, _> = text
        .split(['x', 'X', '×'])
        .map(|p| p.trim().parse::<u64>())
        .collect();
    let bad = || GemmShapeError::Syntax(text.to_string());
    let parts = parts.map_err(|_| bad())?;
    if !matches!(parts.len(), 3 | 4) {
        return Err(bad());
    }
    let g = Gemm::from_dims(&parts).ok_or_else(|| GemmShapeError::OutOfRange(text.to_string()))?;
    Ok(g)
}

/// The clock of the latency model: the spec's `clock` parameter; else the clock of the GPU
/// its `preset` parameter names (the SDK's presets, which the `gpu-like` plugin shares);
/// else the model's default `clock`.
pub fn clock_hz(spec: &Spec, info: &archplace_plugin_sdk::ModelInfo) -> Option<f64> {
    let set = spec.cost_model.parameters.get(&info.name);
    if let Some(text) = set.and_then(|p| p.get("clock")) {
        return archplace_plugin_sdk::units::parse_hertz(text).ok();
    }
    if let Some(g) = set
        .and_then(|p| p.get("preset"))
        .and_then(|name| archplace_plugin_sdk::gpus::gpu(name))
    {
        return Some(g.clock_hz);
    }
    let default = info.parameters.iter().find(|p| p.name == "clock")?;
    archplace_plugin_sdk::units::parse_hertz(&default.default).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_shapes() {
        assert_eq!(
            parse_gemm("2x3x4x5").unwrap(),
            Gemm {
                batch: 2,
                m: 3,
                n: 4,
                k: 5
            }
        );
        assert_eq!(parse_gemm("3x4x5").unwrap().batch, 1);
        assert_eq!(parse_gemm("3x4"), Err(GemmShapeError::Syntax("3x4".into())));
        assert!(parse_gemm("3x4").unwrap_err().to_string().contains("MxNxK"));
        assert_eq!(
            parse_gemm("0x4x5"),
            Err(GemmShapeError::OutOfRange("0x4x5".into()))
        );
        assert!(
            parse_gemm("1x4x5x16777217")
                .unwrap_err()
                .to_string()
                .contains("1 to")
        );
    }
}
