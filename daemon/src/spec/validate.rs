//! The rules of a spec beyond its types: units, ranges, and relations between fields.

use super::raw::{
    RawAreaBudget, RawAxis, RawCostModel, RawHead, RawModel, RawPluginRef, RawSearch, RawSpec,
};
use super::{CostModelSpec, Ctx, FieldPath, ModelSpec, Spec};
use crate::cost::PluginRef;
use crate::engine::model::{Head, ModelConfig, PRESETS, Positions, preset};
use crate::engine::space::{AreaBudget, SpaceSpec};
use crate::engine::training::{Baseline, Cluster, Optimizer, Training};
use archplace_plugin_sdk::AcceleratorConfig;
use archplace_plugin_sdk::units::{parse_area_um2, parse_bandwidth, parse_bytes};

/// Largest value of an element count we accept: products of shapes stay exact in f64.
const MAX_ELEMENTS: u128 = 1 << 53;
/// Largest number of configurations an axis product may have.
const MAX_SPACE: u128 = 4_000_000;

/// Checks every section that deserialized; `failed` names those that did not (their
/// problems are already reported), whose rules and cross-checks are skipped.
pub(super) fn validate(
    raw: &RawSpec,
    failed: &[&str],
    ctx: &mut Ctx<'_>,
    source: &str,
) -> Option<Spec> {
    let root = FieldPath::root();
    let ok = |k: &str| !failed.contains(&k);
    if ok("schema_version") && raw.schema_version != 1 {
        ctx.error(
            &root.key("schema_version"),
            format!("unsupported schema_version {}", raw.schema_version),
            Some("this archplace reads schema_version = 1".into()),
        );
    }
    if ok("name")
        && (raw.name.is_empty()
            || raw.name.len() > 100
            || raw.name.starts_with('.')
            || !raw
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        ctx.error(
            &root.key("name"),
            format!("`{}` cannot name a search", raw.name),
            Some("use 1 to 100 letters, digits, `-`, `_` or `.`, not starting with `.` (it names the results folder)".into()),
        );
    }
    let training = if ok("training") {
        training(raw, ctx)
    } else {
        None
    };
    let cluster = if ok("cluster") {
        cluster(raw, ctx)
    } else {
        None
    };
    let models = if ok("models") {
        models(raw, ctx, training.as_ref(), cluster.as_ref())
    } else {
        None
    };
    let space = if ok("search") {
        space(&raw.search, ctx)
    } else {
        None
    };
    let cost_model = if ok("cost_model") {
        cost_model(&raw.cost_model, ctx)
    } else {
        None
    };
    if !failed.is_empty() {
        return None;
    }
    Some(Spec {
        name: raw.name.clone(),
        description: raw.description.clone(),
        content_hash: blake3::hash(source.as_bytes()).to_hex().to_string(),
        source_file: ctx.file().to_string(),
        source_text: source.to_string(),
        models: models?,
        training: training?,
        cluster: cluster?,
        space: space?,
        cost_model: cost_model?,
    })
}

fn duplicates<T: PartialEq + std::fmt::Debug>(ctx: &mut Ctx<'_>, path: &FieldPath, values: &[T]) {
    for (i, v) in values.iter().enumerate() {
        if values[..i].contains(v) {
            ctx.error(
                &path.index(i),
                format!("{v:?} is listed twice"),
                Some("list each value once".into()),
            );
        }
    }
}

fn training(raw: &RawSpec, ctx: &mut Ctx<'_>) -> Option<Training> {
    let t = &raw.training;
    let path = FieldPath::root().key("training");
    let mut ok = true;
    let global_batch = t.global_batch.unwrap_or(4096);
    if global_batch == 0 || global_batch > 1 << 24 {
        ctx.error(
            &path.key("global_batch"),
            format!("global batch {global_batch} is out of range"),
            Some("use 1 to 16,777,216 samples".into()),
        );
        ok = false;
    }
    let micro_batch_sizes = t.micro_batch_sizes.clone().unwrap_or_else(|| vec![1]);
    let mbs_path = path.key("micro_batch_sizes");
    if micro_batch_sizes.is_empty() {
        ctx.error(
            &mbs_path,
            "no micro-batch size to try",
            Some("list at least one, e.g. [1, 2, 4]".into()),
        );
        ok = false;
    }
    for (i, &b) in micro_batch_sizes.iter().enumerate() {
        if b == 0 || (global_batch > 0 && !global_batch.is_multiple_of(b)) {
            let divisors: Vec<String> = (1..=global_batch.min(1 << 16))
                .filter(|d| global_batch.is_multiple_of(*d))
                .take(12)
                .map(|d| d.to_string())
                .collect();
            ctx.error(
                &mbs_path.index(i),
                format!("micro-batch size {b} does not divide the global batch {global_batch}"),
                Some(format!(
                    "divisors of {global_batch}: {}, ...",
                    divisors.join(", ")
                )),
            );
            ok = false;
        }
    }
    duplicates(ctx, &mbs_path, &micro_batch_sizes);
    let activation_recomputation = t
        .activation_recomputation
        .clone()
        .unwrap_or_else(|| vec![false, true]);
    let rec_path = path.key("activation_recomputation");
    if activation_recomputation.is_empty() {
        ctx.error(
            &rec_path,
            "no recomputation choice to try",
            Some("use [false], [true] or [false, true]".into()),
        );
        ok = false;
    }
    duplicates(ctx, &rec_path, &activation_recomputation);
    let bytes_per_element = t.bytes_per_element.unwrap_or(2);
    if ![1, 2, 4].contains(&bytes_per_element) {
        ctx.error(
            &path.key("bytes_per_element"),
            format!("{bytes_per_element} bytes per element is not supported"),
            Some("use 1, 2 (fp16/bf16) or 4 (fp32)".into()),
        );
        ok = false;
    }
    ok.then(|| Training {
        global_batch,
        micro_batch_sizes,
        activation_recomputation,
        optimizer: t.optimizer.unwrap_or(Optimizer::Sgd),
        bytes_per_element,
    })
}

fn cluster(raw: &RawSpec, ctx: &mut Ctx<'_>) -> Option<Cluster> {
    let c = &raw.cluster;
    let path = FieldPath::root().key("cluster");
    let mut ok = true;
    let devices = c.devices.unwrap_or(1024);
    if devices == 0 || devices > 1_000_000 {
        ctx.error(
            &path.key("devices"),
            format!("{devices} devices is out of range"),
            Some("use 1 to 1,000,000 devices".into()),
        );
        ok = false;
    }
    let link = c.link_bandwidth.as_deref().unwrap_or("4 GiB/s");
    let link_bytes_per_second = match parse_bandwidth(link) {
        Ok(b) if b >= 1.0 => b,
        Ok(_) => {
            ctx.error(
                &path.key("link_bandwidth"),
                "the link bandwidth must be at least 1 B/s",
                None,
            );
            ok = false;
            0.0
        }
        Err(e) => {
            ctx.error(&path.key("link_bandwidth"), e.message, None);
            ok = false;
            0.0
        }
    };
    let hbm_text: Vec<String> = c
        .hbm
        .clone()
        .unwrap_or_else(|| vec!["32 GiB".into(), "64 GiB".into(), "80 GiB".into()]);
    let hbm_path = path.key("hbm");
    if hbm_text.is_empty() {
        ctx.error(
            &hbm_path,
            "no HBM size to try",
            Some("list at least one, e.g. [\"80 GiB\"]".into()),
        );
        ok = false;
    }
    let mut hbm_bytes = Vec::new();
    for (i, h) in hbm_text.iter().enumerate() {
        match parse_bytes(h) {
            Ok(0) => {
                ctx.error(
                    &hbm_path.index(i),
                    "an HBM of 0 bytes cannot hold a model",
                    None,
                );
                ok = false;
            }
            Ok(b) => hbm_bytes.push(b),
            Err(e) => {
                ctx.error(&hbm_path.index(i), e.message, None);
                ok = false;
            }
        }
    }
    duplicates(ctx, &hbm_path, &hbm_bytes);
    ok.then_some(Cluster {
        devices,
        link_bytes_per_second,
        hbm_bytes,
    })
}

fn models(
    raw: &RawSpec,
    ctx: &mut Ctx<'_>,
    training: Option<&Training>,
    cluster: Option<&Cluster>,
) -> Option<Vec<ModelSpec>> {
    let path = FieldPath::root().key("models");
    if raw.models.is_empty() {
        ctx.error(
            &path,
            "no model to train",
            Some("add a `[[models]]` table, e.g. `preset = \"gpt3-175b\"`".into()),
        );
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    for (i, m) in raw.models.iter().enumerate() {
        match model(m, &path.index(i), ctx, training, cluster) {
            Some(spec) => out.push(spec),
            None => ok = false,
        }
    }
    let names: Vec<&str> = out.iter().map(|m| m.config.name.as_str()).collect();
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            ctx.error(
                &path.index(i).key("name"),
                format!("two models are called `{n}`"),
                Some("give each model its own `name`".into()),
            );
            ok = false;
        }
    }
    ok.then_some(out)
}

fn model(
    m: &RawModel,
    path: &FieldPath,
    ctx: &mut Ctx<'_>,
    training: Option<&Training>,
    cluster: Option<&Cluster>,
) -> Option<ModelSpec> {
    let base = match &m.preset {
        Some(p) => match preset(p) {
            Some(cfg) => Some(cfg),
            None => {
                let help = match super::diagnostic::did_you_mean(p, PRESETS) {
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
    // Without a preset, the shape of the model must be given.
    if base.is_none() {
        let missing: Vec<&str> = [
            ("layers", m.layers.is_none()),
            ("hidden", m.hidden.is_none()),
            ("heads", m.heads.is_none()),
            ("vocab", m.vocab.is_none()),
            ("seq_len", m.seq_len.is_none()),
        ]
        .iter()
        .filter(|(_, missing)| *missing)
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
    let b = base.unwrap_or_else(ModelConfig::custom_base);
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
    let cfg = ModelConfig {
        name: m
            .name
            .clone()
            .or_else(|| m.preset.clone())
            .unwrap_or_else(|| "custom".into()),
        layers: m.layers.unwrap_or(b.layers),
        hidden,
        heads,
        kv_heads: m
            .kv_heads
            .unwrap_or(if m.heads.is_some() { heads } else { b.kv_heads }),
        ffn: m.ffn.unwrap_or(if m.hidden.is_some() {
            4 * hidden
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
        max_tensor_parallel: m.max_tensor_parallel.unwrap_or(b.max_tensor_parallel),
    };
    let mut ok = true;
    let mut positive = |ctx: &mut Ctx<'_>, key: &str, v: u64, max: u64| {
        if v == 0 || v > max {
            ctx.error(
                &path.key(key),
                format!("{key} = {v} is out of range"),
                Some(format!("use 1 to {max}")),
            );
            ok = false;
        }
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
    if let Head::Classifier { classes } = cfg.head
        && (!(2..=1 << 20).contains(&classes))
    {
        ctx.error(
            &path.key("classes"),
            format!("a classifier over {classes} classes"),
            Some("use 2 or more classes".into()),
        );
        ok = false;
    }
    if !ok {
        return None;
    }
    if !cfg.hidden.is_multiple_of(cfg.heads) {
        ctx.error(
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
    if !cfg.heads.is_multiple_of(cfg.kv_heads) {
        ctx.error(
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
    if positions == Positions::Learned && cfg.seq_len > cfg.max_positions {
        ctx.error(
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
    if ok && !cfg.supports_tensor_parallel(t) {
        let valid: Vec<String> = (0..13)
            .map(|l| 1u64 << l)
            .filter(|&w| cfg.supports_tensor_parallel(w))
            .map(|w| w.to_string())
            .collect();
        ctx.error(
            &path.key("max_tensor_parallel"),
            format!(
                "tensor-parallel width {t} does not divide the model (heads {}, key/value heads {}, hidden {}, ffn {}) or is not a power of two",
                cfg.heads, cfg.kv_heads, cfg.hidden, cfg.ffn
            ),
            Some(format!("valid widths for this model: {}", valid.join(", "))),
        );
        ok = false;
    }
    if let Some(tr) = training {
        let largest = tr.micro_batch_sizes.iter().copied().max().unwrap_or(1) as u128;
        let (s, n, h) = (cfg.seq_len as u128, cfg.heads as u128, cfg.hidden as u128);
        let widest = cfg.ffn.max(cfg.vocab).max(cfg.hidden) as u128;
        if largest * n * s * s > MAX_ELEMENTS
            || largest * s * widest > MAX_ELEMENTS
            || largest * s * h > MAX_ELEMENTS
        {
            ctx.error(
                path,
                "this model is too large to represent at the largest micro-batch size (tensors over 2^53 elements)",
                Some("use a shorter sequence or smaller micro-batches".into()),
            );
            ok = false;
        }
    }
    let baseline = m.baseline.as_ref().and_then(|bl| {
        let bp = path.key("baseline");
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
        if let Some(c) = cluster {
            let total = bl
                .pipeline
                .saturating_mul(bl.data)
                .saturating_mul(bl.tensor);
            if good && total > c.devices {
                ctx.error(
                    &bp,
                    format!(
                        "the baseline needs {total} devices, the cluster has {}",
                        c.devices
                    ),
                    Some("pipeline × data × tensor must not exceed cluster.devices".into()),
                );
                good = false;
            }
        }
        good.then_some(Baseline {
            pipeline: bl.pipeline,
            data: bl.data,
            tensor: bl.tensor,
        })
    });
    if m.baseline.is_some() && baseline.is_none() {
        ok = false;
    }
    ok.then_some(ModelSpec {
        config: cfg,
        baseline,
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

fn axis_u32(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    axis: &Option<RawAxis<u32>>,
    default: Vec<u32>,
) -> Option<Vec<u32>> {
    let values = match axis {
        None => return Some(default),
        Some(RawAxis::List(v)) => v.clone(),
        Some(RawAxis::Range(r)) => {
            if r.min == 0 || r.min > r.max || !r.min.is_power_of_two() || !r.max.is_power_of_two() {
                ctx.error(
                    path,
                    format!(
                        "{{ min = {}, max = {} }} is not a range of powers of two",
                        r.min, r.max
                    ),
                    Some(
                        "min and max are powers of two with min ≤ max, e.g. { min = 1, max = 64 }"
                            .into(),
                    ),
                );
                return None;
            }
            (r.min.trailing_zeros()..=r.max.trailing_zeros())
                .map(|l| 1 << l)
                .collect()
        }
    };
    if values.is_empty() {
        ctx.error(
            path,
            "an empty axis leaves nothing to search",
            Some("list at least one value".into()),
        );
        return None;
    }
    let mut ok = true;
    for (i, &v) in values.iter().enumerate() {
        if v == 0 || v > 1 << 20 {
            ctx.error(
                &path.index(i),
                format!("{v} is out of range"),
                Some("use 1 to 1,048,576".into()),
            );
            ok = false;
        }
    }
    duplicates(ctx, path, &values);
    ok.then_some(values)
}

fn space(s: &RawSearch, ctx: &mut Ctx<'_>) -> Option<SpaceSpec> {
    let path = FieldPath::root().key("search");
    let d = SpaceSpec::default();
    let tensor_cores = axis_u32(
        ctx,
        &path.key("tensor_cores"),
        &s.tensor_cores,
        d.tensor_cores.clone(),
    );
    let vector_cores = axis_u32(
        ctx,
        &path.key("vector_cores"),
        &s.vector_cores,
        d.vector_cores.clone(),
    );
    let width = axis_u32(ctx, &path.key("width"), &s.width, d.width.clone());
    let depth = axis_u32(ctx, &path.key("depth"), &s.depth, d.depth.clone());
    let vector_width = match &s.vector_width {
        None => Some(None),
        Some(_) => axis_u32(ctx, &path.key("vector_width"), &s.vector_width, Vec::new()).map(Some),
    };
    let bp = path.key("buffer");
    let buffer_bytes = match &s.buffer {
        None => Some(d.buffer_bytes.clone()),
        Some(RawAxis::List(v)) if v.is_empty() => {
            ctx.error(
                &bp,
                "an empty axis leaves nothing to search",
                Some("list at least one size, e.g. [\"64 MiB\"]".into()),
            );
            None
        }
        Some(RawAxis::List(v)) => {
            let parsed: Vec<Option<u64>> = v
                .iter()
                .enumerate()
                .map(|(i, t)| match parse_bytes(t) {
                    Ok(b) if b > 0 => Some(b),
                    Ok(_) => {
                        ctx.error(&bp.index(i), "a buffer of 0 bytes", None);
                        None
                    }
                    Err(e) => {
                        ctx.error(&bp.index(i), e.message, None);
                        None
                    }
                })
                .collect();
            let parsed: Option<Vec<u64>> = parsed.into_iter().collect();
            if let Some(p) = &parsed {
                duplicates(ctx, &bp, p);
            }
            parsed
        }
        Some(RawAxis::Range(r)) => match (parse_bytes(&r.min), parse_bytes(&r.max)) {
            (Ok(lo), Ok(hi))
                if lo > 0 && lo <= hi && lo.is_power_of_two() && hi.is_power_of_two() =>
            {
                Some(
                    (lo.trailing_zeros()..=hi.trailing_zeros())
                        .map(|l| 1u64 << l)
                        .collect(),
                )
            }
            (Err(e), _) => {
                ctx.error(&bp.key("min"), e.message, None);
                None
            }
            (_, Err(e)) => {
                ctx.error(&bp.key("max"), e.message, None);
                None
            }
            _ => {
                ctx.error(
                    &bp,
                    "not a range of powers of two",
                    Some("e.g. { min = \"2 MiB\", max = \"128 MiB\" }".into()),
                );
                None
            }
        },
    };
    let ap = path.key("area_budget");
    let area_budget = match &s.area_budget {
        None => Some(d.area_budget.clone()),
        Some(RawAreaBudget::Area(text)) => match parse_area_um2(text) {
            Ok(a) if a > 0.0 => Some(AreaBudget::Um2(a)),
            Ok(_) => {
                ctx.error(&ap, "an area budget of 0", None);
                None
            }
            Err(e) => {
                ctx.error(&ap, e.message, None);
                None
            }
        },
        Some(RawAreaBudget::Config(c)) => {
            let r = &c.reference_config;
            let cp = ap.key("reference_config");
            match parse_bytes(&r.buffer) {
                Ok(buffer_bytes) => Some(AreaBudget::ReferenceConfig(AcceleratorConfig {
                    tensor_cores: r.tensor_cores,
                    vector_cores: r.vector_cores,
                    width: r.width,
                    depth: r.depth,
                    vector_width: r.vector_width.unwrap_or(r.width),
                    buffer_bytes,
                })),
                Err(e) => {
                    ctx.error(&cp.key("buffer"), e.message, None);
                    None
                }
            }
        }
    };
    let min_area_fraction = s.min_area_fraction.unwrap_or(d.min_area_fraction);
    if !(0.0..1.0).contains(&min_area_fraction) {
        ctx.error(
            &path.key("min_area_fraction"),
            format!("{min_area_fraction} is not a fraction"),
            Some("use a value from 0 (no minimum) up to, not including, 1".into()),
        );
    }
    let bucket_um2 = match &s.area_bucket {
        None => Some(d.bucket_um2),
        Some(t) => match parse_area_um2(t) {
            Ok(a) if a > 0.0 => Some(a),
            Ok(_) => {
                ctx.error(
                    &path.key("area_bucket"),
                    "an area bucket of 0",
                    Some("e.g. \"0.01 mm2\"".into()),
                );
                None
            }
            Err(e) => {
                ctx.error(&path.key("area_bucket"), e.message, None);
                None
            }
        },
    };
    let schedule_gap = s.schedule_gap.unwrap_or(d.schedule_gap);
    if !(0.0..0.5).contains(&schedule_gap) {
        ctx.error(
            &path.key("schedule_gap"),
            format!("{schedule_gap} is not a usable gap"),
            Some(
                "use a fraction from 0 (prove optimality) up to 0.5; the reference uses 0.01"
                    .into(),
            ),
        );
    }
    let schedule_time_limit_seconds = s
        .schedule_time_limit_seconds
        .unwrap_or(d.schedule_time_limit_seconds);
    if !(0.001..=3600.0).contains(&schedule_time_limit_seconds) {
        ctx.error(
            &path.key("schedule_time_limit_seconds"),
            format!("{schedule_time_limit_seconds} s is not a usable time limit"),
            Some("use 0.001 to 3600 seconds".into()),
        );
    }
    let convergence_window = s.convergence_window.unwrap_or(d.convergence_window);
    if convergence_window == 0 {
        ctx.error(
            &path.key("convergence_window"),
            "a convergence window of 0 buckets",
            Some("use 1 or more (the reference uses 5)".into()),
        );
    }
    let (
        tensor_cores,
        vector_cores,
        width,
        depth,
        vector_width,
        buffer_bytes,
        area_budget,
        bucket_um2,
    ) = (
        tensor_cores?,
        vector_cores?,
        width?,
        depth?,
        vector_width?,
        buffer_bytes?,
        area_budget?,
        bucket_um2?,
    );
    let size = [
        tensor_cores.len(),
        vector_cores.len(),
        width.len(),
        depth.len(),
        vector_width.as_ref().map_or(1, Vec::len),
        buffer_bytes.len(),
    ]
    .iter()
    .map(|&n| n as u128)
    .product::<u128>();
    if size > MAX_SPACE {
        ctx.error(
            &path,
            format!("the axes make {size} configurations"),
            Some(format!("narrow them to at most {MAX_SPACE}")),
        );
        return None;
    }
    if !(0.0..1.0).contains(&min_area_fraction)
        || convergence_window == 0
        || !(0.0..0.5).contains(&schedule_gap)
        || !(0.001..=3600.0).contains(&schedule_time_limit_seconds)
    {
        return None;
    }
    Some(SpaceSpec {
        tensor_cores,
        vector_cores,
        width,
        depth,
        vector_width,
        buffer_bytes,
        area_budget,
        min_area_fraction,
        single_core_exempt: s.single_core_exempt.unwrap_or(d.single_core_exempt),
        bucket_um2,
        convergence_window,
        exhaustive: s.exhaustive.unwrap_or(false),
        schedule_gap,
        schedule_time_limit_seconds,
    })
}

fn plugin_ref(r: Option<&RawPluginRef>, path: &FieldPath, ctx: &mut Ctx<'_>) -> Option<PluginRef> {
    let (name, version, hash) = match r {
        None => return Some(PluginRef::named("reference")),
        Some(RawPluginRef::Name(n)) => (n.clone(), None, None),
        Some(RawPluginRef::Pinned(p)) => (p.plugin.clone(), p.version.clone(), p.blake3.clone()),
    };
    let mut ok = true;
    let pinned = matches!(r, Some(RawPluginRef::Pinned(_)));
    let name_path = if pinned {
        path.key("plugin")
    } else {
        path.clone()
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        ctx.error(
            &name_path,
            format!("`{name}` is not a plugin name"),
            Some("plugin names use letters, digits, `-` and `_`".into()),
        );
        ok = false;
    }
    if let Some(v) = &version
        && let Err(e) = semver::VersionReq::parse(v)
    {
        ctx.error(
            &path.key("version"),
            format!("`{v}` is not a version requirement: {e}"),
            Some("e.g. \"1.2\" (meaning ^1.2), \"=1.2.3\" or \">=1.0, <2\"".into()),
        );
        ok = false;
    }
    if let Some(h) = &hash
        && !(h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
    {
        ctx.error(
            &path.key("blake3"),
            "a blake3 hash is 64 hexadecimal digits",
            Some("`archplace plugin check FILE.wasm` prints a component's hash".into()),
        );
        ok = false;
    }
    ok.then_some(PluginRef {
        name,
        version,
        blake3: hash.map(|h| h.to_ascii_lowercase()),
    })
}

fn cost_model(c: &RawCostModel, ctx: &mut Ctx<'_>) -> Option<CostModelSpec> {
    let path = FieldPath::root().key("cost_model");
    let area = plugin_ref(c.area.as_ref(), &path.key("area"), ctx);
    let latency = plugin_ref(c.latency.as_ref(), &path.key("latency"), ctx);
    let parameters: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> =
        c.parameters
            .as_ref()
            .map(|m| {
                m.iter()
                    .map(|(model, params)| {
                        (
                            model.clone(),
                            params
                                .iter()
                                .map(|(k, v)| (k.clone(), v.to_text()))
                                .collect(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
    let (area, latency) = (area?, latency?);
    let mut ok = true;
    for model in parameters.keys() {
        if model != &area.name && model != &latency.name {
            ctx.error(
                &path.key("parameters").key(model),
                format!("parameters for `{model}`, which this spec does not use"),
                Some(format!(
                    "this spec uses `{}` (area) and `{}` (latency)",
                    area.name, latency.name
                )),
            );
            ok = false;
        }
    }
    ok.then_some(CostModelSpec {
        area,
        latency,
        parameters,
    })
}

/// Reports the errors of resolving the spec's cost models (unknown plugins, rejected
/// parameters, ...) at the fields they concern.
pub(crate) fn cost_model_errors(
    errors: &[crate::cost::CostModelError],
    spec: &CostModelSpec,
    ctx: &mut Ctx<'_>,
) {
    use crate::cost::CostModelError as E;
    let path = FieldPath::root().key("cost_model");
    for e in errors {
        match e {
            E::Parameter {
                model,
                parameter,
                message,
            } => {
                let table = path.key("parameters").key(model);
                let field = table.key(parameter);
                let at = if ctx.has_field(&field) { field } else { table };
                ctx.error(&at, message.clone(), None)
            }
            E::Unknown { name, .. } | E::Plugin { plugin: name, .. } => {
                let role = match e {
                    E::Plugin { role, .. } => Some(*role),
                    _ => None,
                };
                let key = match role {
                    Some(r) => r,
                    None if &spec.area.name == name => "area",
                    None => "latency",
                };
                ctx.error(&path.key(key), e.to_string(), None)
            }
        }
    }
}
