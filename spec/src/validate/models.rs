//! `[[models]]`: presets or explicit hyper-parameters, with their consistency rules.

use super::MAX_ELEMENTS;
use super::rules::count_in;
use crate::raw::{RawBaseline, RawHead, RawModel, RawSpec};
use crate::{Ctx, FieldPath, ModelSpec};
use archplace_engine::model::NormPosition;
use archplace_engine::model::{
    AttentionKernel, Head, MAX_FLASH_HEAD_DIM, Mla, ModelConfig, Moe, PRESETS, Positions, preset,
};
use archplace_engine::placement::{MAX_PROGRAM_STEPS, ProgramSize, max_layers};
use archplace_engine::search::context_parallel_fits;
use archplace_engine::training::ContextMethod;
use archplace_engine::training::{Baseline, Cluster, RecomputeModule, RecomputeModules, Training};
/// A `[[models]]` entry as read: its index in the file and its configuration.
pub(super) struct Entry {
    pub(super) index: usize,
    pub(super) spec: ModelSpec,
}

/// The `[[models]]` entries whose shape could be read (a preset, or the hyper-parameters
/// given), each checked; what is wrong is reported, see [`Ctx::fine`] for which entries
/// the rules relating them to other sections may use.
pub(super) fn models(
    raw: &RawSpec,
    ctx: &mut Ctx<'_>,
    training: &Training,
    cluster: &Cluster,
) -> Vec<Entry> {
    let path = FieldPath::root().key("models");
    if raw.models.is_empty() {
        ctx.error(
            &path,
            "no model to train",
            Some("add a `[[models]]` table, e.g. `preset = \"gpt3-175b\"`".into()),
        );
        return Vec::new();
    }
    let mut out: Vec<Entry> = Vec::new();
    for (i, m) in raw.models.iter().enumerate() {
        if ctx.model_failed(i) {
            continue;
        }
        if let Some(spec) = model(m, &path.index(i), ctx, training, cluster) {
            out.push(Entry { index: i, spec });
        }
    }
    // Names as read: a name (or preset) that could not be read names nothing.
    for (k, e) in out.iter().enumerate() {
        let at = path.index(e.index);
        if !ctx.all_fine(&[at.key("name"), at.key("preset")]) {
            continue;
        }
        let n = &e.spec.config.name;
        if out[..k].iter().any(|o| o.spec.config.name == *n) {
            ctx.mismatch(
                &at.key("name"),
                format!("two models are called `{n}`"),
                Some("give each model its own `name`".into()),
            );
        }
    }
    if out.len() == raw.models.len() {
        // Every model's experts are known.
        check_expert_parallel(&out, training, ctx);
        check_context_parallel(&out, training, cluster, ctx);
        let at = FieldPath::root().key("training").key("recompute_modules");
        if ctx.fine(&at) {
            let all: Vec<&Entry> = out.iter().collect();
            recompute_modules_apply(ctx, &at, training.recompute_modules, &all);
        }
    }
    out
}

/// Each of the `modules` selective recomputation runs again names a part some model in
/// `entries` has (a Mixture-of-Experts layer, shared experts, latent attention, a
/// pre-norm block's norms, a dense MLP): a module none has would recompute nothing.
pub(super) fn recompute_modules_apply(
    ctx: &mut Ctx<'_>,
    at: &FieldPath,
    modules: RecomputeModules,
    entries: &[&Entry],
) {
    for m in modules.iter() {
        let has = |c: &ModelConfig| match m {
            RecomputeModule::CoreAttn => true,
            RecomputeModule::Layernorm => c.norm_position == NormPosition::Pre,
            RecomputeModule::Mlp => c.moe.is_none() || c.dense_blocks() > 0,
            RecomputeModule::Moe | RecomputeModule::MoeAct => c.moe.is_some(),
            RecomputeModule::SharedExperts => c.moe.is_some_and(|e| e.shared_experts > 0),
            RecomputeModule::MlaUpProj => c.attention == AttentionKernel::Mla,
        };
        if entries.iter().any(|e| has(&e.spec.config)) {
            continue;
        }
        let part = match m {
            RecomputeModule::CoreAttn => "attention",
            RecomputeModule::Layernorm => "a norm before attention and the MLP (pre-norm)",
            RecomputeModule::Mlp => "a dense MLP",
            RecomputeModule::Moe | RecomputeModule::MoeAct => "a Mixture-of-Experts layer",
            RecomputeModule::SharedExperts => "shared experts",
            RecomputeModule::MlaUpProj => "multi-head latent attention",
        };
        ctx.mismatch(
            at,
            format!(
                "recompute module \"{}\" reruns {part}, which no model here has",
                m.name()
            ),
            Some(format!("remove \"{}\" from the list", m.name())),
        );
    }
}

/// `[training] expert_parallel`: every width above 1 divides some Mixture-of-Experts
/// model's experts (a model runs the widths that divide its own; a width no model takes
/// is a mistake).
fn check_expert_parallel(entries: &[Entry], training: &Training, ctx: &mut Ctx<'_>) {
    let at = FieldPath::root().key("training").key("expert_parallel");
    if !ctx.fine(&at) {
        return;
    }
    let experts: Vec<u64> = entries
        .iter()
        .filter_map(|e| e.spec.config.moe.map(|m| m.experts))
        .collect();
    if training.all_to_all_overlap && experts.is_empty() {
        ctx.mismatch(
            &FieldPath::root().key("training").key("all_to_all_overlap"),
            "all_to_all_overlap hides a Mixture-of-Experts model's all-to-all exchanges; these models are dense",
            Some("remove `all_to_all_overlap`, or give a model `experts`".into()),
        );
    }
    let mut reported = false;
    for &ep in training.expert_parallel.iter().filter(|&&ep| ep > 1) {
        if experts.iter().any(|e| e.is_multiple_of(ep)) {
            continue;
        }
        reported = true;
        let (message, help) = if experts.is_empty() {
            (
                format!(
                    "expert-parallel width {ep} splits the experts of a Mixture-of-Experts model; these models are dense"
                ),
                "remove `expert_parallel`, or give a model `experts`".to_string(),
            )
        } else {
            (
                format!("expert-parallel width {ep} divides no model's experts ({experts:?})"),
                "use widths dividing a model's experts".to_string(),
            )
        };
        ctx.mismatch(&at, message, Some(help));
    }
    // A model none of whose widths apply (when no width was reported above).
    for (e, m) in entries
        .iter()
        .filter(|_| !reported)
        .filter_map(|e| e.spec.config.moe.map(|m| (e, m)))
    {
        let usable = training
            .expert_parallel
            .iter()
            .any(|ep| m.experts.is_multiple_of(*ep));
        if !usable {
            ctx.mismatch(
                &at,
                format!(
                    "no expert-parallel width of {:?} divides the {} experts of {}",
                    training.expert_parallel, m.experts, e.spec.config.name
                ),
                Some("add a width dividing its experts, e.g. 1".into()),
            );
        }
    }
}

/// `[training] context_parallel`: every size above 1 splits some model (see
/// [`context_parallel_fits`]: it divides the devices, cuts the sequence into `2·CP` equal
/// chunks, the attention is fused), and every model takes one of the sizes — each with the
/// reason when not.
fn check_context_parallel(
    entries: &[Entry],
    training: &Training,
    cluster: &Cluster,
    ctx: &mut Ctx<'_>,
) {
    let at = FieldPath::root().key("training").key("context_parallel");
    let devices = FieldPath::root().key("cluster").key("devices");
    if !ctx.all_fine(&[at.clone(), devices]) || training.context_parallel.is_empty() {
        return;
    }
    let mut reported = false;
    let sizes = &training.context_parallel;
    let fits = |e: &Entry, cp: u64| {
        context_parallel_fits(
            &e.spec.config,
            cp,
            cluster.devices,
            training.context_exchange.method,
        )
    };
    for (i, &cp) in sizes.iter().enumerate().filter(|(_, cp)| **cp > 1) {
        let why: Vec<String> = entries.iter().filter_map(|e| fits(e, cp).err()).collect();
        if why.len() == entries.len() {
            reported = true;
            let here = if sizes.len() > 1 {
                at.index(i)
            } else {
                at.clone()
            };
            ctx.mismatch(
                &here,
                format!(
                    "context-parallel size {cp} splits no model: {}",
                    why.join("; ")
                ),
                Some(
                    if training.context_exchange.method == ContextMethod::AllToAll {
                        "use sizes dividing the devices, the sequence into 2·CP chunks and, for the all-to-all, a tensor-parallel rank's heads and key-value heads"
                    } else {
                        "use sizes dividing the devices and the sequence into 2·CP chunks"
                    }
                    .into(),
                ),
            );
        }
    }
    for e in entries.iter().filter(|_| !reported) {
        let why: Vec<String> = sizes.iter().filter_map(|&cp| fits(e, cp).err()).collect();
        if why.len() == training.context_parallel.len() {
            ctx.mismatch(
                &at,
                format!(
                    "no context-parallel size of {:?} splits {}: {}",
                    training.context_parallel,
                    e.spec.config.name,
                    why.join("; ")
                ),
                Some("add a size that does, e.g. 1".into()),
            );
        }
    }
}

/// The fields a tensor-parallel width must divide the model by (and the preset they may
/// come from).
const WIDTH_FIELDS: [&str; 6] = [
    "hidden",
    "heads",
    "kv_heads",
    "ffn",
    "max_tensor_parallel",
    "preset",
];

/// Whether each of the entry's (at `path`) fields `keys` is fine (see [`Ctx::fine`]).
fn fine(ctx: &Ctx<'_>, path: &FieldPath, keys: &[&str]) -> bool {
    keys.iter().all(|k| ctx.fine(&path.key(k)))
}

/// The keys of a `[[models]]` entry that a plan's rules depend on (its shape: widths,
/// blocks, sequence, experts, attention): a mistake in another key (its `name`, `dropout`,
/// a misspelt key) leaves them to run.
const SHAPE_FIELDS: [&str; 17] = [
    "preset",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn",
    "vocab",
    "seq_len",
    "max_tensor_parallel",
    "attention",
    "experts",
    "experts_per_token",
    "expert_ffn",
    "shared_experts",
    "dense_layers",
    "mtp_depth",
];

/// Whether the rules relating a plan to `entry` may run: its shape is fine, or its shape
/// keys that are not could not be read and its preset's values stand in for them (what can
/// be known), each such key's error saying so. A shape key read but wrong leaves the shape
/// unknown: the rules do not run, and that key's error says they were skipped.
pub(super) fn shape_usable(ctx: &mut Ctx<'_>, entry: &Entry, has_preset: bool) -> bool {
    let path = FieldPath::root().key("models").index(entry.index);
    let bad: Vec<&str> = SHAPE_FIELDS
        .iter()
        .copied()
        .filter(|k| !ctx.fine(&path.key(k)))
        .collect();
    if bad.is_empty() {
        return true;
    }
    let stand_in = has_preset
        && ctx.fine(&path.key("preset"))
        && bad.iter().all(|k| ctx.dropped(&path.key(k)));
    let note = if stand_in {
        "the [plan]'s checks against this model used the preset's value"
    } else {
        "the [plan]'s checks against this model were skipped until it is fixed"
    };
    for k in bad {
        ctx.add_help(&path.key(k), note);
    }
    stand_in
}

/// One `[[models]]` entry: its preset (or explicit shape), the overrides merged in, then
/// each group of rules, each over the fields it relates that are fine; `None` when its
/// shape is unknown (an unknown preset, or hyper-parameters missing).
fn model(
    m: &RawModel,
    path: &FieldPath,
    ctx: &mut Ctx<'_>,
    training: &Training,
    cluster: &Cluster,
) -> Option<ModelSpec> {
    if let Some(name) = &m.name
        && (name.trim().is_empty()
            || name.chars().count() > 100
            || name.chars().any(char::is_control))
    {
        ctx.error(
            &path.key("name"),
            format!("{name:?} cannot name a model"),
            Some("use 1 to 100 printable characters (it labels the model in results, plots and metrics)".into()),
        );
    }
    let base = check_base(m, path, ctx)?;
    let cfg = merged(m, base);
    check_counts(&cfg, path, ctx);
    check_experts(&cfg, m, path, ctx);
    check_latent(&cfg, m, path, ctx);
    check_mtp(&cfg, path, ctx);
    check_shapes(&cfg, m, path, ctx);
    check_size(&cfg, training, path, ctx);
    check_placement(&cfg, cluster, m, path, ctx);
    // The baseline is checked against the model's shape, when that is fine.
    let baseline = m
        .baseline
        .as_ref()
        .filter(|_| fine(ctx, path, &["layers"]) && fine(ctx, path, &WIDTH_FIELDS))
        .and_then(|bl| check_baseline(bl, &cfg, cluster, &path.key("baseline"), ctx));
    let weight = m.weight.unwrap_or(1.0);
    if !(weight.is_finite() && weight > 0.0 && weight <= 1e6) {
        ctx.error(
            &path.key("weight"),
            format!("weight {weight} cannot weigh a model in the objective"),
            Some("give a positive number up to 1,000,000 (how many times the model counts)".into()),
        );
    }
    Some(ModelSpec {
        config: cfg,
        baseline,
        weight,
    })
}

/// The preset named, or (without one) a check that the shape is given; the base to merge
/// the entry's own values into.
fn check_base(m: &RawModel, path: &FieldPath, ctx: &mut Ctx<'_>) -> Option<ModelConfig> {
    if !ctx.fine(&path.key("preset")) {
        // Reported where it was read; the entry's shape is unknown.
        return None;
    }
    let base = match &m.preset {
        Some(p) => match preset(p) {
            Some(cfg) => Some(cfg),
            None => {
                let help = match crate::diagnostic::did_you_mean(p, PRESETS) {
                    Some(s) => format!("did you mean `{s}`? presets: {}", PRESETS.join(", ")),
                    None => format!("presets: {}", PRESETS.join(", ")),
                };
                ctx.error(
                    &path.key("preset"),
                    format!("unknown preset `{p}`"),
                    Some(help),
                );
                return None;
            }
        },
        None => None,
    };
    // Without a preset, the shape of the model must be given (a value given but not
    // readable is given: reported where it was read).
    if base.is_none() {
        let given = |k: &str, v: bool| v || !ctx.fine(&path.key(k));
        let missing: Vec<&str> = [
            ("layers", given("layers", m.layers.is_some())),
            ("hidden", given("hidden", m.hidden.is_some())),
            ("heads", given("heads", m.heads.is_some())),
            ("vocab", given("vocab", m.vocab.is_some())),
            ("seq_len", given("seq_len", m.seq_len.is_some())),
        ]
        .iter()
        .filter(|(_, given)| !*given)
        .map(|(k, _)| *k)
        .collect();
        if !missing.is_empty() {
            ctx.error(
                path,
                format!("a model without a preset needs {}", missing.join(", ")),
                Some(format!(
                    "give them, or start from a preset: {}",
                    PRESETS.join(", ")
                )),
            );
            return None;
        }
    }
    Some(base.unwrap_or_else(ModelConfig::custom_base))
}

/// The entry's values over its base (a preset's, or the custom defaults).
fn merged(m: &RawModel, b: ModelConfig) -> ModelConfig {
    let hidden = m.hidden.unwrap_or(b.hidden);
    let heads = m.heads.unwrap_or(b.heads);
    let seq_len = m.seq_len.unwrap_or(b.seq_len);
    let positions = m.positions.unwrap_or(b.positions);
    let head = match m.head {
        Some(RawHead::LanguageModel) => Head::LanguageModel,
        Some(RawHead::Classifier) => Head::Classifier {
            classes: m.classes.unwrap_or(2),
        },
        None => match b.head {
            Head::Classifier { classes } => Head::Classifier {
                classes: m.classes.unwrap_or(classes),
            },
            Head::LanguageModel => Head::LanguageModel,
        },
    };
    let custom_shape = m.preset.is_none();
    ModelConfig {
        name: m
            .name
            .clone()
            .or_else(|| m.preset.clone())
            .unwrap_or_else(|| "custom".into()),
        layers: m.layers.unwrap_or(b.layers),
        hidden,
        heads,
        kv_heads: m.kv_heads.unwrap_or(
            if m.heads.is_some() || m.attention == Some(AttentionKernel::Mla) {
                heads
            } else {
                b.kv_heads
            },
        ),
        head_dim: m.head_dim.or(b.head_dim),
        qk_norm: m.qk_norm.unwrap_or(b.qk_norm),
        ffn: m.ffn.unwrap_or(if m.hidden.is_some() {
            hidden.saturating_mul(4)
        } else {
            b.ffn
        }),
        vocab: m.vocab.unwrap_or(b.vocab),
        vocab_pad_multiple: m.vocab_pad_multiple.unwrap_or(if custom_shape {
            1
        } else {
            b.vocab_pad_multiple
        }),
        seq_len,
        max_positions: m.max_positions.unwrap_or(if custom_shape {
            seq_len
        } else {
            b.max_positions
        }),
        gated_mlp: m.gated_mlp.unwrap_or(b.gated_mlp),
        activation: m.activation.unwrap_or(b.activation),
        norm: m.norm.unwrap_or(b.norm),
        norm_position: m.norm_position.unwrap_or(b.norm_position),
        positions,
        biases: m.biases.unwrap_or(b.biases),
        tied_embeddings: m.tied_embeddings.unwrap_or(b.tied_embeddings),
        token_types: m.token_types.unwrap_or(b.token_types),
        embedding_dim: m.embedding_dim.or(b.embedding_dim),
        head,
        dropout: m.dropout.unwrap_or(b.dropout),
        attention: m.attention.unwrap_or(b.attention),
        causal: m.causal.unwrap_or(b.causal),
        max_tensor_parallel: m.max_tensor_parallel.unwrap_or(b.max_tensor_parallel),
        moe: merged_moe(m, &b),
        dense_layers: m.dense_layers.unwrap_or(b.dense_layers),
        mtp_depth: m.mtp_depth.unwrap_or(b.mtp_depth),
        mla: merged_latent(m, &b),
    }
}

/// Multi-head latent attention's shapes: the entry's over the preset's; `None` when some
/// are unknown (reported by [`check_latent`] if the model uses them).
fn merged_latent(m: &RawModel, b: &ModelConfig) -> Option<Mla> {
    let base = b.mla;
    let pick = |given: Option<u64>, of: fn(&Mla) -> u64| given.or(base.as_ref().map(of));
    Some(Mla {
        q_lora_rank: match m.q_lora_rank {
            Some(0) => None,
            Some(r) => Some(r),
            None => base.and_then(|x| x.q_lora_rank),
        },
        kv_lora_rank: pick(m.kv_lora_rank, |x| x.kv_lora_rank)?,
        qk_nope_head_dim: pick(m.qk_nope_head_dim, |x| x.qk_nope_head_dim)?,
        qk_rope_head_dim: pick(m.qk_rope_head_dim, |x| x.qk_rope_head_dim)?,
        v_head_dim: pick(m.v_head_dim, |x| x.v_head_dim)?,
    })
}

/// Multi-head latent attention: its shapes given (all of them) only with `attention =
/// "mla"`, each in range, the rotary part even (it rotates pairs), one key/value head per
/// query head, and latents no wider than the projections they compress.
fn check_latent(cfg: &ModelConfig, m: &RawModel, path: &FieldPath, ctx: &mut Ctx<'_>) {
    let keys = [
        ("q_lora_rank", m.q_lora_rank),
        ("kv_lora_rank", m.kv_lora_rank),
        ("qk_nope_head_dim", m.qk_nope_head_dim),
        ("qk_rope_head_dim", m.qk_rope_head_dim),
        ("v_head_dim", m.v_head_dim),
    ];
    if cfg.attention != AttentionKernel::Mla {
        for (key, _) in keys.iter().filter(|(_, v)| v.is_some()) {
            ctx.mismatch(
                &path.key(key),
                format!("`{key}` shapes multi-head latent attention; this model's attention is not `mla`"),
                Some("set `attention = \"mla\"`, or remove the key".into()),
            );
        }
        return;
    }
    let Some(mla) = cfg.mla else {
        let missing: Vec<&str> = keys[1..]
            .iter()
            .filter(|(k, v)| v.is_none() && ctx.fine(&path.key(k)))
            .map(|(k, _)| *k)
            .collect();
        if !missing.is_empty() {
            ctx.mismatch(
                &path.key("attention"),
                format!("multi-head latent attention needs {}", missing.join(", ")),
                Some("give the latent shapes (DeepSeek-V3: kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, q_lora_rank 1536), or use attention = \"flash\"".into()),
            );
        }
        return;
    };
    let mut ok = true;
    for (key, v) in [
        ("q_lora_rank", mla.q_lora_rank.unwrap_or(1)),
        ("kv_lora_rank", mla.kv_lora_rank),
        ("qk_nope_head_dim", mla.qk_nope_head_dim),
        ("qk_rope_head_dim", mla.qk_rope_head_dim),
        ("v_head_dim", mla.v_head_dim),
    ] {
        ok &= count_in(ctx, &path.key(key), v, 1 << 14, &format!("{key} = {v}"), "");
    }
    if !ok {
        return;
    }
    if !mla.qk_rope_head_dim.is_multiple_of(2) {
        ctx.mismatch(
            &path.key("qk_rope_head_dim"),
            format!(
                "a rotary part of {} elements: rotary embeddings turn pairs",
                mla.qk_rope_head_dim
            ),
            Some("use an even qk_rope_head_dim (DeepSeek-V3: 64)".into()),
        );
    }
    if fine(ctx, path, &["heads", "kv_heads", "preset"]) && cfg.kv_heads != cfg.heads {
        ctx.mismatch(
            &path.key(if m.kv_heads.is_some() { "kv_heads" } else { "attention" }),
            format!(
                "multi-head latent attention has one key/value head per query head ({}); kv_heads is {}",
                cfg.heads, cfg.kv_heads
            ),
            Some("leave kv_heads out (it is heads)".into()),
        );
    }
    let heads = cfg.heads;
    let widths = [
        (
            "kv_lora_rank",
            mla.kv_lora_rank,
            heads.saturating_mul(mla.qk_nope_head_dim + mla.v_head_dim),
            "the keys' and values' no-rotary parts of all heads",
        ),
        (
            "q_lora_rank",
            mla.q_lora_rank.unwrap_or(0),
            heads.saturating_mul(mla.qk_nope_head_dim + mla.qk_rope_head_dim),
            "the queries of all heads",
        ),
    ];
    for (key, rank, full, what) in widths {
        if fine(ctx, path, &["heads", key, "preset"]) && rank > full {
            ctx.mismatch(
                &path.key(key),
                format!("a latent of {rank} is wider than {what} ({full}) it compresses"),
                Some(format!("use a {key} below {full}")),
            );
        }
    }
}

/// The Mixture-of-Experts layer: the entry's keys over the preset's (`experts = 0` makes a
/// preset dense); `None` for a dense model. Keys given without experts are reported by
/// [`check_experts`].
fn merged_moe(m: &RawModel, b: &ModelConfig) -> Option<Moe> {
    let base = match (m.experts, b.moe) {
        (Some(0), _) | (None, None) => return None,
        (_, Some(moe)) => moe,
        (Some(_), None) => Moe {
            experts: 0,
            experts_per_token: 2,
            expert_ffn: m.ffn.unwrap_or(b.ffn),
            shared_experts: 0,
            routing_imbalance: 1.0,
            capacity_factor: None,
        },
    };
    Some(Moe {
        experts: m.experts.unwrap_or(base.experts),
        experts_per_token: m.experts_per_token.unwrap_or(base.experts_per_token),
        expert_ffn: m.expert_ffn.unwrap_or(base.expert_ffn),
        shared_experts: m.shared_experts.unwrap_or(base.shared_experts),
        routing_imbalance: m.routing_imbalance.unwrap_or(base.routing_imbalance),
        capacity_factor: m.capacity_factor.or(base.capacity_factor),
    })
}

/// The most multi-token-prediction modules a model may have: each is one more block in the
/// head's layer graph, and published runs use one (DeepSeek-V3).
const MAX_MTP_DEPTH: u64 = 8;

/// Multi-token prediction: a few modules at most, on a language model whose embedding is
/// as wide as its blocks (each module concatenates the two).
fn check_mtp(cfg: &ModelConfig, path: &FieldPath, ctx: &mut Ctx<'_>) {
    let d = cfg.mtp_depth;
    if d == 0 || !ctx.fine(&path.key("mtp_depth")) {
        return;
    }
    if d > MAX_MTP_DEPTH {
        ctx.error(
            &path.key("mtp_depth"),
            format!("mtp_depth = {d} is out of range"),
            Some(format!(
                "use 0 to {MAX_MTP_DEPTH} (each depth is one more block in the last pipeline stage; DeepSeek-V3 uses 1)"
            )),
        );
        return;
    }
    if matches!(cfg.head, Head::Classifier { .. }) && fine(ctx, path, &["head", "preset"]) {
        ctx.mismatch(
            &path.key("mtp_depth"),
            format!("mtp_depth = {d} predicts further tokens; this model's head is a classifier"),
            Some("use a language-model head, or leave `mtp_depth` out".into()),
        );
    }
    if let Some(e) = cfg.embedding_dim.filter(|&e| e != cfg.hidden)
        && fine(ctx, path, &["embedding_dim", "hidden", "preset"])
    {
        ctx.mismatch(
            &path.key("mtp_depth"),
            format!(
                "multi-token prediction joins the embedding ({e} wide) to the hidden state ({} wide)",
                cfg.hidden
            ),
            Some("leave `embedding_dim` out (the embedding as wide as the blocks), or leave `mtp_depth` out".into()),
        );
    }
}

/// The Mixture-of-Experts keys: given only with experts, each count in range, top-k at
/// most the experts, the imbalance and the capacity factor between what they can mean.
fn check_experts(cfg: &ModelConfig, m: &RawModel, path: &FieldPath, ctx: &mut Ctx<'_>) {
    let Some(moe) = cfg.moe else {
        let given = [
            ("experts_per_token", m.experts_per_token.is_some()),
            ("expert_ffn", m.expert_ffn.is_some()),
            ("shared_experts", m.shared_experts.is_some()),
            ("dense_layers", m.dense_layers.is_some()),
            ("routing_imbalance", m.routing_imbalance.is_some()),
            ("capacity_factor", m.capacity_factor.is_some()),
        ];
        for (key, _) in given.iter().filter(|(_, g)| *g) {
            ctx.mismatch(
                &path.key(key),
                format!("`{key}` describes a Mixture-of-Experts layer; this model is dense"),
                Some("give `experts` (the experts per block), or remove the key".into()),
            );
        }
        return;
    };
    let count = |ctx: &mut Ctx<'_>, key: &str, v: u64, max: u64| {
        count_in(ctx, &path.key(key), v, max, &format!("{key} = {v}"), "")
    };
    let experts_ok = count(ctx, "experts", moe.experts, 1 << 14);
    let k_ok = count(ctx, "experts_per_token", moe.experts_per_token, 1 << 10);
    count(ctx, "expert_ffn", moe.expert_ffn, 1 << 22);
    if moe.shared_experts > 64 {
        ctx.error(
            &path.key("shared_experts"),
            format!("shared_experts = {} is out of range", moe.shared_experts),
            Some("use 0 to 64".into()),
        );
    }
    if fine(ctx, path, &["layers", "dense_layers", "preset"]) && cfg.dense_layers >= cfg.layers {
        ctx.mismatch(
            &path.key("dense_layers"),
            format!(
                "{} dense leading blocks of {} leave no Mixture-of-Experts block",
                cfg.dense_layers, cfg.layers
            ),
            Some(format!(
                "use fewer than {} (or leave `experts` out for a dense model)",
                cfg.layers
            )),
        );
    }
    let fine_k = experts_ok && k_ok && fine(ctx, path, &["experts", "experts_per_token", "preset"]);
    if fine_k && moe.experts_per_token > moe.experts {
        ctx.mismatch(
            &path.key("experts_per_token"),
            format!(
                "each token cannot go to {} of {} experts",
                moe.experts_per_token, moe.experts
            ),
            Some(format!("use 1 to {}", moe.experts)),
        );
        return;
    }
    // An expert receives each token at most once: at most all of them, `E/k` times the mean.
    let most = moe.experts as f64 / moe.experts_per_token.max(1) as f64;
    for (key, value) in [
        ("routing_imbalance", Some(moe.routing_imbalance)),
        ("capacity_factor", moe.capacity_factor),
    ] {
        let Some(v) = value else { continue };
        let low = if key == "routing_imbalance" { 1.0 } else { 0.0 };
        let bad = !v.is_finite() || v < low || (key == "capacity_factor" && v == 0.0);
        if bad || (fine_k && v > most) {
            ctx.error(
                &path.key(key),
                format!("{key} = {v} is out of range"),
                Some(if key == "routing_imbalance" {
                    format!("the busiest expert's tokens over the mean: from 1 (balanced) to experts / experts_per_token = {most}")
                } else {
                    format!("a multiple of the mean tokens per expert above 0, at most experts / experts_per_token = {most}")
                }),
            );
        }
    }
}

/// Every count within what the engine represents exactly.
fn check_counts(cfg: &ModelConfig, path: &FieldPath, ctx: &mut Ctx<'_>) {
    let positive = |ctx: &mut Ctx<'_>, key: &str, v: u64, max: u64| {
        count_in(ctx, &path.key(key), v, max, &format!("{key} = {v}"), "");
    };
    positive(ctx, "layers", cfg.layers, 100_000);
    positive(ctx, "hidden", cfg.hidden, 1 << 20);
    positive(ctx, "heads", cfg.heads, 1 << 16);
    positive(ctx, "kv_heads", cfg.kv_heads, 1 << 16);
    positive(ctx, "ffn", cfg.ffn, 1 << 22);
    positive(ctx, "vocab", cfg.vocab, 1 << 27);
    positive(ctx, "vocab_pad_multiple", cfg.vocab_pad_multiple, 1 << 16);
    positive(ctx, "seq_len", cfg.seq_len, 1 << 20);
    positive(ctx, "max_positions", cfg.max_positions, 1 << 22);
    positive(ctx, "max_tensor_parallel", cfg.max_tensor_parallel, 1 << 12);
    if let Some(e) = cfg.embedding_dim {
        positive(ctx, "embedding_dim", e, 1 << 20);
    }
    if let Some(d) = cfg.head_dim {
        positive(ctx, "head_dim", d, 1 << 12);
    }
    if let Head::Classifier { classes } = cfg.head
        && (!(2..=1 << 20).contains(&classes))
    {
        ctx.error(
            &path.key("classes"),
            format!("a classifier over {classes} classes"),
            Some("use 2 or more classes".into()),
        );
    }
}

/// Shapes that fit together: heads divide the hidden size, a flash kernel's head dimension
/// is one it takes, key/value heads the heads,
/// learned positions cover the sequence, the widest tensor-parallel width divides the model;
/// each rule over fields that are fine (a value derived from one that is not — `ffn` from
/// `hidden` — is not fine either).
fn check_shapes(cfg: &ModelConfig, m: &RawModel, path: &FieldPath, ctx: &mut Ctx<'_>) {
    let mut ok = true;
    if cfg.head_dim.is_none()
        && fine(ctx, path, &["hidden", "heads", "preset"])
        && !cfg.hidden.is_multiple_of(cfg.heads)
    {
        ctx.mismatch(
            &path.key(if m.heads.is_some() { "heads" } else { "hidden" }),
            format!(
                "hidden size {} is not divisible by {} heads",
                cfg.hidden, cfg.heads
            ),
            Some(format!(
                "heads must divide the hidden size: {}",
                divisors_text(cfg.hidden)
            )),
        );
        ok = false;
    }
    if ok
        && fine(
            ctx,
            path,
            &[
                "hidden",
                "heads",
                "head_dim",
                "attention",
                "qk_nope_head_dim",
                "qk_rope_head_dim",
                "preset",
            ],
        )
        && matches!(cfg.attention, AttentionKernel::Flash | AttentionKernel::Mla)
        && cfg.head_dim() > MAX_FLASH_HEAD_DIM
    {
        let key = if m.attention.is_some() {
            "attention"
        } else if m.head_dim.is_some() {
            "head_dim"
        } else if m.heads.is_some() {
            "heads"
        } else {
            "hidden"
        };
        let latent = cfg.attention == AttentionKernel::Mla;
        let key = if latent && m.qk_nope_head_dim.is_some() {
            "qk_nope_head_dim"
        } else {
            key
        };
        ctx.mismatch(
            &path.key(key),
            match cfg.head_dim {
                _ if latent => format!(
                    "a fused attention kernel takes head dimensions up to {MAX_FLASH_HEAD_DIM}; this model's queries and keys are {} (qk_nope_head_dim + qk_rope_head_dim)",
                    cfg.head_dim()
                ),
                Some(d) => format!(
                    "a FlashAttention kernel takes head dimensions up to {MAX_FLASH_HEAD_DIM}; this model's is {d}"
                ),
                None => format!(
                    "a FlashAttention kernel takes head dimensions up to {MAX_FLASH_HEAD_DIM}; this model's is {} (hidden size {} over {} heads)",
                    cfg.head_dim(),
                    cfg.hidden,
                    cfg.heads
                ),
            },
            Some(if key == "head_dim" {
                format!("use a head_dim of at most {MAX_FLASH_HEAD_DIM}, or `attention = \"unfused\"`")
            } else if latent {
                format!("keep qk_nope_head_dim + qk_rope_head_dim at most {MAX_FLASH_HEAD_DIM}")
            } else {
                "use `attention = \"unfused\"`, or more heads".into()
            }),
        );
        ok = false;
    }
    if fine(ctx, path, &["heads", "kv_heads", "preset"]) && !cfg.heads.is_multiple_of(cfg.kv_heads)
    {
        ctx.mismatch(
            &path.key("kv_heads"),
            format!(
                "{} heads cannot be grouped over {} key/value heads",
                cfg.heads, cfg.kv_heads
            ),
            Some(format!(
                "key/value heads must divide the heads: {}",
                divisors_text(cfg.heads)
            )),
        );
        ok = false;
    }
    if fine(
        ctx,
        path,
        &["positions", "seq_len", "max_positions", "preset"],
    ) && cfg.positions == Positions::Learned
        && cfg.seq_len > cfg.max_positions
    {
        ctx.mismatch(
            &path.key(if m.seq_len.is_some() {
                "seq_len"
            } else {
                "max_positions"
            }),
            format!(
                "sequence length {} exceeds the {} learned positions",
                cfg.seq_len, cfg.max_positions
            ),
            Some("raise max_positions, shorten seq_len, or use rotary positions".into()),
        );
        ok = false;
    }
    let t = cfg.max_tensor_parallel;
    if ok && fine(ctx, path, &WIDTH_FIELDS) && !cfg.supports_tensor_parallel(t) {
        let valid: Vec<String> = (0..13)
            .map(|l| 1u64 << l)
            .filter(|&w| cfg.supports_tensor_parallel(w))
            .map(|w| w.to_string())
            .collect();
        ctx.mismatch(
            &path.key("max_tensor_parallel"),
            format!(
                "tensor-parallel width {t} does not divide the model (heads {}, key/value heads {}, hidden {}, ffn {}) or is not a power of two",
                cfg.heads, cfg.kv_heads, cfg.hidden, cfg.ffn
            ),
            Some(format!("valid widths for this model: {}", valid.join(", "))),
        );
    }
}

/// Tensors at the largest micro-batch size stay exact in f64 (under 2^53 elements).
fn check_size(cfg: &ModelConfig, tr: &Training, path: &FieldPath, ctx: &mut Ctx<'_>) {
    let batches = FieldPath::root().key("training").key("micro_batch_sizes");
    let related = ["seq_len", "heads", "hidden", "ffn", "vocab", "preset"];
    if !fine(ctx, path, &related) || !ctx.fine(&batches) {
        return;
    }
    let largest = tr.micro_batch_sizes.iter().copied().max().unwrap_or(1) as u128;
    let (s, n, h) = (cfg.seq_len as u128, cfg.heads as u128, cfg.hidden as u128);
    let widest = cfg.ffn.max(cfg.vocab).max(cfg.hidden) as u128;
    // The head's logits cover the model's tokens and each multi-token-prediction module's.
    let predicted = s * (1 + cfg.mtp_depth.min(MAX_MTP_DEPTH) as u128);
    if largest * n * s * s > MAX_ELEMENTS
        || largest * predicted * widest > MAX_ELEMENTS
        || largest * s * h > MAX_ELEMENTS
    {
        ctx.mismatch(
            path,
            "this model is too large to represent at the largest micro-batch size (tensors over 2^53 elements)",
            Some("use a shorter sequence or smaller micro-batches".into()),
        );
    }
}

/// The placement program for this model over the cluster stays within the engine's step
/// limit (its memory is linear in the layers, its time is not): refused here with the
/// numbers, not after minutes of search.
fn check_placement(
    cfg: &ModelConfig,
    cluster: &Cluster,
    m: &RawModel,
    path: &FieldPath,
    ctx: &mut Ctx<'_>,
) {
    let devices = FieldPath::root().key("cluster").key("devices");
    if !ctx.all_fine(&[path.key("layers"), path.key("preset"), devices]) {
        return;
    }
    let layers = cfg.pipeline_layers() as usize;
    let size = ProgramSize::of(layers, cluster.devices, false);
    if size.fits() {
        return;
    }
    let most = max_layers(cluster.devices, false).saturating_sub(2);
    ctx.mismatch(
        &path.key(if m.layers.is_some() || m.preset.is_none() {
            "layers"
        } else {
            "preset"
        }),
        format!(
            "placing {} layers (and the embedding and head) over {} devices takes {:.1e} steps of the placement program, above its limit of {:.1e}",
            cfg.layers,
            cluster.devices,
            size.steps as f64,
            MAX_PROGRAM_STEPS as f64
        ),
        Some(format!(
            "use at most {most} layers on {} devices, or fewer devices",
            cluster.devices
        )),
    );
}

/// The fixed baseline strategy: stages, degrees and a width the model is searched with,
/// within the cluster.
fn check_baseline(
    bl: &RawBaseline,
    cfg: &ModelConfig,
    cluster: &Cluster,
    bp: &FieldPath,
    ctx: &mut Ctx<'_>,
) -> Option<Baseline> {
    let mut good = true;
    if bl.pipeline == 0 || bl.pipeline > cfg.layers + 2 {
        ctx.error(
            &bp.key("pipeline"),
            format!("{} pipeline stages for {} layers", bl.pipeline, cfg.layers),
            Some(format!("use 1 to {} stages", cfg.layers + 2)),
        );
        good = false;
    }
    if bl.data == 0 {
        ctx.error(
            &bp.key("data"),
            "a data-parallel degree of 0",
            Some("use 1 or more".into()),
        );
        good = false;
    }
    if bl.tensor == 0
        || bl.tensor > cfg.max_tensor_parallel
        || !cfg.supports_tensor_parallel(bl.tensor)
    {
        ctx.error(
            &bp.key("tensor"),
            format!(
                "tensor-parallel width {} is not one this model is searched with",
                bl.tensor
            ),
            Some(format!("use one of {:?}", cfg.tensor_parallel_widths())),
        );
        good = false;
    }
    let total = bl
        .pipeline
        .saturating_mul(bl.data)
        .saturating_mul(bl.tensor);
    let devices = FieldPath::root().key("cluster").key("devices");
    if good && ctx.fine(&devices) && total > cluster.devices {
        ctx.mismatch(
            bp,
            format!(
                "the baseline needs {total} devices, the cluster has {}",
                cluster.devices
            ),
            Some("pipeline × data × tensor must not exceed cluster.devices".into()),
        );
        good = false;
    }
    good.then_some(Baseline {
        pipeline: bl.pipeline,
        data: bl.data,
        tensor: bl.tensor,
    })
}

fn divisors_text(n: u64) -> String {
    let d: Vec<String> = (1..=n.min(1 << 16))
        .filter(|d| n.is_multiple_of(*d))
        .take(16)
        .map(|d| d.to_string())
        .collect();
    format!(
        "{}{}",
        d.join(", "),
        if d.len() == 16 { ", ..." } else { "" }
    )
}
