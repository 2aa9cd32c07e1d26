//! `[training]`: batch, recomputation, precision, optimizer, distributed optimizer, the
//! memory model and how a layer's operators share the chip.

use super::rules::{count_in, duplicates, element_at, recompute_modules, ring_overlap};
use crate::raw::{OneOrMany, RawRecomputation, RawSpec, RawTraining};
use crate::{Ctx, FieldPath};
use archplace_engine::execution::{Execution, Fp8Library};
use archplace_engine::pipeline::PipelineSchedule;
use archplace_engine::training::{
    ContextExchange, Fp8Scaling, MemoryModel, Optimizer, Precision, Recomputation, Training,
};
/// `[training]` as read: each value given or its default; what is wrong is reported (and
/// left for the rules relating it to skip, see [`Ctx::fine`]).
pub(super) fn training(raw: &RawSpec, ctx: &mut Ctx<'_>) -> Training {
    let t = &raw.training;
    let path = FieldPath::root().key("training");
    let global_batch = t.global_batch.unwrap_or(4096);
    count_in(
        ctx,
        &path.key("global_batch"),
        global_batch,
        1 << 24,
        &format!("global batch {global_batch}"),
        " samples",
    );
    let micro_batch_sizes =
        micro_batch_sizes(ctx, &path, t.micro_batch_sizes.as_ref(), global_batch);
    let memory_model = t.memory_model.unwrap_or(MemoryModel::Megatron);
    let activation_recomputation = recomputation(
        ctx,
        &path,
        t.activation_recomputation.as_ref(),
        memory_model,
    );
    let recompute_modules = modules(raw, ctx, &path, &activation_recomputation);
    let reference = memory_model == MemoryModel::Reference;
    let precision_path = path.key("precision");
    let precisions = choices(
        ctx,
        &precision_path,
        t.precision.as_ref(),
        Precision::Bf16Mixed,
        "e.g. \"bf16-mixed\"",
    );
    let precisions = precisions.unwrap_or_default();
    if t.fp8_param_gather == Some(true) && !precisions.iter().any(|p| p.is_quantised()) {
        ctx.mismatch(
            &path.key("fp8_param_gather"),
            "fp8_param_gather keeps the FP8 GEMMs' weights in FP8; no precision listed has FP8 GEMMs",
            Some("leave it out, or train in \"fp8-hybrid\" or \"mxfp8\"".into()),
        );
    }
    let recipe = super::rules::fp8_recipe(ctx, &path, t.fp8_recipe, t.fp8_scaling);
    rowwise_is_torchaos(ctx, &path, t, recipe.map(|(r, _)| r));
    if let Some((_, key)) = recipe
        && !precisions.contains(&Precision::Fp8Hybrid)
    {
        let listed: Vec<&str> = precisions.iter().map(|p| p.name()).collect();
        ctx.mismatch(
            &path.key(key),
            format!(
                "{key} chooses how FP8's scales are taken; precision is {} (no fp8-hybrid)",
                if listed.is_empty() {
                    "bf16-mixed".to_string()
                } else {
                    listed.join(", ")
                }
            ),
            Some(format!(
                "leave `{key}` out, or train in precision = \"fp8-hybrid\""
            )),
        );
    }
    if reference && t.precision.is_some() {
        ctx.mismatch(
            &precision_path,
            "the reference memory model counts `bytes_per_element`, not a precision",
            Some("remove `precision`, or use memory_model = \"megatron\"".into()),
        );
    }
    // Two switches the reference memory model does not have.
    let switch = |ctx: &mut Ctx<'_>, key: &str, given: Option<&OneOrMany<bool>>, what: &str| {
        let at = path.key(key);
        let values = choices(ctx, &at, given, false, "use false, true or [false, true]");
        let values = values.unwrap_or_default();
        if reference && values.contains(&true) {
            ctx.mismatch(
                &at,
                format!("the reference memory model has no {what}"),
                Some("use memory_model = \"megatron\"".into()),
            );
        }
        values
    };
    let distributed_optimizer = switch(
        ctx,
        "distributed_optimizer",
        t.distributed_optimizer.as_ref(),
        "distributed optimizer",
    );
    let zero_stages = zero_stages(ctx, &path, t, reference);
    let reshard_after_forward = choices(
        ctx,
        &path.key("reshard_after_forward"),
        t.reshard_after_forward.as_ref(),
        true,
        "use true, false or [true, false]",
    )
    .unwrap_or_default();
    let sequence_parallel = switch(
        ctx,
        "sequence_parallel",
        t.sequence_parallel.as_ref(),
        "sequence parallelism",
    );
    let pipeline_interleaving =
        interleaving(ctx, &path, t.pipeline_interleaving.as_ref(), reference);
    let pipeline_schedules = schedules(ctx, &path, t, &pipeline_interleaving, reference);
    let expert_parallel = expert_parallel(ctx, &path, t.expert_parallel.as_ref());
    let (context_parallel, context_exchange) = context_parallel(ctx, &path, t, reference);
    let bytes_per_element = t.bytes_per_element.unwrap_or(2);
    element_bytes(ctx, &path, t.bytes_per_element, memory_model, &precisions);
    let optimizer = t.optimizer.unwrap_or(match memory_model {
        MemoryModel::Megatron => Optimizer::Adam,
        MemoryModel::Reference => Optimizer::Sgd,
    });
    Training {
        recompute_modules,
        global_batch,
        micro_batch_sizes,
        activation_recomputation,
        optimizer,
        precisions,
        fp8_scaling: recipe.map(|(r, _)| r).unwrap_or_default(),
        fp8_param_gather: t.fp8_param_gather.unwrap_or(false),
        distributed_optimizer,
        zero_stages,
        reshard_after_forward,
        data_parallel_overlap: t.data_parallel_overlap.unwrap_or(false),
        sequence_parallel,
        pipeline_interleaving,
        pipeline_schedules,
        expert_parallel,
        context_parallel,
        context_exchange,
        all_to_all_overlap: t.all_to_all_overlap.unwrap_or(false),
        pipeline_parallel_overlap: t.pipeline_parallel_overlap.unwrap_or(false),
        memory_model,
        bytes_per_element,
        execution: Execution {
            operators: t.operator_execution.unwrap_or_default(),
            tensor_parallel_overlap: t.tensor_parallel_overlap.unwrap_or_default(),
            kernels: t.kernel_fusion.unwrap_or_default(),
            fp8_library: t.fp8_library.unwrap_or_default(),
            cross_entropy: t.cross_entropy.unwrap_or_default(),
            overlap_efficiency: Default::default(),
        },
    }
}

/// `micro_batch_sizes`: at least one, each dividing the global batch (when that is fine).
fn micro_batch_sizes(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    given: Option<&Vec<u64>>,
    global_batch: u64,
) -> Vec<u64> {
    let micro_batch_sizes = given.cloned().unwrap_or_else(|| vec![1]);
    let mbs_path = path.key("micro_batch_sizes");
    if micro_batch_sizes.is_empty() && ctx.fine(&mbs_path) {
        ctx.error(
            &mbs_path,
            "no micro-batch size to try",
            Some("list at least one, e.g. [1, 2, 4]".into()),
        );
    }
    let batch_known = ctx.fine(&path.key("global_batch"));
    for (i, &b) in micro_batch_sizes.iter().enumerate() {
        if b == 0 {
            ctx.error(
                &mbs_path.index(i),
                "a micro-batch of 0 samples",
                Some("use 1 or more".into()),
            );
        } else if batch_known && !global_batch.is_multiple_of(b) {
            let divisors: Vec<String> = (1..=global_batch.min(1 << 16))
                .filter(|d| global_batch.is_multiple_of(*d))
                .take(12)
                .map(|d| d.to_string())
                .collect();
            ctx.mismatch(
                &mbs_path.index(i),
                format!("micro-batch size {b} does not divide the global batch {global_batch}"),
                Some(format!(
                    "divisors of {global_batch}: {}, ...",
                    divisors.join(", ")
                )),
            );
        }
    }
    duplicates(ctx, &mbs_path, &micro_batch_sizes);
    micro_batch_sizes
}

/// `activation_recomputation`: the choices to try (none and full by default); selective
/// only with the Megatron memory model.
fn recomputation(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    given: Option<&Vec<RawRecomputation>>,
    memory_model: MemoryModel,
) -> Vec<Recomputation> {
    let activation_recomputation: Vec<Recomputation> = match given {
        Some(list) => list.iter().map(|r| r.value()).collect(),
        None => vec![Recomputation::None, Recomputation::Full],
    };
    let rec_path = path.key("activation_recomputation");
    if activation_recomputation.is_empty() && ctx.fine(&rec_path) {
        ctx.error(
            &rec_path,
            "no recomputation choice to try",
            Some("list at least one of \"none\", \"selective\", \"selective_op\", \"full\"".into()),
        );
    }
    duplicates(ctx, &rec_path, &activation_recomputation);
    if memory_model == MemoryModel::Reference {
        for (i, r) in activation_recomputation.iter().enumerate() {
            if matches!(r, Recomputation::Selective | Recomputation::SelectiveOp) {
                ctx.mismatch(
                    &rec_path.index(i),
                    "the reference memory model has no selective recomputation",
                    Some("use memory_model = \"megatron\", or \"none\"/\"full\"".into()),
                );
            }
        }
    }
    activation_recomputation
}

/// `fp8_library`: the row-wise recipe (`recipe`, as `[training]` gives it) is torchao's,
/// so naming Transformer Engine with it is a mismatch.
fn rowwise_is_torchaos(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    t: &RawTraining,
    recipe: Option<Fp8Scaling>,
) {
    if recipe == Some(Fp8Scaling::Rowwise) && t.fp8_library == Some(Fp8Library::TransformerEngine) {
        ctx.mismatch(
            &path.key("fp8_library"),
            "the row-wise FP8 recipe is torchao's; fp8_library is \"transformer_engine\"",
            Some("give fp8_library = \"torchao\", or leave it out".into()),
        );
    }
}

/// `[training] recompute_modules`, which needs selective recomputation among the choices
/// or in the `[plan]`.
fn modules(
    raw: &RawSpec,
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    choices: &[Recomputation],
) -> archplace_engine::training::RecomputeModules {
    let planned = raw.plan.as_ref().and_then(|p| p.recomputation);
    let selective = choices.contains(&Recomputation::Selective)
        || planned.map(|r| r.value()) == Some(Recomputation::Selective);
    let given = raw.training.recompute_modules.as_deref();
    recompute_modules(
        ctx,
        &path.key("recompute_modules"),
        given,
        (selective, None),
    )
}

/// `pipeline_interleaving`: model chunks per device to try, 1 to 64; more than 1 only with
/// the Megatron memory model.
fn interleaving(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    given: Option<&OneOrMany<u64>>,
    reference: bool,
) -> Vec<u64> {
    let interleaving_path = path.key("pipeline_interleaving");
    let pipeline_interleaving = choices(
        ctx,
        &interleaving_path,
        given,
        1,
        "use 1, or a list such as [1, 2]",
    );
    let pipeline_interleaving = pipeline_interleaving.unwrap_or_default();
    for (i, &v) in pipeline_interleaving.iter().enumerate() {
        let at = element_at(&interleaving_path, given, i);
        if !(1..=64).contains(&v) {
            ctx.error(
                &at,
                format!("{v} model chunks per device is outside 1 … 64"),
                Some("1 is plain 1F1B; 2 to 4 are usual for interleaving".into()),
            );
        } else if v > 1 && reference {
            ctx.mismatch(
                &at,
                "the reference memory model has no interleaved pipeline",
                Some("use memory_model = \"megatron\"".into()),
            );
        }
    }
    pipeline_interleaving
}

/// `pipeline_schedule`: the schedules a search tries (empty: the implied ones), each
/// listed once (`choices`), tried in `PipelineSchedule::ALL`'s order; "interleaved" only with an interleaving above
/// 1 to try, and an interleaving above 1 only with "interleaved" listed; none with the
/// reference memory model, whose pipeline is its own.
fn schedules(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    t: &RawTraining,
    interleavings: &[u64],
    reference: bool,
) -> Vec<PipelineSchedule> {
    let at = path.key("pipeline_schedule");
    let Some(given) = t.pipeline_schedule.as_ref() else {
        return Vec::new();
    };
    let Some(listed) = choices(
        ctx,
        &at,
        Some(given),
        PipelineSchedule::OneFOneB,
        "e.g. \"1f1b\" or [\"1f1b\", \"zero-bubble\"]",
    ) else {
        return Vec::new();
    };
    if reference {
        ctx.mismatch(
            &at,
            "the reference memory model prices its own pipeline (1F1B); it has no schedules",
            Some("use memory_model = \"megatron\", or leave `pipeline_schedule` out".into()),
        );
        return Vec::new();
    }
    let interleaved = listed.contains(&PipelineSchedule::Interleaved);
    let chunks = interleavings.iter().any(|&v| v > 1);
    if interleaved && !chunks {
        ctx.mismatch(
            &at,
            "\"interleaved\" needs an interleaving above 1 to try; pipeline_interleaving lists none",
            Some("add e.g. pipeline_interleaving = [1, 2]".into()),
        );
    } else if chunks && !interleaved && ctx.fine(&path.key("pipeline_interleaving")) {
        ctx.mismatch(
            &path.key("pipeline_interleaving"),
            "an interleaving above 1 runs the interleaved schedule, which pipeline_schedule does not list",
            Some("add \"interleaved\" to pipeline_schedule, or leave the interleavings above 1 out".into()),
        );
    }
    PipelineSchedule::ALL
        .into_iter()
        .filter(|s| listed.contains(s))
        .collect()
}

/// `zero_stage`: stages 0 to 3, not beside `distributed_optimizer` (which says 0 or 1),
/// not with the reference memory model (it shards nothing).
fn zero_stages(ctx: &mut Ctx<'_>, path: &FieldPath, t: &RawTraining, reference: bool) -> Vec<u64> {
    let at = path.key("zero_stage");
    let Some(given) = t.zero_stage.as_ref() else {
        return Vec::new();
    };
    let stages = choices(
        ctx,
        &at,
        Some(given),
        0,
        "use 0 to 3, or a list such as [1, 3]",
    )
    .unwrap_or_default();
    for (i, &v) in stages.iter().enumerate() {
        let here = element_at(&at, Some(given), i);
        if v > 3 && ctx.fine(&here) {
            ctx.error(
                &here,
                format!("zero_stage = {v}: ZeRO has stages 0 to 3"),
                Some("use 0 (replicated), 1 (optimizer sharded), 2 (and gradients) or 3 (and weights: FSDP)".into()),
            );
        }
    }
    if t.distributed_optimizer.is_some() {
        ctx.mismatch(
            &at,
            "`zero_stage` and `distributed_optimizer` both say how the state is sharded",
            Some("give one: zero_stage = [0, 1] is distributed_optimizer = [false, true]".into()),
        );
    }
    if reference && stages.iter().any(|&v| v > 0) {
        ctx.mismatch(
            &at,
            "the reference memory model shards no state",
            Some("use memory_model = \"megatron\"".into()),
        );
    }
    stages
}

/// `expert_parallel`: widths from 1 to 16,384 (which ones a model takes is checked with
/// the models).
fn expert_parallel(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    given: Option<&OneOrMany<u64>>,
) -> Vec<u64> {
    let at = path.key("expert_parallel");
    let help = "use 1, or a list such as [1, 8]";
    sizes(ctx, &at, given, help, "expert-parallel width")
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

/// A list of parallel sizes to try at `at` (`expert_parallel`, `context_parallel`): at
/// least one, none twice, each from 1 to 2¹⁴ (`what` names one in messages); each with
/// where it was written (its index when a list was given).
fn sizes(
    ctx: &mut Ctx<'_>,
    at: &FieldPath,
    given: Option<&OneOrMany<u64>>,
    help: &str,
    what: &str,
) -> Vec<(FieldPath, u64)> {
    let values = choices(ctx, at, given, 1, help).unwrap_or_default();
    let mut out = Vec::with_capacity(values.len());
    for (i, &v) in values.iter().enumerate() {
        let here = element_at(at, given, i);
        count_in(ctx, &here, v, 1 << 14, &format!("{what} {v}"), "");
        out.push((here, v));
    }
    out
}

/// `context_parallel`: the sizes to try (each from 1 to 2¹⁴; above 1 only with the
/// Megatron memory model), and the exchange's method and overlap (the overlap only with
/// the ring). Which sizes a model takes is checked with the models.
fn context_parallel(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    t: &RawTraining,
    reference: bool,
) -> (Vec<u64>, ContextExchange) {
    let at = path.key("context_parallel");
    let help = "use 1, or a list such as [1, 2, 4]";
    let given = t.context_parallel.as_ref();
    let sizes = sizes(ctx, &at, given, help, "context-parallel size");
    for (here, _) in sizes.iter().filter(|(_, cp)| reference && *cp > 1) {
        ctx.mismatch(
            here,
            "the reference memory model has no context parallelism",
            Some("use memory_model = \"megatron\"".into()),
        );
    }
    let sizes = sizes.into_iter().map(|(_, cp)| cp).collect();
    let method = t.context_parallel_exchange.unwrap_or_default();
    let overlap_at = path.key("context_parallel_overlap");
    ring_overlap(
        ctx,
        &overlap_at,
        method,
        t.context_parallel_overlap.is_some(),
    );
    let exchange = ContextExchange {
        method,
        overlap: t.context_parallel_overlap.unwrap_or(true),
    };
    (sizes, exchange)
}

/// `bytes_per_element`: 1, 2 or 4, and with the Megatron memory model the element size of
/// every precision listed (when those are fine).
fn element_bytes(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    given: Option<u64>,
    memory_model: MemoryModel,
    precisions: &[Precision],
) {
    let bytes_per_element = given.unwrap_or(2);
    let bpe_path = path.key("bytes_per_element");
    if ![1, 2, 4].contains(&bytes_per_element) {
        ctx.error(
            &bpe_path,
            format!("{bytes_per_element} bytes per element is not supported"),
            Some("use 1, 2 (fp16/bf16) or 4 (fp32)".into()),
        );
    } else if memory_model == MemoryModel::Megatron
        && given.is_some()
        && ctx.all_fine(&[path.key("precision"), path.key("memory_model")])
    {
        // The precision sets the element size; an explicit one must agree with every
        // precision listed.
        if let Some(p) = precisions
            .iter()
            .find(|p| p.element_bytes() != bytes_per_element)
        {
            ctx.mismatch(
                &bpe_path,
                format!(
                    "{bytes_per_element} bytes per element contradicts precision {} ({} bytes)",
                    p.name(),
                    p.element_bytes()
                ),
                Some("remove `bytes_per_element`: the precision sets it".into()),
            );
        }
    }
}

/// The values of a key that takes one value or a list to try (`default` when absent): none
/// reported as an error with `help`, repeats reported; `None` when empty.
fn choices<T: Clone + PartialEq + std::fmt::Debug>(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    given: Option<&OneOrMany<T>>,
    default: T,
    help: &str,
) -> Option<Vec<T>> {
    let values = given.map_or_else(|| vec![default], OneOrMany::to_vec);
    if values.is_empty() && ctx.fine(path) {
        ctx.error(path, "no value to try", Some(help.to_string()));
        return None;
    }
    duplicates(ctx, path, &values);
    Some(values)
}
