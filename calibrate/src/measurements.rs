//! The measurements file `archplace calibrate` reads (docs/calibration.md; JSON Schema:
//! `archplace calibrate --schema`): end-to-end runs, each a spec with `[accelerator]` and
//! `[plan]` (a file, with overrides, or inline) and its measured figure, and single
//! operators on a spec's chip with their measured seconds.

use archplace_plugin_sdk::{Direction, ElementType, Gemm, Op, OpKind, VectorKind};
use archplace_spec::{Diagnostic, Spec};
use schemars::JsonSchema;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The largest measurements file read.
pub const MAX_MEASUREMENTS_BYTES: u64 = 4 << 20;
/// The most measurements in one file.
pub const MAX_MEASUREMENTS: usize = 2_000;

/// A measurements file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MeasurementsFile {
    /// The file format's version: 1.
    pub schema_version: u32,
    /// What to fit and how.
    #[serde(default)]
    pub calibrate: Settings,
    /// The measurements, at least one.
    #[serde(rename = "measurement", default)]
    pub measurements: Vec<RawMeasurement>,
    /// Where they were taken (free-form: GPU, clocks, driver, CUDA and framework versions,
    /// as `scripts/measure-gpu` records them).
    pub machine: Option<std::collections::BTreeMap<String, String>>,
    /// Timings archplace has no single operator for (an optimizer step, a device-to-device
    /// copy): kept with the measurements for comparison, not fitted.
    #[serde(default)]
    pub other: Vec<OtherTiming>,
}

/// A timing kept for comparison, not fitted.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtherTiming {
    pub name: String,
    pub seconds: f64,
    /// Bytes it moves, when that says something (a copy's, an optimizer step's).
    pub bytes: Option<u64>,
}

/// `[calibrate]`: what to fit and how (every key optional).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Parameters to fit, as `PLUGIN.NAME` or `cluster.NAME` (default: those the plugin
    /// and archplace mark as fitted by default; `archplace plugin check` lists them).
    pub fit: Option<Vec<String>>,
    /// Bootstrap refits for the parameters' uncertainty (default 200; 0 to 10,000).
    pub bootstrap: Option<u32>,
    /// Seed of the bootstrap's resampling (default 1): the same file gives the same
    /// calibration.
    pub seed: Option<u64>,
    /// Scale of the robust loss on the log ratio of predicted to measured (default 0.05:
    /// residuals beyond about 5% count linearly, not squared).
    pub robust_scale: Option<f64>,
}

/// One measurement as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMeasurement {
    /// Where it comes from (a paper's table, a cluster, a benchmark run): cross-validation
    /// leaves each source out in turn.
    pub source: String,
    /// What it is, for reports (default: the spec's name).
    pub label: Option<String>,
    /// A spec file (relative to the measurements file) with `[accelerator]` and `[plan]`.
    pub spec: Option<String>,
    /// Or the spec's TOML text inline.
    pub spec_text: Option<String>,
    /// Keys to set in the spec, dotted: `{ "plan.micro_batch" = 2, "training.global_batch"
    /// = 512 }`.
    #[schemars(with = "Option<std::collections::BTreeMap<String, serde_json::Value>>")]
    pub overrides: Option<toml::Table>,
    /// What was measured.
    pub metric: Metric,
    /// The measured figure, in the metric's unit.
    pub value: f64,
    /// For `tflops_per_device`: how the source counts FLOPs.
    pub flop_convention: Option<FlopConvention>,
    /// For `op_seconds`: the operator, on the spec's `[accelerator]`.
    pub op: Option<RawOp>,
}

/// What a measurement measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Seconds per training step (iteration).
    StepSeconds,
    /// Tokens per second per device.
    TokensPerSecondPerDevice,
    /// TeraFLOP/s per device, counted by `flop_convention`.
    TflopsPerDevice,
    /// Seconds of one operator (`op`).
    OpSeconds,
}

/// How a source counts the FLOPs of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FlopConvention {
    /// What the hardware executes: recomputation included (Megatron-LM 2021–22's
    /// "achieved teraFLOP/s").
    Hardware,
    /// The model's FLOPs: no recomputation, attention's scores unmasked (Megatron-LM's and
    /// NeMo's MFU convention).
    Model,
}

/// One operator: a GEMM or a fused attention kernel on all (or `cores`) tensor cores, or
/// a vector operation on the vector cores.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOp {
    /// `[m, n, k]` or `[batch, m, n, k]`.
    pub gemm: Option<Vec<u64>>,
    /// The GEMM's input element type (default bf16): fp32, bf16, fp16, fp8, mxfp8, nvfp4.
    pub element: Option<String>,
    /// A vector operation: layer_norm, rms_norm, add, mul, bias_add, scale, gelu, relu,
    /// silu, tanh, dropout, softmax, cross_entropy, rotary, embedding.
    #[schemars(with = "Option<String>")]
    pub vector: Option<VectorKind>,
    /// The vector operation's elements.
    pub elements: Option<u64>,
    /// Its row length (row-wise operations; default 1).
    pub row: Option<u64>,
    /// Fused attention (FlashAttention): `batch` sequences of `seq` tokens, `heads` query
    /// and `kv_heads` key/value heads of `head_dim`, `causal`.
    pub attention: Option<RawAttention>,
    /// The backward kernel (default: forward).
    #[serde(default)]
    pub backward: bool,
    /// Cores to use (default: all of the kind).
    pub cores: Option<u32>,
}

/// A fused attention kernel.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawAttention {
    pub batch: u64,
    pub heads: u64,
    pub kv_heads: Option<u64>,
    pub seq: u64,
    pub head_dim: u64,
    #[serde(default = "yes")]
    pub causal: bool,
}

fn yes() -> bool {
    true
}

/// What is measured, resolved.
#[derive(Debug, Clone)]
pub enum Target {
    /// A training step: its measured seconds follow from the metric and the estimate
    /// (throughput metrics scale with the step's time, the step's tokens and FLOPs do not
    /// depend on the calibrated parameters).
    Step {
        metric: Metric,
        convention: Option<FlopConvention>,
    },
    /// One operator on `cores` of the chip.
    Op {
        op: Op,
        tensor: bool,
        cores: Option<u32>,
    },
}

/// One measurement, resolved: its spec validated.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub source: String,
    pub label: String,
    pub spec: Spec,
    pub target: Target,
    pub value: f64,
}

/// Why a measurements file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MeasurementsError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{}", render(.0))]
    Invalid(Vec<Diagnostic>),
    #[error("{}", .0.join("\n"))]
    Measurements(Vec<String>),
}

fn render(d: &[Diagnostic]) -> String {
    d.iter()
        .map(|d| format!("{}:{}: {}: {}", d.file, d.line, d.field, d.message))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A measurements file read and every measurement resolved; every problem reported.
pub struct Loaded {
    pub settings: Settings,
    pub measurements: Vec<Measurement>,
    /// blake3 of the file and of every spec file it names, in order: the provenance.
    pub blake3: String,
}

/// Reads `path` and resolves its measurements (specs relative to its folder).
pub fn load(path: &Path) -> Result<Loaded, MeasurementsError> {
    let shown = path.display().to_string();
    let read = |p: &Path| -> Result<String, MeasurementsError> {
        let bytes =
            archplace_util::files::read_regular(p, MAX_MEASUREMENTS_BYTES).map_err(|e| {
                MeasurementsError::Read {
                    path: p.display().to_string(),
                    message: e.to_string(),
                }
            })?;
        String::from_utf8(bytes).map_err(|_| MeasurementsError::Read {
            path: p.display().to_string(),
            message: "not UTF-8 text".into(),
        })
    };
    let text = read(path)?;
    let (file, diagnostics) = archplace_spec::read_toml::<MeasurementsFile>(&text, &shown);
    let file = match file {
        Some(f) if diagnostics.is_empty() => f,
        _ => return Err(MeasurementsError::Invalid(diagnostics)),
    };
    let mut problems = Vec::new();
    if file.schema_version != 1 {
        problems.push(format!(
            "schema_version {}: this archplace reads version 1",
            file.schema_version
        ));
    }
    if file.measurements.is_empty() || file.measurements.len() > MAX_MEASUREMENTS {
        problems.push(format!(
            "{} measurements: give 1 to {MAX_MEASUREMENTS}",
            file.measurements.len()
        ));
    }
    for o in &file.other {
        if !(o.seconds.is_finite() && o.seconds > 0.0) {
            problems.push(format!(
                "other timing `{}`: {} s is not positive",
                o.name, o.seconds
            ));
        }
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut hasher = blake3::Hasher::new();
    hasher.update(text.as_bytes());
    let mut measurements = Vec::new();
    for (i, m) in file.measurements.iter().enumerate() {
        let at = format!("{shown}: measurement {} ({})", i + 1, m.source);
        match resolve(m, dir, &read) {
            Ok((measurement, spec_text)) => {
                hasher.update(spec_text.as_bytes());
                measurements.push(measurement);
            }
            Err(e) => problems.push(format!("{at}: {e}")),
        }
    }
    if !problems.is_empty() {
        return Err(MeasurementsError::Measurements(problems));
    }
    Ok(Loaded {
        settings: file.calibrate,
        measurements,
        blake3: hasher.finalize().to_hex().to_string(),
    })
}

/// One measurement: its spec read, overridden and validated; its figure checked.
fn resolve(
    m: &RawMeasurement,
    dir: &Path,
    read: &dyn Fn(&Path) -> Result<String, MeasurementsError>,
) -> Result<(Measurement, String), String> {
    if !(m.value.is_finite() && m.value > 0.0) {
        return Err(format!("value {} is not a positive number", m.value));
    }
    let (text, file) = match (&m.spec, &m.spec_text) {
        (Some(p), None) => {
            let path: PathBuf = dir.join(p);
            (
                read(&path).map_err(|e| e.to_string())?,
                path.display().to_string(),
            )
        }
        (None, Some(t)) => (t.clone(), "(inline spec)".to_string()),
        _ => return Err("give exactly one of `spec` (a file) and `spec_text`".into()),
    };
    let text = match &m.overrides {
        Some(o) => overridden(&text, o)?,
        None => text,
    };
    let spec = archplace_spec::parse(&text, &file).map_err(|d| {
        d.iter()
            .map(|d| format!("{}: {}", d.field, d.message))
            .collect::<Vec<_>>()
            .join("; ")
    })?;
    let Some(estimate) = &spec.estimate else {
        return Err(format!(
            "{file} has no [accelerator] and [plan]: a measurement is of one chip and plan"
        ));
    };
    let target = match (m.metric, &m.op) {
        (Metric::OpSeconds, Some(op)) => op_target(op, &estimate.accelerator)?,
        (Metric::OpSeconds, None) => return Err("metric op_seconds needs `op`".into()),
        (_, Some(_)) => return Err("`op` is for metric op_seconds".into()),
        (Metric::TflopsPerDevice, None) if m.flop_convention.is_none() => {
            return Err(
                "metric tflops_per_device needs `flop_convention` (hardware or model)".into(),
            );
        }
        (metric, None) => Target::Step {
            metric,
            convention: m.flop_convention,
        },
    };
    let label = m.label.clone().unwrap_or_else(|| spec.name.clone());
    Ok((
        Measurement {
            source: m.source.clone(),
            label,
            spec,
            target,
            value: m.value,
        },
        text,
    ))
}

/// `text` with each dotted key of `overrides` set.
fn overridden(text: &str, overrides: &toml::Table) -> Result<String, String> {
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    for (key, value) in overrides {
        let parts: Vec<&str> = key.split('.').collect();
        let (last, path) = parts
            .split_last()
            .ok_or_else(|| format!("override `{key}`: an empty key"))?;
        let mut t = &mut doc;
        for p in path {
            let entry = t
                .entry(p.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            t = entry
                .as_table_mut()
                .ok_or_else(|| format!("override `{key}`: `{p}` is not a table"))?;
        }
        t.insert(last.to_string(), value.clone());
    }
    toml::to_string(&doc).map_err(|e| e.to_string())
}

/// The operator of an `op_seconds` measurement.
fn op_target(op: &RawOp, chip: &archplace_plugin_sdk::AcceleratorConfig) -> Result<Target, String> {
    let direction = if op.backward {
        Direction::Backward
    } else {
        Direction::Forward
    };
    let (kind, tensor, element) = match (&op.gemm, op.vector, op.attention) {
        (None, None, Some(a)) => {
            let kv = a.kv_heads.unwrap_or(a.heads);
            let dims = [a.batch, a.heads, kv, a.seq, a.head_dim];
            if dims.iter().any(|&d| d == 0 || d > 1 << 24) || a.heads % kv != 0 {
                return Err(
                    "attention: every size 1 to 16,777,216, heads a multiple of kv_heads".into(),
                );
            }
            if op.element.is_some() {
                return Err("`element` is for GEMMs (attention runs in 16-bit)".into());
            }
            (
                OpKind::Attention(archplace_plugin_sdk::Attention {
                    batch: a.batch,
                    heads: a.heads,
                    kv_heads: kv,
                    seq: a.seq,
                    head_dim: a.head_dim,
                    value_dim: a.head_dim,
                    causal: a.causal,
                }),
                true,
                ElementType::Bf16,
            )
        }
        (Some(dims), None, None) => {
            let g = Gemm::from_dims(dims)
                .ok_or("`gemm` is [m, n, k] or [batch, m, n, k], each dimension 1 to 16,777,216")?;
            let element = match op.element.as_deref() {
                None => ElementType::Bf16,
                Some(e) => ElementType::named(e)
                    .ok_or_else(|| format!("element `{e}`: use one of {}", ElementType::names()))?,
            };
            (OpKind::Gemm(g), true, element)
        }
        (None, Some(kind), None) => {
            let elements = op.elements.ok_or("a vector operation needs `elements`")?;
            if elements == 0 || elements > 1 << 53 {
                return Err("`elements` must be 1 to 2^53".into());
            }
            if op.element.is_some() {
                return Err("`element` is for GEMMs".into());
            }
            let row = op.row.unwrap_or(1).max(1);
            (
                OpKind::Vector {
                    kind,
                    elements,
                    row,
                },
                false,
                ElementType::Bf16,
            )
        }
        _ => return Err("`op` has exactly one of `gemm`, `attention` and `vector`".into()),
    };
    let most = if tensor {
        chip.tensor_cores
    } else {
        chip.vector_cores
    };
    if let Some(c) = op.cores
        && (c == 0 || c > most)
    {
        return Err(format!("cores {c}: the chip has {most} of that kind"));
    }
    let op_value = Op::new(kind, direction);
    let op_value = if tensor && op.attention.is_none() {
        op_value.with_element(element)
    } else {
        op_value
    };
    Ok(Target::Op {
        op: op_value,
        tensor,
        cores: op.cores,
    })
}
