//! `[accelerator]` and `[plan]`: the fixed chip and training plan of `archplace estimate`.
//! The plan is checked against the model and the cluster here, with the numbers, so that
//! the engine's own check never fails on a valid spec.

use super::models::Entry;
use super::rules::{count_in, positive};
use crate::raw::{RawFixedAccelerator, RawPlan, RawSpec};
use crate::{Ctx, EstimateSpec, FieldPath, ModelSpec};
use archplace_engine::pipeline::PipelineSchedule;
use archplace_engine::step::{self, ContextExchange, Sharding, StepError, StepInput, StepPlan};
use archplace_engine::training::{Cluster, Precision, Recomputation, Training};
use archplace_plugin_sdk::units::{parse_bytes, parse_flops};
use archplace_plugin_sdk::{AcceleratorConfig, gpus};

/// The estimate's chip and plan, if the spec has them; `None` (with errors reported) when
/// they are invalid, `Some(None)` when the spec has neither. Every rule of `[accelerator]`
/// and `[plan]` is checked, each over the fields it relates that are fine.
pub(super) fn estimate(
    raw: &RawSpec,
    ctx: &mut Ctx<'_>,
    models: &[Entry],
    training: &Training,
    cluster: &Cluster,
) -> Option<Option<EstimateSpec>> {
    let root = FieldPath::root();
    let (ap, pp) = (root.key("accelerator"), root.key("plan"));
    // A table written but not readable is reported where it was read, not as missing.
    let (a, p) = match (&raw.accelerator, &raw.plan) {
        (None, None) => return Some(None),
        (Some(a), Some(p)) => (a, p),
        (Some(a), None) => {
            if !ctx.has_field(&pp) {
                ctx.error(
                    &ap,
                    "an [accelerator] table needs a [plan] table to estimate",
                    Some("add [plan] with tensor_parallel, pipeline_parallel, data_parallel and micro_batch".into()),
                );
            }
            accelerator(ctx, &ap, a);
            return None;
        }
        (None, Some(p)) => {
            if !ctx.has_field(&ap) {
                ctx.error(
                    &pp,
                    "a [plan] table needs an [accelerator] table to estimate",
                    Some("add [accelerator] with tensor_cores, vector_cores, width, depth, buffer and hbm".into()),
                );
            }
            plan_counts(ctx, &pp, p);
            plan_sharding(ctx, &pp, p);
            return None;
        }
    };
    let chip = accelerator(ctx, &ap, a);
    plan_counts(ctx, &pp, p);
    plan_sharding(ctx, &pp, p);
    // `[accelerator]` and `[plan]` are `archplace estimate`'s, which takes one model: said
    // here, located, rather than by `estimate` after `validate` said the spec is fine.
    if raw.models.len() > 1 {
        ctx.mismatch(
            &pp,
            format!(
                "a [plan] is estimated for one model; the spec has {} [[models]]",
                raw.models.len()
            ),
            Some("keep one [[models]] table in an estimate spec, or remove [accelerator] and [plan] to search".into()),
        );
    }
    one_network(ctx, cluster);
    let mut plan = plan_of(p, training);
    plan_modules(ctx, &pp, p, &mut plan);
    precision_on_chip(ctx, &pp, (a, p), plan.precision);
    if p.fp8_param_gather.is_none() && plan.zero_stage() == 0 {
        // `[training]`'s applies to plans that shard the optimizer, as in a search.
        plan.fp8_param_gather = false;
    }
    if plan.fp8_weights() && plan.zero_stage() == 0 {
        ctx.mismatch(
            &pp.key("fp8_param_gather"),
            "fp8_param_gather all-gathers FP8 weights from the distributed optimizer's shards; the plan replicates the optimizer's state (zero_stage 0)",
            Some("add distributed_optimizer = true (or a zero_stage of 1 to 3), or leave fp8_param_gather out".into()),
        );
    }
    // The plan against each model whose shape is fine (estimate itself takes one): a
    // mistake elsewhere in the model does not silence them.
    let fine: Vec<&Entry> = models
        .iter()
        .filter(|e| {
            let has_preset = raw.models.get(e.index).is_some_and(|m| m.preset.is_some());
            super::models::shape_usable(ctx, e, has_preset)
        })
        .collect();
    let mut reported = Vec::new();
    if let Some(first) = fine.first() {
        plan_stages(
            ctx,
            &pp,
            p,
            first.spec.config.layers,
            (&mut plan, &mut reported),
        );
    }
    overlap_needs_experts(ctx, &pp, p, &fine);
    plan_activations(ctx, &pp, p, &plan, (&fine, cluster));
    let modules_at = pp.key("recompute_modules");
    if p.recompute_modules.is_some() && ctx.fine(&modules_at) {
        super::models::recompute_modules_apply(ctx, &modules_at, plan.recompute_modules, &fine);
    }
    plan_schedule(ctx, &pp, p, &mut plan);
    if p.expert_tensor_parallel.is_none() {
        plan.expert_tensor_parallel = models.first().map_or(1, |e| {
            e.spec.config.expert_tensor_parallel(plan.tensor_parallel)
        });
    }
    let accelerator = AcceleratorConfig {
        tensor_cores: chip.tensor_cores,
        vector_cores: chip.vector_cores,
        width: chip.width,
        depth: chip.depth,
        vector_width: chip.vector_width,
        buffer_bytes: chip.buffer.unwrap_or(0),
    };
    let template = StepInput {
        model: archplace_engine::model::ModelConfig::custom_base(),
        plan,
        accelerator,
        hbm_bytes: chip.hbm.unwrap_or(0),
        devices: cluster.devices,
        global_batch: training.global_batch,
        network: cluster.network,
        peak_flops_per_second: None,
        schedule: Default::default(),
        execution: training.execution,
    };
    let given = [
        p.tensor_parallel,
        p.pipeline_parallel,
        p.data_parallel,
        p.micro_batch,
    ];
    if given.iter().all(Option::is_some) {
        // The rules between the plan, the cluster and the batch, once; those with the
        // model, for each model whose shape is fine — a problem of a [plan] key that
        // several models share reported once, for the first (a spec with several models is
        // refused above).
        if let Some(e) = models.first() {
            plan_fits(ctx, &pp, &template, (&e.spec, false), &mut reported);
        }
        for e in &fine {
            plan_fits(ctx, &pp, &template, (&e.spec, true), &mut reported);
        }
    }
    let (Some(buffer_bytes), Some(hbm_bytes), Some(peak)) = (chip.buffer, chip.hbm, chip.peak)
    else {
        return None;
    };
    Some(Some(EstimateSpec {
        accelerator: AcceleratorConfig {
            buffer_bytes,
            ..accelerator
        },
        hbm_bytes,
        peak_flops_per_second: peak,
        plan: template.plan,
    }))
}

/// `[plan] recompute_layers` and `activation_offload_layers`, with what each needs as
/// Megatron-Core allows it: recomputing some blocks is full recomputation's; offloading
/// needs fewer blocks than the model has (the last block's backward follows its forward at
/// once), one pipeline stage, no recomputation, and a link to the host.
fn plan_activations(
    ctx: &mut Ctx<'_>,
    pp: &FieldPath,
    p: &RawPlan,
    plan: &StepPlan,
    (fine, cluster): (&[&Entry], &Cluster),
) {
    let blocks = fine.first().map(|e| e.spec.config.layers);
    if let Some(n) = p.recompute_layers {
        let at = pp.key("recompute_layers");
        if n == 0 {
            ctx.error(
                &at,
                "0 blocks recomputed is no recomputation",
                Some("give recomputation = \"none\", or at least 1 block".into()),
            );
        } else if plan.recomputation != Recomputation::Full {
            ctx.mismatch(
                &at,
                format!(
                    "recompute_layers picks the blocks full recomputation reruns (Megatron's block method); recomputation is \"{}\"",
                    plan.recomputation.name()
                ),
                Some("give recomputation = \"full\", or leave recompute_layers out".into()),
            );
        } else if let Some(b) = blocks.filter(|&b| n > b) {
            ctx.mismatch(
                &at,
                format!("{n} blocks recomputed, but the model has {b}"),
                Some(format!("give at most {b}")),
            );
        }
    }
    let offload = p.activation_offload_layers.unwrap_or(0);
    if offload == 0 {
        return;
    }
    let at = pp.key("activation_offload_layers");
    if let Some(b) = blocks.filter(|&b| offload >= b) {
        ctx.mismatch(
            &at,
            format!("{offload} blocks offloaded, but the model has {b}: the last block's activations are used as soon as they are made"),
            Some(format!("give at most {}", b.saturating_sub(1))),
        );
    }
    if plan.pipeline_parallel > 1 {
        ctx.mismatch(
            &at,
            format!(
                "activations are offloaded with one pipeline stage (as Megatron-Core allows it); the plan has {}",
                plan.pipeline_parallel
            ),
            Some("give pipeline_parallel = 1, or leave activation_offload_layers out".into()),
        );
    }
    if plan.recomputation != Recomputation::None {
        ctx.mismatch(
            &at,
            format!(
                "offloaded activations are not recomputed (Megatron-Core refuses both); recomputation is \"{}\"",
                plan.recomputation.name()
            ),
            Some("give recomputation = \"none\", or leave activation_offload_layers out".into()),
        );
    }
    if cluster.network.host_bytes_per_second.is_none() {
        ctx.mismatch(
            &at,
            "the devices' link to their host's memory is not known",
            Some("give [cluster] host_bandwidth (e.g. \"63 GB/s\" for PCIe 5.0 x16), or a GPU preset".into()),
        );
    }
}

/// `[plan] recompute_modules`, which needs the plan's recomputation to be selective.
fn plan_modules(ctx: &mut Ctx<'_>, pp: &FieldPath, p: &RawPlan, plan: &mut StepPlan) {
    if p.recompute_modules.is_some() {
        let selective = plan.recomputation == Recomputation::Selective;
        plan.recompute_modules = super::rules::recompute_modules(
            ctx,
            &pp.key("recompute_modules"),
            p.recompute_modules.as_deref(),
            (selective, Some(plan.recomputation)),
        );
    }
}

/// An estimate prices one plan on one network: a list of scale-up domain sizes is a
/// search's.
fn one_network(ctx: &mut Ctx<'_>, cluster: &Cluster) {
    let root = FieldPath::root();
    if !cluster.domains.is_empty() {
        let sizes: Vec<String> = cluster
            .domains
            .iter()
            .map(|n| n.node_size.to_string())
            .collect();
        ctx.mismatch(
            &root.key("cluster").key("node_size"),
            format!(
                "a [plan] is estimated on one network; node_size lists {} scale-up domain sizes ({}) for a search",
                sizes.len(),
                sizes.join(", ")
            ),
            Some("give one node_size to estimate, or remove [accelerator] and [plan] to search over the sizes".into()),
        );
    }
}

/// `all_to_all_overlap` in `[plan]` hides a Mixture-of-Experts model's exchanges: refused
/// for a dense model.
fn overlap_needs_experts(ctx: &mut Ctx<'_>, pp: &FieldPath, p: &RawPlan, fine: &[&Entry]) {
    if p.all_to_all_overlap == Some(true)
        && let Some(dense) = fine.iter().find(|e| e.spec.config.moe.is_none())
    {
        ctx.mismatch(
            &pp.key("all_to_all_overlap"),
            format!(
                "all_to_all_overlap hides a Mixture-of-Experts model's all-to-all exchanges; {} is dense",
                dense.spec.config.name
            ),
            Some("leave `all_to_all_overlap` out".into()),
        );
    }
}

/// An FP8 recipe on a GPU preset without that format (an A100 has no FP8, a Hopper no
/// MXFP8), and `fp8_recipe` with a precision it does not apply to; located at the
/// precision (`[plan]`'s, or `[training]`'s when the plan takes it from there).
fn precision_on_chip(
    ctx: &mut Ctx<'_>,
    pp: &FieldPath,
    (a, p): (&RawFixedAccelerator, &RawPlan),
    precision: Precision,
) {
    let at = if p.precision.is_some() {
        pp.key("precision")
    } else {
        FieldPath::root().key("training").key("precision")
    };
    let given = super::rules::fp8_recipe(ctx, pp, p.fp8_recipe, p.fp8_scaling).map(|(_, k)| k);
    if let Some(key) = given
        && precision != Precision::Fp8Hybrid
    {
        ctx.mismatch(
            &pp.key(key),
            format!(
                "{key} chooses how FP8's scales are taken; precision is {}{}",
                precision.name(),
                if precision == Precision::Mxfp8 {
                    ", whose block scales come from each block"
                } else {
                    ""
                }
            ),
            Some(format!(
                "leave `{key}` out, or use precision = \"fp8-hybrid\""
            )),
        );
    }
    if p.fp8_param_gather == Some(true) && !precision.is_quantised() {
        ctx.mismatch(
            &pp.key("fp8_param_gather"),
            format!(
                "fp8_param_gather keeps the FP8 GEMMs' weights in FP8; precision is {}",
                precision.name()
            ),
            Some("leave it out, or use precision = \"fp8-hybrid\" or \"mxfp8\"".into()),
        );
    }
    let Some(g) = a.preset.as_deref().and_then(gpus::gpu) else {
        return;
    };
    let missing = match precision {
        Precision::Fp8Hybrid if g.peak_dense_fp8_flops_per_second.is_none() => {
            Some("FP8 tensor cores (its datasheet gives no FP8 rate)")
        }
        Precision::Mxfp8 if !g.mx_formats => Some(
            "block-scaled MXFP8 tensor cores (Blackwell's; Hopper and earlier scale per tensor)",
        ),
        _ => None,
    };
    if let Some(what) = missing {
        ctx.mismatch(
            &at,
            format!(
                "precision {} needs {what}; [accelerator] preset {} has none",
                precision.name(),
                g.name
            ),
            Some(match precision {
                Precision::Mxfp8 => {
                    "use fp8-hybrid on Hopper, or a Blackwell preset (b200-sxm-180gb, gb200)".into()
                }
                _ => "use bf16-mixed on this GPU, or a Hopper or Blackwell preset".into(),
            }),
        );
    }
}

/// `[accelerator]` as read: each value given, or its GPU preset's (0 or `None` where
/// neither, reported).
struct Chip {
    tensor_cores: u32,
    vector_cores: u32,
    width: u32,
    depth: u32,
    vector_width: u32,
    buffer: Option<u64>,
    hbm: Option<u64>,
    peak: Option<Option<f64>>,
}

/// The chip of `[accelerator]` (at `ap`): a GPU preset's values where the table leaves
/// them out.
fn accelerator(ctx: &mut Ctx<'_>, ap: &FieldPath, a: &RawFixedAccelerator) -> Chip {
    let preset = match &a.preset {
        None => None,
        Some(name) => {
            let g = gpus::gpu(name);
            if g.is_none() {
                ctx.error(
                    &ap.key("preset"),
                    format!("no GPU preset `{name}`"),
                    Some(format!("presets: {}", gpus::names())),
                );
            }
            g
        }
    };
    // An unknown preset is one mistake: the keys it would have filled are not missing too.
    let unknown_preset = a.preset.is_some() && preset.is_none();
    // Each axis: given, or the preset's; without either, reported as missing.
    let axis =
        |ctx: &mut Ctx<'_>, key: &str, given: Option<u32>, preset: Option<u32>, max| match given
            .or(preset)
        {
            Some(v) => {
                count_in(ctx, &ap.key(key), v.into(), max, &format!("{key} {v}"), "");
                v
            }
            None => {
                if !unknown_preset {
                    ctx.error(
                        &ap.key(key),
                        format!("missing `{key}`"),
                        Some(format!("give it, or a GPU `preset` ({})", gpus::names())),
                    );
                }
                0
            }
        };
    let tensor_cores = axis(
        ctx,
        "tensor_cores",
        a.tensor_cores,
        preset.map(|g| g.streaming_multiprocessors),
        1 << 16,
    );
    let vector_cores = axis(
        ctx,
        "vector_cores",
        a.vector_cores,
        preset.map(|g| g.streaming_multiprocessors),
        1 << 16,
    );
    let width = axis(ctx, "width", a.width, preset.map(|g| g.mac_width), 1 << 12);
    let depth = axis(ctx, "depth", a.depth, preset.map(|g| g.mac_depth), 1 << 12);
    // Without a width there is no vector width to default to (and nothing more to say).
    let tied = (width > 0).then_some(width);
    let lanes = preset.map(|g| g.fp32_lanes_per_sm).or(tied);
    let vector_width = if a.vector_width.is_none() && lanes.is_none() {
        0 // `width` is reported missing already.
    } else {
        axis(ctx, "vector_width", a.vector_width, lanes, 1 << 12)
    };
    let size = |ctx: &mut Ctx<'_>, key: &str, given: &Option<String>, preset: Option<u64>| match (
        given, preset,
    ) {
        (Some(text), _) => positive(
            ctx,
            &ap.key(key),
            text,
            parse_bytes,
            "a size of 0 bytes",
            None,
        ),
        (None, Some(v)) => Some(v),
        (None, None) => {
            if !unknown_preset {
                ctx.error(
                    &ap.key(key),
                    format!("missing `{key}`"),
                    Some(format!(
                        "give it, e.g. \"80 GiB\", or a GPU `preset` ({})",
                        gpus::names()
                    )),
                );
            }
            None
        }
    };
    let buffer = size(ctx, "buffer", &a.buffer, preset.map(|g| g.l2_bytes));
    let hbm = size(ctx, "hbm", &a.hbm, preset.map(|g| g.hbm_bytes));
    let peak = match (&a.peak_flops, preset) {
        (None, g) => Some(g.map(|g| g.peak_dense_16bit_flops_per_second)),
        (Some(text), _) => positive(
            ctx,
            &ap.key("peak_flops"),
            text,
            parse_flops,
            "a peak of 0 FLOP/s",
            Some("e.g. \"312 TFLOP/s\""),
        )
        .map(Some),
    };
    Chip {
        tensor_cores,
        vector_cores,
        width,
        depth,
        vector_width,
        buffer,
        hbm,
        peak,
    }
}

/// `[plan]`'s schedule said against its chunks: plain 1F1B named with more than one chunk
/// per device (the engine takes an unsaid schedule with chunks for the interleaved one);
/// the interleaved overlap asked of another schedule (`[training]`'s applies to interleaved
/// plans only, as in a search).
fn plan_schedule(ctx: &mut Ctx<'_>, pp: &FieldPath, p: &RawPlan, plan: &mut StepPlan) {
    let v = plan.interleaving;
    if p.pipeline_schedule == Some(PipelineSchedule::OneFOneB) && v > 1 {
        ctx.mismatch(
            &pp.key("pipeline_schedule"),
            format!(
                "pipeline_schedule = \"1f1b\" runs one model chunk per device; interleaving = {v} needs pipeline_schedule = \"interleaved\""
            ),
            Some("say \"interleaved\", or leave `interleaving` out".into()),
        );
    }
    let interleaved = plan.schedule() == PipelineSchedule::Interleaved;
    if p.pipeline_parallel_overlap.is_none() && !interleaved {
        // `[training]`'s applies to interleaved plans, as in a search.
        plan.pipeline_parallel_overlap = false;
    }
    if p.pipeline_parallel_overlap == Some(true) && !interleaved {
        let runs = match plan.schedule() {
            PipelineSchedule::OneFOneB => format!(
                "plain 1F1B (interleaving {}), whose transfers are always exposed",
                plan.interleaving
            ),
            s if s.overlaps_chunks() => format!(
                "{}, whose overlapped chunks hide their transfers by themselves",
                s.describe()
            ),
            s => format!("{}, whose transfers are exposed", s.describe()),
        };
        ctx.mismatch(
            &pp.key("pipeline_parallel_overlap"),
            format!(
                "pipeline_parallel_overlap overlaps an interleaved pipeline's transfers (Megatron-LM's overlap_p2p_comm); this plan runs {runs}"
            ),
            Some("give an interleaving above 1, or leave `pipeline_parallel_overlap` out".into()),
        );
    }
}

/// `[plan]`'s counts (at `pp`): the four a plan needs given, each in range.
fn plan_counts(ctx: &mut Ctx<'_>, pp: &FieldPath, p: &RawPlan) {
    for (key, value) in [
        ("tensor_parallel", p.tensor_parallel),
        ("pipeline_parallel", p.pipeline_parallel),
        ("data_parallel", p.data_parallel),
        ("micro_batch", p.micro_batch),
        ("interleaving", Some(p.interleaving.unwrap_or(1))),
        ("expert_parallel", Some(p.expert_parallel.unwrap_or(1))),
        ("context_parallel", Some(p.context_parallel.unwrap_or(1))),
        (
            "expert_tensor_parallel",
            Some(p.expert_tensor_parallel.unwrap_or(1)),
        ),
    ] {
        match value {
            Some(v) => {
                count_in(ctx, &pp.key(key), v, 1 << 20, &format!("{key} {v}"), "");
            }
            None if ctx.has_field(&pp.key(key)) => {} // Reported where it was read.
            None => ctx.mismatch(
                pp,
                format!("missing `{key}`"),
                Some("a [plan] gives tensor_parallel, pipeline_parallel, data_parallel and micro_batch".into()),
            ),
        }
    }
}

/// `[plan]`'s data-parallel sharding keys that contradict each other: a ZeRO stage that
/// shards the optimizer's state with the distributed optimizer said off, resharding
/// without ZeRO-3's gathered weights.
fn plan_sharding(ctx: &mut Ctx<'_>, pp: &FieldPath, p: &RawPlan) {
    let zero = p.zero_stage.unwrap_or(0);
    if zero >= 1 && p.distributed_optimizer == Some(false) {
        ctx.mismatch(
            &pp.key("distributed_optimizer"),
            format!("zero_stage = {zero} shards the optimizer's state: that is the distributed optimizer"),
            Some("leave `distributed_optimizer` out (or true) with a ZeRO stage of 1 to 3".into()),
        );
    }
    let method = p.context_parallel_exchange.unwrap_or_default();
    let overlap_at = pp.key("context_parallel_overlap");
    super::rules::ring_overlap(
        ctx,
        &overlap_at,
        method,
        p.context_parallel_overlap.is_some(),
    );
    if p.reshard_after_forward.is_some() && zero != 3 {
        ctx.mismatch(
            &pp.key("reshard_after_forward"),
            format!("reshard_after_forward frees ZeRO-3's gathered weights; zero_stage is {zero}"),
            Some("give zero_stage = 3, or leave `reshard_after_forward` out".into()),
        );
    }
}

/// The plan of `[plan]`: a choice it leaves out is the first value `[training]` lists.
fn plan_of(p: &RawPlan, training: &Training) -> StepPlan {
    let zero = p
        .zero_stage
        .or_else(|| training.zero_stages.first().copied());
    // Left out, a choice is the first value [training] lists; but a schedule named in
    // [plan] other than the interleaved one runs its own chunks.
    let interleaving = p.interleaving.unwrap_or_else(|| match p.pipeline_schedule {
        Some(s) if s != PipelineSchedule::Interleaved => 1,
        _ => training.pipeline_interleaving.first().copied().unwrap_or(1),
    });
    StepPlan {
        recompute_modules: training.recompute_modules,
        recompute_layers: p.recompute_layers,
        activation_offload_layers: p.activation_offload_layers.unwrap_or(0),
        tensor_parallel: p.tensor_parallel.unwrap_or(1),
        pipeline_parallel: p.pipeline_parallel.unwrap_or(1),
        data_parallel: p.data_parallel.unwrap_or(1),
        micro_batch: p.micro_batch.unwrap_or(1),
        interleaving,
        // The implied schedule is kept unsaid, as the search's plans say it (the same
        // plan compares equal however it was written).
        pipeline_schedule: p
            .pipeline_schedule
            .filter(|&s| s != PipelineSchedule::implied(interleaving))
            .unwrap_or_default(),
        recomputation: p.recomputation.map_or_else(
            || {
                training
                    .activation_recomputation
                    .first()
                    .copied()
                    .unwrap_or(Recomputation::None)
            },
            |r| r.value(),
        ),
        sequence_parallel: p
            .sequence_parallel
            .or_else(|| training.sequence_parallel.first().copied())
            .unwrap_or(false),
        precision: p
            .precision
            .or_else(|| training.precisions.first().copied())
            .unwrap_or(Precision::Bf16Mixed),
        fp8_scaling: super::rules::given_recipe(p.fp8_recipe, p.fp8_scaling)
            .unwrap_or(training.fp8_scaling),
        fp8_param_gather: p.fp8_param_gather.unwrap_or(training.fp8_param_gather),
        optimizer: training.optimizer,
        // ZeRO-1 and up shard the optimizer's state: that is the distributed optimizer (a
        // plan saying otherwise is refused by `plan_sharding`).
        distributed_optimizer: p
            .distributed_optimizer
            .or_else(|| zero.filter(|&z| z >= 1).map(|_| true))
            .or_else(|| training.distributed_optimizer.first().copied())
            .unwrap_or(false),
        sharding: Sharding {
            zero_stage: zero.unwrap_or(0),
            reshard_after_forward: p
                .reshard_after_forward
                .or_else(|| training.reshard_after_forward.first().copied())
                .unwrap_or(true),
            data_parallel_overlap: p
                .data_parallel_overlap
                .unwrap_or(training.data_parallel_overlap),
            sharding_group: p.sharding_group,
        },
        expert_parallel: p.expert_parallel.unwrap_or(1),
        // Left out: the model's default for the width (set with the model, below).
        expert_tensor_parallel: p.expert_tensor_parallel.unwrap_or(0),
        all_to_all_overlap: p.all_to_all_overlap.unwrap_or(training.all_to_all_overlap),
        pipeline_parallel_overlap: p
            .pipeline_parallel_overlap
            .unwrap_or(training.pipeline_parallel_overlap),
        context_parallel: p.context_parallel.unwrap_or(1),
        // `[plan]`'s exchange, or the search's (`[training]`).
        context_exchange: ContextExchange {
            method: p
                .context_parallel_exchange
                .unwrap_or(training.context_exchange.method),
            overlap: p
                .context_parallel_overlap
                .unwrap_or(training.context_exchange.overlap),
        },
        stage_layers: None,
    }
}

/// The plan's blocks per pipeline stage ([`stage_layers`]) set in `plan`; when they are
/// refused, the even split left in their place is no mistake of the user's: it is marked
/// `reported`, so that [`plan_fits`] does not report it beside them.
fn plan_stages(
    ctx: &mut Ctx<'_>,
    pp: &FieldPath,
    p: &RawPlan,
    layers: u64,
    (plan, reported): (
        &mut StepPlan,
        &mut Vec<(FieldPath, std::mem::Discriminant<StepError>)>,
    ),
) {
    match stage_layers(ctx, pp, p, layers) {
        Some(list) => plan.stage_layers = list,
        None => reported.push((
            pp.key("pipeline_parallel"),
            std::mem::discriminant(&StepError::Pipeline {
                pipeline: 0,
                interleaving: 0,
                layers: 0,
                chunks: 0,
            }),
        )),
    }
}

/// The blocks per pipeline stage `[plan]` gives for a model of `layers` blocks: its
/// `stage_layers` list, or the list `first_stage_layers`/`last_stage_layers` make with the
/// other stages split evenly (as Megatron-LM splits them); `Some(None)` for an even split,
/// `None` when reported. The list is checked against the model by the step model's check.
fn stage_layers(
    ctx: &mut Ctx<'_>,
    pp: &FieldPath,
    p: &RawPlan,
    layers: u64,
) -> Option<Option<Vec<u64>>> {
    let ends = (p.first_stage_layers, p.last_stage_layers);
    if let Some(list) = &p.stage_layers {
        if ends != (None, None) {
            let key = if ends.0.is_some() {
                "first_stage_layers"
            } else {
                "last_stage_layers"
            };
            ctx.mismatch(
                &pp.key(key),
                "give `stage_layers` or `first_stage_layers`/`last_stage_layers`, not both",
                Some("`stage_layers` lists every stage; remove the other keys".into()),
            );
            return None;
        }
        return Some(Some(list.clone()));
    }
    if ends == (None, None) {
        return Some(None);
    }
    let stages = p.pipeline_parallel.unwrap_or(0);
    if stages == 0 || !ctx.fine(&pp.key("pipeline_parallel")) {
        // Reported with the counts.
        return Some(None);
    }
    let (first, last) = ends;
    let fixed = u64::from(first.is_some()) + u64::from(last.is_some());
    let given = first.unwrap_or(0).saturating_add(last.unwrap_or(0));
    let middle = stages.saturating_sub(fixed);
    let rest = layers.checked_sub(given);
    let key = if first.is_some() {
        "first_stage_layers"
    } else {
        "last_stage_layers"
    };
    let even = match rest {
        Some(r) if stages > fixed || (stages == fixed && r == 0) => {
            if middle == 0 {
                Some(0)
            } else {
                r.is_multiple_of(middle).then(|| r / middle)
            }
        }
        _ => None,
    };
    let Some(each) = even else {
        ctx.mismatch(
            &pp.key(key),
            format!(
                "the {layers} blocks less the first/last stage's {given} do not split evenly over the other {middle} of the {stages} pipeline stage(s)"
            ),
            Some("or list every stage's blocks with `stage_layers = [...]`".into()),
        );
        return None;
    };
    let mut list = vec![each; stages as usize];
    if let (Some(f), Some(slot)) = (first, list.first_mut()) {
        *slot = f;
    }
    if let (Some(l), Some(slot)) = (last, list.last_mut()) {
        *slot = l;
    }
    Some(Some(list))
}

/// The plan against model `m`, whatever else is wrong: each problem at the `[plan]` key it
/// is about, unless a field it relates is wrong or unreadable (that is reported already);
/// the problems with the model (`with_model`, named by it) or those without it.
/// `input` is the step input but for its model.
fn plan_fits(
    ctx: &mut Ctx<'_>,
    pp: &FieldPath,
    input: &StepInput,
    (m, with_model): (&ModelSpec, bool),
    reported: &mut Vec<(FieldPath, std::mem::Discriminant<StepError>)>,
) {
    let input = StepInput {
        model: m.config.clone(),
        ..input.clone()
    };
    let training = FieldPath::root().key("training");
    let devices = FieldPath::root().key("cluster").key("devices");
    for e in step::problems(&input) {
        let (key, related): (&str, Vec<FieldPath>) = match e {
            StepError::TensorParallel { .. } => ("tensor_parallel", vec![]),
            StepError::Pipeline { .. } => ("pipeline_parallel", vec![pp.key("interleaving")]),
            StepError::StageLayers { .. } => (
                "stage_layers",
                vec![
                    pp.key("pipeline_parallel"),
                    pp.key("interleaving"),
                    pp.key("first_stage_layers"),
                    pp.key("last_stage_layers"),
                ],
            ),
            StepError::Devices { .. } => (
                "data_parallel",
                vec![
                    pp.key("tensor_parallel"),
                    pp.key("pipeline_parallel"),
                    pp.key("context_parallel"),
                    devices.clone(),
                ],
            ),
            StepError::ContextParallel { .. } | StepError::ContextParallelAttention { .. } => {
                ("context_parallel", vec![])
            }
            StepError::ContextAllToAll { .. } => (
                "context_parallel",
                vec![
                    pp.key("tensor_parallel"),
                    pp.key("context_parallel_exchange"),
                ],
            ),
            StepError::Batch { .. } => (
                "micro_batch",
                vec![pp.key("data_parallel"), training.key("global_batch")],
            ),
            StepError::ExpertsWithoutMoe { .. } | StepError::ExpertParallel { .. } => {
                ("expert_parallel", vec![])
            }
            StepError::ExpertTensorParallel { .. } => ("expert_tensor_parallel", vec![]),
            StepError::ExpertFolding { .. } => (
                "expert_parallel",
                vec![
                    pp.key("expert_tensor_parallel"),
                    pp.key("tensor_parallel"),
                    pp.key("context_parallel"),
                    pp.key("data_parallel"),
                ],
            ),
            StepError::MoeSequenceParallel { .. } => {
                ("sequence_parallel", vec![pp.key("tensor_parallel")])
            }
            StepError::ZeroStage { .. } => ("zero_stage", vec![]),
            StepError::ShardingGroup { .. } => (
                "sharding_group",
                vec![
                    pp.key("data_parallel"),
                    pp.key("context_parallel"),
                    pp.key("zero_stage"),
                ],
            ),
            StepError::PipelineSchedule(_) => (
                "pipeline_schedule",
                vec![
                    pp.key("pipeline_parallel"),
                    pp.key("interleaving"),
                    pp.key("micro_batch"),
                    pp.key("data_parallel"),
                    training.key("global_batch"),
                ],
            ),
            StepError::Interleaving { .. } => (
                "interleaving",
                vec![
                    pp.key("pipeline_parallel"),
                    pp.key("micro_batch"),
                    pp.key("data_parallel"),
                    training.key("global_batch"),
                ],
            ),
            _ => ("", vec![]),
        };
        let at = if key.is_empty() {
            pp.clone()
        } else {
            pp.key(key)
        };
        let of_model = matches!(
            e,
            StepError::TensorParallel { .. }
                | StepError::Pipeline { .. }
                | StepError::StageLayers { .. }
                | StepError::ExpertsWithoutMoe { .. }
                | StepError::ExpertParallel { .. }
                | StepError::ExpertTensorParallel { .. }
                | StepError::ExpertFolding { .. }
                | StepError::MoeSequenceParallel { .. }
                | StepError::ContextParallel { .. }
                | StepError::ContextParallelAttention { .. }
                | StepError::ContextAllToAll { .. }
        );
        if of_model != with_model || !ctx.fine(&at) || !ctx.all_fine(&related) {
            continue;
        }
        let problem = (at.clone(), std::mem::discriminant(&e));
        if reported.contains(&problem) {
            continue;
        }
        reported.push(problem);
        let message = if of_model {
            format!("{}: {e}", m.config.name)
        } else {
            e.to_string()
        };
        ctx.mismatch(&at, message, None);
    }
}
