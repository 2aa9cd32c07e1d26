//! Software stacks as profiles (`[training] stack`): what a training framework really does
//! by default — which overlaps it has, how context parallelism exchanges, how data
//! parallelism shards — as `[training]` keys, and the shipped calibration it was fitted
//! with for each GPU generation. A spec naming a stack gets the profile's value for every
//! `[training]` key it leaves out; its own keys win. Three profiles ship inside the binary
//! (`spec/stacks/*.toml`); `stack` may instead name a profile file (relative to the
//! spec's folder) of the same format.

use serde::Deserialize;
use std::collections::BTreeMap;

/// The shipped profiles, by name: `archplace stacks` lists them.
pub const SHIPPED: [(&str, &str); 3] = [
    (
        "megatron-core",
        include_str!("../stacks/megatron-core.toml"),
    ),
    ("pytorch-fsdp", include_str!("../stacks/pytorch-fsdp.toml")),
    ("deepspeed", include_str!("../stacks/deepspeed.toml")),
];

/// The shipped calibrations a profile may name (`calibrations/`), inside the binary so
/// that a stack's calibration applies wherever the spec is.
pub const CALIBRATIONS: [(&str, &str); 6] = [
    (
        "a100-megatron-2021",
        include_str!("../../calibrations/a100-megatron-2021.toml"),
    ),
    (
        "a100-megatron-2022",
        include_str!("../../calibrations/a100-megatron-2022.toml"),
    ),
    (
        "deepspeed-a100",
        include_str!("../../calibrations/deepspeed-a100.toml"),
    ),
    (
        "nvidia-2024-2026",
        include_str!("../../calibrations/nvidia-2024-2026.toml"),
    ),
    (
        "pytorch-fsdp-2023",
        include_str!("../../calibrations/pytorch-fsdp-2023.toml"),
    ),
    (
        "pytorch-fsdp-a100",
        include_str!("../../calibrations/pytorch-fsdp-a100.toml"),
    ),
];

/// The shipped calibration named `name`.
pub fn shipped_calibration(name: &str) -> Option<&'static str> {
    named(&CALIBRATIONS, name)
}

/// The text named `name` in a table of embedded files.
fn named(files: &[(&str, &'static str)], name: &str) -> Option<&'static str> {
    files.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The format a profile file declares.
pub const FORMAT: &str = "archplace-stack";

/// The largest profile file read (a profile is a few dozen lines).
pub const MAX_STACK_BYTES: u64 = 64 << 10;

/// A profile, as `archplace stacks` shows it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stack {
    pub format: String,
    pub format_version: u32,
    pub name: String,
    pub title: String,
    /// Where each default comes from.
    pub sources: Vec<String>,
    /// The `[training]` defaults (checked as a spec's `[training]` is, when applied).
    pub training: toml::Table,
    /// The shipped calibration (a file of `calibrations/`, by name) for each GPU
    /// generation (`a100`, `h100`, `h200`, `b200`, `gb200`).
    #[serde(default)]
    pub calibrations: BTreeMap<String, String>,
    /// What the framework ran on one GPU generation where it differs from `[training]`
    /// (`[generations.a100.training]`): a calibration is fitted on runs of one era, and its
    /// factors mean what they were fitted with — Megatron-LM's A100 runs had none of the
    /// overlaps its H100 recipes turn on. These win over `[training]`; the spec's keys win
    /// over both.
    #[serde(default)]
    pub generations: BTreeMap<String, Generation>,
    /// Cost-model parameters that describe what the framework runs, per plugin
    /// (`[parameters.gpu-like] fused_epilogues = false`: its GEMMs' element-wise work as
    /// kernels of their own), given to a spec whose area or latency model is that plugin
    /// and which leaves them out — as `[cost_model.parameters.PLUGIN]` would.
    #[serde(default)]
    pub parameters: BTreeMap<String, toml::Table>,
}

/// A profile's defaults for one GPU generation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    /// `[training]` keys that replace the profile's own for this generation.
    #[serde(default)]
    pub training: toml::Table,
    /// Cost-model parameters, per plugin, that replace the profile's own for this
    /// generation.
    #[serde(default)]
    pub parameters: BTreeMap<String, toml::Table>,
}

impl Stack {
    /// A profile from its text: refused when it is not one (the wrong format or version,
    /// unknown keys).
    pub fn parse(text: &str) -> Result<Stack, String> {
        let s: Stack = toml::from_str(text).map_err(|e| e.message().to_string())?;
        if s.format != FORMAT || s.format_version != 1 {
            return Err(format!(
                "not a stack profile: format = \"{}\", format_version = {} (expected \"{FORMAT}\", 1)",
                s.format, s.format_version
            ));
        }
        // A misspelt generation would silently apply to no spec.
        let known = generations();
        for (table, name) in s
            .calibrations
            .keys()
            .map(|g| ("calibrations", g))
            .chain(s.generations.keys().map(|g| ("generations", g)))
        {
            if !known.contains(&name.as_str()) {
                return Err(format!(
                    "[{table}] names the GPU generation \"{name}\", which no preset has (generations: {})",
                    known.join(", ")
                ));
            }
        }
        Ok(s)
    }

    /// The calibration this stack names for a GPU of `generation`.
    pub fn calibration_for(&self, generation: &str) -> Option<&str> {
        self.calibrations.get(generation).map(String::as_str)
    }
}

/// The shipped profile named `name`.
pub fn shipped(name: &str) -> Option<&'static str> {
    named(&SHIPPED, name)
}

/// Every shipped profile, parsed (the tests hold each to its format).
pub fn all_shipped() -> Vec<Stack> {
    SHIPPED
        .iter()
        .filter_map(|(_, text)| Stack::parse(text).ok())
        .collect()
}

/// The GPU generation of a cluster or accelerator preset (`"h100-sxm-80gb"` → `"h100"`),
/// which picks a stack's calibration and its generation's defaults.
pub fn generation(preset: &str) -> &str {
    preset.split('-').next().unwrap_or(preset)
}

/// The GPU generations of the presets (`a100`, `h100`, …), in the presets' order.
pub fn generations() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for g in archplace_plugin_sdk::gpus::GPUS
        .iter()
        .map(|g| generation(g.name))
    {
        if !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

/// The text of the profile `name` names: a shipped one, else a file relative to the folder
/// of the spec `file` (what `stack` says when it is neither is the error).
pub fn text_of(name: &str, file: &str) -> Result<String, String> {
    if let Some(text) = shipped(name) {
        return Ok(text.to_string());
    }
    let looks_like_a_file = name.ends_with(".toml") || name.contains('/');
    if !looks_like_a_file {
        return Err(format!("unknown stack \"{name}\""));
    }
    let path = std::path::Path::new(file)
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join(name);
    let bytes = archplace_util::files::read_regular(&path, MAX_STACK_BYTES)
        .map_err(|e| format!("cannot read the stack profile {}: {e}", path.display()))?;
    String::from_utf8(bytes)
        .map_err(|_| format!("the stack profile {} is not UTF-8 text", path.display()))
}

/// A mean and largest relative error, in percent.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, Deserialize)]
pub struct ErrorPercent {
    pub mean_percent: f64,
    pub max_percent: f64,
}

/// How well a shipped calibration predicts its measurements (its file's `[errors]`,
/// written by `archplace calibrate`): without it, fitted on all, each left out, and each
/// source predicted from the others only.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct CalibrationErrors {
    pub measurements: u64,
    pub uncalibrated: ErrorPercent,
    pub in_sample: ErrorPercent,
    pub leave_one_out: ErrorPercent,
    /// Each source predicted from the other sources only (absent with one source).
    #[serde(
        default,
        rename(deserialize = "other_sources"),
        skip_serializing_if = "Option::is_none"
    )]
    pub leave_one_source_out: Option<ErrorPercent>,
}

/// The cross-validated errors the shipped calibration `name` was made with.
pub fn calibration_errors(name: &str) -> Option<CalibrationErrors> {
    #[derive(Deserialize)]
    struct File {
        errors: CalibrationErrors,
    }
    toml::from_str::<File>(shipped_calibration(name)?)
        .ok()
        .map(|f| f.errors)
}
