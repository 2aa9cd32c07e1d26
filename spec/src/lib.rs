//! Search specs: the TOML files people write to describe a search.
//!
//! Reading a spec never stops at the first problem where it can go on: syntax errors are
//! collected with recovery, each section is deserialized on its own (an unknown key in
//! `[training]` does not hide a bad value in `[cluster]`), and the rules that relate fields
//! (a micro-batch that must divide the global batch, heads that must divide by the
//! tensor-parallel width, ...) are all checked and reported together. Every problem names
//! the file, line, column and field, and says what would be valid.

// Results must not depend on a hash map's order (ARCHITECTURE.md, "Determinism").
#![warn(clippy::iter_over_hash_type)]

// In their order: each imports only those before it (ARCHITECTURE.md, invariant 19; a
// tidy test checks it). One per group: rustfmt would sort consecutive declarations.
pub mod raw;

pub mod calibration;

pub mod diagnostic;

pub mod stack;

mod input;

mod resolved;

mod schema;

mod validate;

pub use input::{EstimateSpecError, Scheduling};
pub use resolved::{estimate_toml, plan_table, resolved};

use archplace_engine::model::ModelConfig;
use archplace_engine::space::SpaceSpec;
use archplace_engine::step::StepPlan;
use archplace_engine::training::{Baseline, Cluster, Training};
use archplace_plugin_sdk::AcceleratorConfig;
use archplace_plugin_sdk::text::thousands;
pub use diagnostic::{Diagnostic, FieldPath};
use diagnostic::{Seg, did_you_mean, locate, locate_key};
use raw::{RawModel, RawSpec, TOP_LEVEL_KEYS};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::Path;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

/// The default spec, embedded in the binary: a small search that finishes quickly.
pub const DEFAULT_SPEC: &str = include_str!("default.toml");
/// The name under which the embedded default spec is reported.
pub const DEFAULT_SPEC_NAME: &str = "<embedded default spec>";

/// The largest spec file that is read: specs are a few kilobytes; a megabyte leaves room
/// for long comments and many models without letting a stray file exhaust memory.
pub const MAX_SPEC_BYTES: u64 = 1 << 20;

/// Reads a spec, config or other small input file named by a user: a regular file of at
/// most `MAX_SPEC_BYTES` (a FIFO, a device or a folder is refused without being opened
/// for reading).
pub fn read_input(path: &Path) -> std::io::Result<Vec<u8>> {
    archplace_util::files::read_regular(path, MAX_SPEC_BYTES).map_err(|e| match e {
        archplace_util::files::ReadError::Io(e) => e,
        other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
    })
}

/// A model to train, with an optional fixed strategy to compare against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    pub config: ModelConfig,
    pub baseline: Option<Baseline>,
    /// How many times it counts in the search's objective (`weight`, default 1).
    pub weight: f64,
}

/// Which cost models to use and their parameters (values as written in the spec; each
/// model validates its own). The type belongs to the plugin host, which resolves it.
pub use archplace_cost_port::CostModelSpec;

/// A validated spec. Everything in SI units.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spec {
    pub name: String,
    pub description: Option<String>,
    /// blake3 of the file's bytes, hex: identifies this exact content.
    pub content_hash: String,
    /// Where the spec came from and its text, to locate errors found after validation
    /// (e.g. a plugin rejecting a parameter).
    #[serde(skip)]
    pub source_file: String,
    #[serde(skip)]
    pub source_text: String,
    pub models: Vec<ModelSpec>,
    /// The software stack whose profile filled the `[training]` keys the spec left out
    /// ([`stack`]): a shipped profile's name or the profile file the spec names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
    /// The shipped calibration ([`stack::CALIBRATIONS`]) the stack names for the spec's
    /// GPU generation (its `[cluster]` or `[accelerator]` preset), applied when
    /// `[cost_model] calibration` names none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_calibration: Option<String>,
    pub training: Training,
    pub cluster: Cluster,
    pub space: SpaceSpec,
    pub cost_model: CostModelSpec,
    /// The fixed chip and plan of `[accelerator]` and `[plan]`, for `archplace estimate`.
    pub estimate: Option<EstimateSpec>,
}

/// One chip and one plan to estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EstimateSpec {
    pub accelerator: AcceleratorConfig,
    pub hbm_bytes: u64,
    pub peak_flops_per_second: Option<f64>,
    pub plan: StepPlan,
}

/// Why a spec file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{} error(s) in {path}", diagnostics.len())]
    Invalid {
        path: String,
        text: String,
        diagnostics: Vec<Diagnostic>,
    },
}

impl LoadError {
    /// Every problem, located, as diagnostics (an unreadable file is one without a line).
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        match self {
            LoadError::Io { path, source } => {
                vec![Diagnostic::new(
                    path,
                    "",
                    None,
                    String::new(),
                    format!("cannot read the file: {source}"),
                )]
            }
            LoadError::Invalid { diagnostics, .. } => diagnostics.clone(),
        }
    }

    /// Compiler-style text of every problem.
    pub fn render(&self) -> String {
        match self {
            LoadError::Io { .. } => self.diagnostics().iter().map(|d| d.render("")).collect(),
            LoadError::Invalid {
                text, diagnostics, ..
            } => diagnostics.iter().map(|d| d.render(text)).collect(),
        }
    }
}

/// Reads and validates the spec at `path`.
pub fn load(path: &Path) -> Result<Spec, LoadError> {
    let shown = path.display().to_string();
    let (text, spec) = match load_text(path)? {
        (text, Ok(())) => {
            let spec = parse(&text, &shown);
            (text, spec)
        }
        (text, Err(d)) => (text, Err(vec![d])),
    };
    spec.map_err(|diagnostics| LoadError::Invalid {
        path: shown,
        text,
        diagnostics,
    })
}

/// The embedded default spec, validated.
pub fn default_spec() -> Result<Spec, Vec<Diagnostic>> {
    parse(DEFAULT_SPEC, DEFAULT_SPEC_NAME)
}

/// Validates `source`; `file` is only used in diagnostics.
pub fn parse(source: &str, file: &str) -> Result<Spec, Vec<Diagnostic>> {
    parse_keeping_cost_model(source, file).0
}

/// Validates `source` and, when it has problems but its `[cost_model]` is fine, resolves
/// the cost models it names through `models` as well (loading plugins, checking their
/// parameters), so that a spec's plugin problems come in the same run as its other ones.
/// A valid spec's cost models are left to the caller to resolve (as [`resolve_cost_models`]).
pub fn parse_with_plugins(
    source: &str,
    file: &str,
    models: &dyn archplace_cost_port::CostModelSource,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<Spec, Vec<Diagnostic>> {
    match parse_keeping_cost_model(source, file) {
        (Ok(spec), _) => Ok(spec),
        (Err(mut diagnostics), Some(cost_model)) => {
            if let Err(more) = resolve_in(&cost_model, source, file, models, cancel) {
                diagnostics.extend(more);
                diagnostics.sort_by_key(|d| (d.line, d.column));
            }
            Err(diagnostics)
        }
        (Err(diagnostics), None) => Err(diagnostics),
    }
}

/// [`load`] with [`parse_with_plugins`]'s plugin checks.
pub fn load_with_plugins(
    path: &Path,
    models: &dyn archplace_cost_port::CostModelSource,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<Spec, LoadError> {
    let shown = path.display().to_string();
    let (text, spec) = match load_text(path)? {
        (text, Ok(())) => {
            let spec = parse_with_plugins(&text, &shown, models, cancel);
            (text, spec)
        }
        (text, Err(d)) => (text, Err(vec![d])),
    };
    spec.map_err(|diagnostics| LoadError::Invalid {
        path: shown,
        text,
        diagnostics,
    })
}

/// The text of the file at `path`, and whether it is UTF-8 (see [`decode`]).
fn load_text(path: &Path) -> Result<(String, Result<(), Diagnostic>), LoadError> {
    let shown = path.display().to_string();
    let bytes = read_input(path).map_err(|source| LoadError::Io {
        path: shown.clone(),
        source,
    })?;
    Ok(decode(bytes, &shown))
}

/// A spec file's bytes as text, and whether they are UTF-8: if not, the text is their
/// lossy reading and the diagnostic (for `file`) locates the first bad byte — its line and
/// column, the snippet's caret under the replacement character that stands for it. The
/// CLI and the daemon decode through this one function.
pub fn decode(bytes: Vec<u8>, file: &str) -> (String, Result<(), Diagnostic>) {
    match String::from_utf8(bytes) {
        Ok(t) => (t, Ok(())),
        Err(e) => {
            let offset = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
            // The bytes before `offset` are the same in the lossy text; the bad byte (or
            // sequence) becomes one U+FFFD there.
            let end = offset + char::REPLACEMENT_CHARACTER.len_utf8();
            let d = Diagnostic::new(
                file,
                &text,
                Some(offset..end.min(text.len())),
                String::new(),
                format!(
                    "the file is not valid UTF-8 (byte {offset}, 0x{:02x}, starts no character)",
                    e.as_bytes().get(offset).copied().unwrap_or(0)
                ),
            )
            .with_help(Some("save the spec as UTF-8".into()));
            (text, Err(d))
        }
    }
}

/// The spec of `source`, or its problems; and its cost models when `[cost_model]` is fine.
fn parse_keeping_cost_model(
    source: &str,
    file: &str,
) -> (Result<Spec, Vec<Diagnostic>>, Option<CostModelSpec>) {
    // Declared before the document, which may borrow the stack profile's values.
    let profile_text: String;
    let (mut doc, syntax) = DeTable::parse_recoverable(source);
    let mut stack_problem = None;
    let mut profile = None;
    if syntax.is_empty()
        && let Some((name, at)) = stack_named(doc.get_ref())
    {
        match stack::text_of(&name, file) {
            Ok(text) => {
                profile_text = text;
                match apply_stack(doc.get_mut(), &profile_text, at.clone()) {
                    Ok(p) => profile = Some(p),
                    Err(why) => stack_problem = Some((at, why)),
                }
            }
            Err(why) => stack_problem = Some((at, why)),
        }
    }
    let mut ctx = Ctx::new(file, source, &doc);
    if ctx.syntax_errors(syntax) {
        return (Err(ctx.diagnostics), None);
    }
    if let Some((at, why)) = stack_problem {
        ctx.push(
            Some(at),
            FieldPath::root().key("training").key("stack"),
            why,
            Some(format!(
                "name a shipped stack ({}) or a profile file beside the spec",
                stack::SHIPPED.map(|(n, _)| format!("\"{n}\"")).join(", ")
            )),
        );
        return (Err(ctx.diagnostics), None);
    }
    let (raw, failed) = ctx.sections();
    let (spec, cost_model) = validate::validate(&raw, &failed, &mut ctx, source);
    let spec = match spec {
        Some(mut spec) if ctx.diagnostics.is_empty() => {
            if spec.cost_model.calibration.is_none() {
                spec.stack_calibration = profile
                    .as_ref()
                    .and_then(|(p, generation)| p.calibration_for(generation.as_deref()?))
                    .map(str::to_string);
            }
            Ok(spec)
        }
        _ => {
            // In file order, as a reader fixes them.
            ctx.diagnostics.sort_by_key(|d| (d.line, d.column));
            Err(ctx.diagnostics)
        }
    };
    (spec, cost_model)
}

/// The value of `key` in a parsed table.
fn entry<'d, 'a>(table: &'d DeTable<'a>, key: &str) -> Option<&'d Spanned<DeValue<'a>>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == key)
        .map(|(_, v)| v)
}

/// `[training] stack` when the spec names one as a string, and where its value is.
fn stack_named(doc: &DeTable<'_>) -> Option<(String, std::ops::Range<usize>)> {
    let stack = entry(entry(doc, "training")?.get_ref().as_table()?, "stack")?;
    Some((stack.get_ref().as_str()?.to_string(), stack.span()))
}

/// Gives the spec's `[training]` the profile's value of every key it leaves out, and its
/// `[cost_model.parameters]` the profile's parameters for the plugins it uses, each
/// located at the spec's `stack` value (`at`): a problem with one is reported there. The
/// spec's GPU generation's defaults come before the profile's own. Returns the profile and
/// that generation, which also picks the profile's calibration.
fn apply_stack<'a>(
    doc: &mut DeTable<'a>,
    profile: &'a str,
    at: std::ops::Range<usize>,
) -> Result<(stack::Stack, Option<String>), String> {
    let parsed = stack::Stack::parse(profile)?;
    let (table, _) = DeTable::parse_recoverable(profile);
    let table = table.get_ref();
    let defaults = entry(table, "training")
        .and_then(|v| v.get_ref().as_table())
        .ok_or_else(|| format!("the stack profile {} has no [training] table", parsed.name))?;
    let generation = preset_named(doc).map(|p| stack::generation(p).to_string());
    let of_generation = |section: &str| {
        let generations = entry(table, "generations")?.get_ref().as_table()?;
        let own = entry(generations, generation.as_deref()?)?
            .get_ref()
            .as_table()?;
        entry(own, section)?.get_ref().as_table()
    };
    let training = doc
        .iter_mut()
        .find(|(k, _)| k.get_ref().as_ref() == "training")
        .and_then(|(_, v)| match v.get_mut() {
            DeValue::Table(t) => Some(t),
            _ => None,
        })
        .ok_or("`[training]` is not a table")?;
    for from in of_generation("training").into_iter().chain([defaults]) {
        fill(training, from, &at);
    }
    // The cost-model parameters the framework's runs set, for the plugins the spec uses.
    let plugins = plugins_named(doc);
    let profile_parameters = entry(table, "parameters").and_then(|v| v.get_ref().as_table());
    for per_plugin in of_generation("parameters")
        .into_iter()
        .chain(profile_parameters)
    {
        for (plugin, values) in per_plugin.iter() {
            let plugin = plugin.get_ref().as_ref();
            let Some(values) = values.get_ref().as_table() else {
                continue;
            };
            if !plugins.iter().any(|p| p == plugin) {
                continue;
            }
            let own = subtable(doc, "cost_model", &at)
                .and_then(|c| subtable(c, "parameters", &at))
                .and_then(|p| subtable(p, plugin, &at))
                .map_err(|why| format!("cannot give the profile's `{plugin}` parameters: {why}"))?;
            fill(own, values, &at);
        }
    }
    Ok((parsed, generation))
}

/// Gives `into` each key of `from` it lacks, located at `at`.
fn fill<'a>(into: &mut DeTable<'a>, from: &DeTable<'a>, at: &std::ops::Range<usize>) {
    for (key, value) in from.iter() {
        if into.iter().any(|(k, _)| k.get_ref() == key.get_ref()) {
            continue;
        }
        into.insert(
            Spanned::new(at.clone(), key.get_ref().clone()),
            respan(value, at),
        );
    }
}

/// The table `key` of `parent`, made (located at `at`) when it has none; an error when
/// `key` is there but not a table.
fn subtable<'d, 'a>(
    parent: &'d mut DeTable<'a>,
    key: &str,
    at: &std::ops::Range<usize>,
) -> Result<&'d mut DeTable<'a>, String> {
    if !parent.iter().any(|(k, _)| k.get_ref().as_ref() == key) {
        parent.insert(
            Spanned::new(at.clone(), std::borrow::Cow::Owned(key.to_string())),
            Spanned::new(at.clone(), DeValue::Table(DeTable::new())),
        );
    }
    parent
        .iter_mut()
        .find(|(k, _)| k.get_ref().as_ref() == key)
        .and_then(|(_, v)| match v.get_mut() {
            DeValue::Table(t) => Some(t),
            _ => None,
        })
        .ok_or_else(|| format!("`{key}` is not a table"))
}

/// The plugins the spec's `[cost_model]` names as its area and latency models (a name, or
/// a table with `plugin`); "reference" for one it leaves out.
fn plugins_named(doc: &DeTable<'_>) -> Vec<String> {
    let cost_model = entry(doc, "cost_model").and_then(|v| v.get_ref().as_table());
    ["area", "latency"]
        .into_iter()
        .map(|role| {
            let Some(v) = cost_model.and_then(|c| entry(c, role)) else {
                return "reference".to_string();
            };
            match v.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Table(t) => entry(t, "plugin")
                    .and_then(|p| p.get_ref().as_str())
                    .unwrap_or("reference")
                    .to_string(),
                _ => "reference".to_string(),
            }
        })
        .collect()
}

/// The preset whose GPU generation picks a stack's defaults and calibration: the
/// `[cluster]` one, else the `[accelerator]` one.
fn preset_named<'d>(doc: &'d DeTable<'_>) -> Option<&'d str> {
    ["cluster", "accelerator"].into_iter().find_map(|section| {
        entry(entry(doc, section)?.get_ref().as_table()?, "preset")?
            .get_ref()
            .as_str()
    })
}

/// `value` with every span inside it moved to `at`.
fn respan<'a>(value: &Spanned<DeValue<'a>>, at: &std::ops::Range<usize>) -> Spanned<DeValue<'a>> {
    let v = match value.get_ref() {
        DeValue::Array(items) => {
            let mut a = toml::de::DeArray::new();
            for item in items.iter() {
                a.push(respan(item, at));
            }
            DeValue::Array(a)
        }
        DeValue::Table(t) => {
            let mut out = DeTable::new();
            for (k, item) in t.iter() {
                out.insert(
                    Spanned::new(at.clone(), k.get_ref().clone()),
                    respan(item, at),
                );
            }
            DeValue::Table(out)
        }
        other => other.clone(),
    };
    Spanned::new(at.clone(), v)
}

impl Spec {
    /// Notes for the sections the spec leaves out, saying what their defaults amount to:
    /// a missing `[cluster]` silently meaning 1,024 devices and three HBM sizes surprised
    /// people. Printed by `validate` and `run` (not errors).
    pub fn defaulted_sections(&self) -> Vec<String> {
        use archplace_plugin_sdk::units::format_bytes;
        let (doc, _) = DeTable::parse_recoverable(&self.source_text);
        let has = |k: &str| {
            doc.get_ref()
                .iter()
                .any(|(key, _)| key.get_ref().as_ref() == k)
        };
        let mut notes = Vec::new();
        if !has("training") {
            let t = &self.training;
            notes.push(format!(
                "no [training]: the defaults — a global batch of {}, micro-batches {:?}, optimizer {:?}",
                thousands(t.global_batch),
                t.micro_batch_sizes,
                t.optimizer
            ));
        }
        if !has("cluster") {
            let c = &self.cluster;
            let hbm: Vec<String> = c.hbm_bytes.iter().map(|&b| format_bytes(b)).collect();
            notes.push(format!(
                "no [cluster]: the defaults — {} devices, links of {}/s, HBM of {}",
                thousands(c.devices),
                format_bytes(c.link_bytes_per_second as u64),
                hbm.join(", ")
            ));
        }
        if !has("search") {
            notes.push(
                "no [search]: the reference's architecture space and area budget".to_string(),
            );
        }
        if !has("cost_model") {
            notes.push("no [cost_model]: the reference area and latency models".to_string());
        }
        notes
    }

    /// A problem found after validation, located at `field` of the spec's text (the whole
    /// file if the spec does not write that field).
    pub fn diagnostic_at(
        &self,
        field: &[&str],
        message: String,
        help: Option<String>,
    ) -> Diagnostic {
        let source = self.source_text.as_str();
        let (doc, _) = DeTable::parse_recoverable(source);
        let mut path = FieldPath::root();
        for k in field {
            path = path.key(k);
        }
        let span =
            locate_key(doc.get_ref(), &path).map(|_| locate(doc.get_ref(), doc.span(), &path));
        Diagnostic::new(&self.source_file, source, span, path.to_string(), message).with_help(help)
    }
}

/// Resolves the cost models `spec` names through `models` (loading plugins, validating
/// their parameters); problems are located in the spec's text like any other error.
pub fn resolve_cost_models(
    spec: &Spec,
    models: &dyn archplace_cost_port::CostModelSource,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<archplace_cost_port::CostModels, Vec<Diagnostic>> {
    let resolved = resolve_in(
        &spec.cost_model,
        &spec.source_text,
        &spec.source_file,
        models,
        cancel,
    )?;
    let problems = precision_problems(spec, resolved.latency.as_ref());
    if problems.is_empty() {
        Ok(resolved)
    } else {
        Err(problems)
    }
}

/// [`resolve_cost_models`] for a spec whose cost models differ from `like`'s only in
/// their parameters (a calibration's values, an interval's draw): the source reuses the
/// components `like` was made from.
pub fn reresolve_cost_models(
    spec: &Spec,
    models: &dyn archplace_cost_port::CostModelSource,
    like: &archplace_cost_port::CostModels,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<archplace_cost_port::CostModels, Vec<Diagnostic>> {
    let resolved = models
        .reconfigure(&spec.cost_model, like, cancel)
        .map_err(|errors| {
            let (doc, _) = DeTable::parse_recoverable(&spec.source_text);
            let mut ctx = Ctx::new(&spec.source_file, &spec.source_text, &doc);
            validate::cost_model_errors(&errors, &spec.cost_model, &mut ctx);
            ctx.diagnostics
        })?;
    let problems = precision_problems(spec, resolved.latency.as_ref());
    if problems.is_empty() {
        Ok(resolved)
    } else {
        Err(problems)
    }
}

/// The precisions `spec` trains in whose GEMMs' element type the latency model does not
/// multiply (an FP8 recipe on a chip without FP8), or cannot be told (a plugin of
/// interface 1.0 or 1.1): located at `[plan] precision` for an estimate, at `[training]
/// precision` for a search.
fn precision_problems(
    spec: &Spec,
    latency: &dyn archplace_plugin_sdk::LatencyModel,
) -> Vec<Diagnostic> {
    let (key, precisions) = match &spec.estimate {
        // The plan's precision is `[training]`'s when `[plan]` leaves it out.
        Some(e) if has_key(&spec.source_text, "plan.precision") => {
            ("plan.precision", vec![e.plan.precision])
        }
        Some(e) => ("training.precision", vec![e.plan.precision]),
        None => ("training.precision", spec.training.precisions.clone()),
    };
    let takes = latency.tensor_element_types();
    let info = latency.info();
    let (major, minor) = info.interface_version;
    precisions
        .into_iter()
        .filter(|p| !takes.contains(&p.gemm_element()))
        .map(|p| {
            let e = p.gemm_element().name();
            let (message, help) = if (major, minor) < (1, 2) {
                (
                    format!(
                        "latency model `{}` implements cost-model interface {major}.{minor}, which cannot be told a GEMM's element type: precision {} runs the blocks' GEMMs in {e}, which needs interface 1.2 or later",
                        info.name,
                        p.name()
                    ),
                    "train in bf16-mixed with it, or use a latency model built for interface 1.2 or later (e.g. gpu-like)",
                )
            } else {
                let list: Vec<&str> = takes.iter().map(|t| t.name()).collect();
                (
                    format!(
                        "latency model `{}` {}, as configured, does not multiply {e}: its tensor cores take {}; precision {} needs {e}",
                        info.name,
                        info.version,
                        list.join(", "),
                        p.name()
                    ),
                    "use a precision it takes, or a chip with that format (gpu-like: a Hopper or Blackwell `preset`, or its `fp8_speedup` and `mx_formats` parameters)",
                )
            };
            diagnostic_at_key(
                &spec.source_text,
                &spec.source_file,
                key,
                message,
                Some(help.to_string()),
            )
        })
        .collect()
}

/// Resolves `cost_model` (read from `source`, shown as `file`) through `models`, its
/// problems located in `source`.
fn resolve_in(
    cost_model: &CostModelSpec,
    source: &str,
    file: &str,
    models: &dyn archplace_cost_port::CostModelSource,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<archplace_cost_port::CostModels, Vec<Diagnostic>> {
    models.resolve(cost_model, cancel).map_err(|errors| {
        let (doc, _) = DeTable::parse_recoverable(source);
        let mut ctx = Ctx::new(file, source, &doc);
        validate::cost_model_errors(&errors, cost_model, &mut ctx);
        ctx.diagnostics.sort_by_key(|d| (d.line, d.column));
        ctx.diagnostics
    })
}

pub use schema::json_schema;

/// Reads the TOML document `source` (shown as `file`) as a `T` the way a spec is read:
/// every problem in one run, each located with its snippet, unknown keys with a
/// did-you-mean, type errors in words. Also when there are problems, the value as far as it
/// could be read (each value that could not left out: `T`'s defaults must stand in), so
/// that the caller's rules still check the rest; `None` when nothing usable was read. The
/// daemon's config is read with it.
pub fn read_toml<T: DeserializeOwned>(source: &str, file: &str) -> (Option<T>, Vec<Diagnostic>) {
    let (doc, syntax) = DeTable::parse_recoverable(source);
    let mut ctx = Ctx::new(file, source, &doc);
    if ctx.syntax_errors(syntax) {
        return (None, ctx.diagnostics);
    }
    let whole = Spanned::new(doc.span(), DeValue::Table(doc.get_ref().clone()));
    let read = ctx.deserialize::<T>(&whole, &FieldPath::root());
    ctx.diagnostics.sort_by_key(|d| (d.line, d.column));
    (read, ctx.diagnostics)
}

/// Whether the TOML document `source` writes `key` (dotted).
fn has_key(source: &str, key: &str) -> bool {
    let (doc, _) = DeTable::parse_recoverable(source);
    let path = key.split('.').fold(FieldPath::root(), |p, k| p.key(k));
    locate_key(doc.get_ref(), &path).is_some()
}

/// A problem with the value of `key` (dotted, e.g. `pool.nats`) in the TOML document
/// `source` (shown as `file`), located at the value (at the closest enclosing table when
/// the key is not written).
pub fn diagnostic_at_key(
    source: &str,
    file: &str,
    key: &str,
    message: String,
    help: Option<String>,
) -> Diagnostic {
    let (doc, _) = DeTable::parse_recoverable(source);
    let path = key.split('.').fold(FieldPath::root(), |p, k| p.key(k));
    let span = locate(doc.get_ref(), doc.span(), &path);
    Diagnostic::new(file, source, Some(span), key.to_string(), message).with_help(help)
}

/// Collects diagnostics while a spec is read.
pub(crate) struct Ctx<'a> {
    file: &'a str,
    source: &'a str,
    doc: &'a DeTable<'a>,
    root: std::ops::Range<usize>,
    diagnostics: Vec<Diagnostic>,
    /// `[[models]]` entries that did not deserialize (their problems are reported; they
    /// stand in `RawSpec::models` as defaults, which the model rules skip, so that the other
    /// models are still checked at their own indices).
    failed_models: Vec<usize>,
    /// Values that could not be read (a wrong type, an unknown variant or key): taken out
    /// of the document so the rest still reads, their fields (and everything inside)
    /// unknown. A rule never reports at one of them (the reading error stands), and rules
    /// relating fields skip the unknown ones: one mistake, one error.
    unreadable: Vec<FieldPath>,
    /// Fields a rule reported (as the file numbers them): known but wrong, so the rules
    /// that relate them to other fields skip them rather than report the same cause again.
    wrong: Vec<FieldPath>,
    /// Elements taken out of arrays, by the array's path as written (original indices,
    /// sorted): the rules see the arrays without them and number their elements afresh,
    /// and [`Ctx::error`] numbers them back as the file does.
    removed: Vec<(FieldPath, Vec<usize>)>,
}

impl<'a> Ctx<'a> {
    /// A context for `source` (shown as `file`), parsed as `doc`.
    fn new(file: &'a str, source: &'a str, doc: &'a Spanned<DeTable<'a>>) -> Self {
        Ctx {
            file,
            source,
            doc: doc.get_ref(),
            root: doc.span(),
            diagnostics: Vec::new(),
            failed_models: Vec::new(),
            unreadable: Vec::new(),
            wrong: Vec::new(),
            removed: Vec::new(),
        }
    }

    /// Reports the document's TOML syntax errors; whether there were any (then nothing
    /// else can be read).
    fn syntax_errors(&mut self, errors: Vec<toml::de::Error>) -> bool {
        let any = !errors.is_empty();
        for e in errors {
            self.push(
                e.span(),
                FieldPath::root(),
                format!("invalid TOML: {}", e.message().trim()),
                None,
            );
        }
        any
    }

    /// Whether `[[models]]` entry `i` did not deserialize.
    pub(crate) fn model_failed(&self, i: usize) -> bool {
        self.failed_models.contains(&i)
    }

    pub(crate) fn file(&self) -> &str {
        self.file
    }

    /// Whether the value at `field` is usable by a rule relating it to others: it (and all
    /// inside it) could be read, and no rule has reported it (or anything inside it) wrong.
    /// `field` is numbered as the rules see the arrays (see [`Ctx::removed`]).
    pub(crate) fn fine(&self, field: &FieldPath) -> bool {
        let field = self.as_written(field);
        !self
            .unreadable
            .iter()
            .any(|u| field.within(u) || u.within(&field))
            && !self.wrong.iter().any(|w| w.within(&field))
    }

    /// Whether the value at `field` could not be read and no rule reported it: it was
    /// taken out, and what stands in its place is the default — a preset's value, in a
    /// `[[models]]` entry with a preset.
    pub(crate) fn dropped(&self, field: &FieldPath) -> bool {
        let field = self.as_written(field);
        self.unreadable.iter().any(|u| field.within(u))
            && !self.wrong.iter().any(|w| w.within(&field))
    }

    /// Adds `text` to the help of the problems reported at `field` (what a rule that
    /// needed the value did instead of checking).
    pub(crate) fn add_help(&mut self, field: &FieldPath, text: &str) {
        let field = self.as_written(field).to_string();
        for d in self.diagnostics.iter_mut().filter(|d| d.field == field) {
            d.help = Some(match d.help.take() {
                Some(h) => format!("{h}; {text}"),
                None => text.to_string(),
            });
        }
    }

    /// Whether every one of `fields` is [`Ctx::fine`].
    pub(crate) fn all_fine(&self, fields: &[FieldPath]) -> bool {
        fields.iter().all(|f| self.fine(f))
    }

    /// `field` as the file numbers it: array indices counted with the elements that were
    /// taken out for not reading.
    fn as_written(&self, field: &FieldPath) -> FieldPath {
        let mut out = FieldPath::root();
        for seg in &field.0 {
            let seg = match seg {
                Seg::Index(i) => {
                    let gone = self
                        .removed
                        .iter()
                        .find(|(p, _)| *p == out)
                        .map_or(&[][..], |(_, g)| g.as_slice());
                    Seg::Index(original_index(*i, gone))
                }
                Seg::Key(k) => Seg::Key(k.clone()),
            };
            out.0.push(seg);
        }
        out
    }

    /// Whether the spec has a value at `field`.
    pub(crate) fn has_field(&self, field: &FieldPath) -> bool {
        locate_key(self.doc, field).is_some()
    }

    fn push(
        &mut self,
        span: Option<std::ops::Range<usize>>,
        field: FieldPath,
        message: String,
        help: Option<String>,
    ) {
        let span = span.or_else(|| Some(locate(self.doc, self.root.clone(), &field)));
        let d = Diagnostic::new(self.file, self.source, span, field.to_string(), message)
            .with_help(help);
        if !self.diagnostics.contains(&d) {
            self.diagnostics.push(d);
        }
    }

    /// Reports a problem a rule found with the value at `field` (numbered as the rules see
    /// the arrays), unless the value could not be read at all: that is already reported.
    pub(crate) fn error(
        &mut self,
        field: &FieldPath,
        message: impl Into<String>,
        help: Option<String>,
    ) {
        self.report(field, message.into(), help, true);
    }

    /// Reports that the value at `field` disagrees with another field's (`hidden` with
    /// `heads`): each value is still known, so the other rules that relate it still apply.
    pub(crate) fn mismatch(
        &mut self,
        field: &FieldPath,
        message: impl Into<String>,
        help: Option<String>,
    ) {
        self.report(field, message.into(), help, false);
    }

    fn report(&mut self, field: &FieldPath, message: String, help: Option<String>, wrong: bool) {
        let field = self.as_written(field);
        if self.unreadable.iter().any(|u| field.within(u)) {
            return;
        }
        if wrong && !self.wrong.contains(&field) {
            self.wrong.push(field.clone());
        }
        self.push(None, field, message, help);
    }

    /// Deserializes `value` (at `path`), reporting *every* problem in it, not only serde's
    /// first: after each error the offending key or element is taken out (and marked
    /// unreadable) and the rest deserialized again (a field left out takes its default),
    /// until it deserializes — what is returned, so that the rules still check what could
    /// be read — or the error cannot be taken out (a missing field, a wrong type of the
    /// whole value): `None`.
    fn deserialize<T: DeserializeOwned>(
        &mut self,
        value: &Spanned<DeValue<'_>>,
        path: &FieldPath,
    ) -> Option<T> {
        let mut value = value.clone();
        // Elements taken out of arrays, by the array's path as written (original indices),
        // so that later errors name the elements as the file numbers them.
        let mut removed: Vec<(FieldPath, Vec<usize>)> = Vec::new();
        // Unknown keys taken out, by their table's path: a "missing field" that one of them
        // misspells is the same mistake, not a second one.
        let mut unknown_keys: Vec<(Vec<Seg>, String)> = Vec::new();
        let mut read = None;
        for _ in 0..MAX_ERRORS_PER_VALUE {
            let de = ValueDeserializer::from(value.clone());
            let e = match serde_path_to_error::deserialize::<_, T>(de) {
                Ok(v) => {
                    read = Some(v);
                    break;
                }
                Err(e) => e,
            };
            // The path inside `value` as it is now, and as the file numbers it.
            let mut now: Vec<Seg> = Vec::new();
            let mut field = path.clone();
            for seg in e.path().iter() {
                let seg = match seg {
                    serde_path_to_error::Segment::Seq { index } => Seg::Index(*index),
                    serde_path_to_error::Segment::Map { key }
                    | serde_path_to_error::Segment::Enum { variant: key } => Seg::Key(key.clone()),
                    serde_path_to_error::Segment::Unknown => continue,
                };
                let original = match &seg {
                    Seg::Index(i) => {
                        let gone = removed
                            .iter()
                            .find(|(p, _)| *p == field)
                            .map_or(&[][..], |(_, g)| g.as_slice());
                        Seg::Index(original_index(*i, gone))
                    }
                    Seg::Key(k) => Seg::Key(k.clone()),
                };
                now.push(seg);
                field.0.push(original);
            }
            let inner = e.into_inner();
            let message = inner.message().trim().to_string();
            if let Some(missing) = missing_field_name(&message)
                && unknown_keys
                    .iter()
                    .any(|(at, k)| *at == now && did_you_mean(k, [missing]).is_some())
            {
                self.unreadable.push(field);
                break;
            }
            // An untagged value (an area budget, an axis) that is a table: serde says only
            // that no variant matched; reading it as the table it must be says what is wrong
            // with it, key by key.
            if let Some(sub) = value_at(&value, &now)
                && sub.get_ref().as_table().is_some()
                && self.explain_table(&message, sub, &field)
            {
                self.unreadable.push(field.clone());
                if !take_out(value.get_mut(), &now) {
                    break;
                }
                continue;
            }
            let unknown = unknown_field_name(&message).map(str::to_string);
            let (message, help, span) = match explain_unknown_field(&message, &field, self.doc) {
                Some(explained) => explained,
                None => {
                    let (message, mut help) = explain_type_error(&message, &field);
                    // A string that is not one of the choices the message quotes: the
                    // nearest of them (`"ful"` → `"full"`).
                    if help.is_none()
                        && let Some(sub) = value_at(&value, &now)
                        && let Some(found) = sub.get_ref().as_str()
                    {
                        let choices: Vec<&str> = message
                            .split('"')
                            .skip(1)
                            .step_by(2)
                            .filter(|c| *c != found)
                            .collect();
                        help = did_you_mean(found, choices.iter().copied())
                            .map(|near| format!("did you mean `{near}`?"));
                    }
                    (message, help, inner.span())
                }
            };
            self.push(span, field.clone(), message, help);
            // An unknown key is reported and taken out; the table it was in reads as it
            // is without it (its other values stand, what the key meant to set has its
            // default), so the rules relating that table to others still run: one
            // misspelt key must not silence every check of a model or a plan.
            let is_unknown = unknown.is_some();
            if !is_unknown {
                self.unreadable.push(field.clone());
            }
            // Take the offending part out and try again.
            let mut target = now.clone();
            let mut target_field = field.clone();
            if let Some(name) = unknown {
                // serde_path_to_error may or may not have pushed the unknown key itself.
                if !matches!(target.last(), Some(Seg::Key(k)) if *k == name) {
                    target.push(Seg::Key(name.clone()));
                    target_field = target_field.key(&name);
                }
                unknown_keys.push((target[..target.len() - 1].to_vec(), name));
            }
            if !take_out(value.get_mut(), &target) {
                break;
            }
            if !is_unknown {
                self.unreadable.push(target_field.clone());
            }
            if let (Some(Seg::Index(_)), Some(Seg::Index(o))) =
                (target.last(), target_field.0.last())
            {
                let array = FieldPath(target_field.0[..target_field.0.len() - 1].to_vec());
                match removed.iter_mut().find(|(p, _)| *p == array) {
                    Some((_, gone)) => {
                        gone.push(*o);
                        gone.sort_unstable();
                    }
                    None => removed.push((array, vec![*o])),
                }
            }
        }
        self.removed.extend(removed);
        read
    }

    /// Reports what is wrong with `table` (at `field`) as the table an untagged value of
    /// this `message` must be; whether it reported anything.
    fn explain_table(
        &mut self,
        message: &str,
        table: &Spanned<DeValue<'_>>,
        field: &FieldPath,
    ) -> bool {
        let before = self.diagnostics.len();
        if message == raw::AREA_BUDGET_EXPECTING {
            let _ = self.deserialize::<raw::RawReferenceConfig>(table, field);
        } else if message == raw::AXIS_EXPECTING {
            let _ = self.deserialize::<raw::RawRange<serde::de::IgnoredAny>>(table, field);
        }
        self.diagnostics.len() > before
    }

    /// Deserializes the document section by section. A section that does not deserialize
    /// is replaced by its default and named in the returned list, so that the rules of the
    /// other sections can still be checked (and the failed ones skipped).
    fn sections(&mut self) -> (RawSpec, Vec<&'static str>) {
        let doc = self.doc;
        let get = |k: &str| entry(doc, k);
        for (key, _) in doc.iter() {
            let k = key.get_ref().as_ref();
            if !TOP_LEVEL_KEYS.contains(&k) {
                let help = match did_you_mean(k, TOP_LEVEL_KEYS) {
                    Some(s) => format!(
                        "did you mean `{s}`? valid keys: {}",
                        TOP_LEVEL_KEYS.join(", ")
                    ),
                    None => format!("valid keys: {}", TOP_LEVEL_KEYS.join(", ")),
                };
                self.push(
                    Some(key.span()),
                    FieldPath::root().key(k),
                    format!("unknown key `{k}`"),
                    Some(help),
                );
            }
        }
        let root = FieldPath::root();
        let mut failed = Vec::new();
        for (k, what) in [
            (
                "schema_version",
                "every spec starts with `schema_version = 1`",
            ),
            (
                "name",
                "give the search a name, e.g. `name = \"gpt3-175b\"`",
            ),
            (
                "models",
                "add at least one `[[models]]` table, e.g. `preset = \"gpt3-175b\"`",
            ),
        ] {
            if get(k).is_none() {
                self.push(
                    Some(0..0),
                    root.key(k),
                    format!("missing `{k}`: {what}"),
                    None,
                );
                failed.push(k);
            }
        }
        let schema_version = get("schema_version")
            .and_then(|v| self.deserialize::<u32>(v, &root.key("schema_version")));
        let name = get("name").and_then(|v| self.deserialize::<String>(v, &root.key("name")));
        let description = match get("description") {
            Some(v) => self.deserialize::<String>(v, &root.key("description")),
            None => None,
        };
        let models = get("models").and_then(|v| match v.get_ref().as_array() {
            Some(items) => {
                let mut parsed = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    match self.deserialize::<RawModel>(item, &root.key("models").index(i)) {
                        Some(m) => parsed.push(m),
                        None => {
                            self.failed_models.push(i);
                            parsed.push(RawModel::default());
                        }
                    }
                }
                Some(parsed)
            }
            None => {
                self.error(
                    &root.key("models"),
                    "`models` must be an array of tables",
                    Some("write each model as a `[[models]]` table".into()),
                );
                None
            }
        });
        let mut section = |ok: bool, key: &'static str| {
            if !ok && !failed.contains(&key) {
                failed.push(key);
            }
        };
        section(schema_version.is_some(), "schema_version");
        section(name.is_some(), "name");
        section(models.is_some(), "models");
        let training = self.optional_section("training", &mut failed);
        let cluster = self.optional_section("cluster", &mut failed);
        let search = self.optional_section("search", &mut failed);
        let cost_model = self.optional_section("cost_model", &mut failed);
        let accelerator = self.optional_section("accelerator", &mut failed);
        let plan = self.optional_section("plan", &mut failed);
        let raw = RawSpec {
            schema_version: schema_version.unwrap_or(1),
            name: name.unwrap_or_default(),
            description,
            models: models.unwrap_or_default(),
            training,
            cluster,
            search,
            cost_model,
            accelerator,
            plan,
        };
        (raw, failed)
    }

    fn optional_section<T: DeserializeOwned + Default>(
        &mut self,
        key: &'static str,
        failed: &mut Vec<&'static str>,
    ) -> T {
        let doc = self.doc;
        match doc.iter().find(|(k, _)| k.get_ref().as_ref() == key) {
            Some((_, v)) => self
                .deserialize(v, &FieldPath::root().key(key))
                .unwrap_or_else(|| {
                    failed.push(key);
                    T::default()
                }),
            None => T::default(),
        }
    }
}

/// The most problems reported in one value (a section or a model): beyond, the file is
/// not a spec with typos but something else.
const MAX_ERRORS_PER_VALUE: usize = 50;

/// The index in the file of element `i` of an array from which the elements `gone`
/// (indices in the file, sorted) were taken out.
fn original_index(i: usize, gone: &[usize]) -> usize {
    let mut o = i;
    for &g in gone {
        if g <= o {
            o += 1;
        }
    }
    o
}

/// Takes the value at `path` (relative to `value`) out of its table or array; `false` if
/// there is nothing to take out (the path is the value itself, or not there).
fn take_out(value: &mut DeValue<'_>, path: &[Seg]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = value;
    for seg in parents {
        at = match (seg, at) {
            (Seg::Key(k), DeValue::Table(t)) => {
                match t
                    .iter_mut()
                    .find(|(key, _)| key.get_ref().as_ref() == k.as_str())
                {
                    Some((_, v)) => v.get_mut(),
                    None => return false,
                }
            }
            (Seg::Index(i), DeValue::Array(a)) => match a.get_mut(*i) {
                Some(v) => v.get_mut(),
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, at) {
        (Seg::Key(k), DeValue::Table(t)) => {
            let before = t.len();
            let kept: DeTable<'_> = t
                .iter()
                .filter(|(key, _)| key.get_ref().as_ref() != k.as_str())
                .map(|(key, v)| (key.clone(), v.clone()))
                .collect();
            *t = kept;
            t.len() < before
        }
        (Seg::Index(i), DeValue::Array(a)) if *i < a.len() => {
            let kept: toml::de::DeArray<'_> = a
                .iter()
                .enumerate()
                .filter(|(j, _)| j != i)
                .map(|(_, v)| v.clone())
                .collect();
            *a = kept;
            true
        }
        _ => false,
    }
}

/// The value at `path` inside `value`.
fn value_at<'v, 'i>(
    value: &'v Spanned<DeValue<'i>>,
    path: &[Seg],
) -> Option<&'v Spanned<DeValue<'i>>> {
    let mut at = value;
    for seg in path {
        at = match (seg, at.get_ref()) {
            (Seg::Key(k), DeValue::Table(t)) => t
                .iter()
                .find(|(key, _)| key.get_ref().as_ref() == k.as_str())
                .map(|(_, v)| v)?,
            (Seg::Index(i), DeValue::Array(a)) => a.get(*i)?,
            _ => return None,
        };
    }
    Some(at)
}

/// The field serde calls missing in `message`, if it does.
fn missing_field_name(message: &str) -> Option<&str> {
    message
        .strip_prefix("missing field `")?
        .split_once('`')
        .map(|(name, _)| name)
}

/// The field serde calls unknown in `message`, if it does.
fn unknown_field_name(message: &str) -> Option<&str> {
    message
        .strip_prefix("unknown field `")?
        .split_once('`')
        .map(|(name, _)| name)
}

/// serde's type errors in words for people who write specs: quantities need their unit,
/// counts are whole numbers, switches are true or false.
fn explain_type_error(message: &str, field: &FieldPath) -> (String, Option<String>) {
    let key = field
        .0
        .iter()
        .rev()
        .find_map(|s| match s {
            Seg::Key(k) => Some(k.as_str()),
            Seg::Index(_) => None,
        })
        .unwrap_or("");
    // "invalid type: integer `80`, expected a string"
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        let (found, expected) = rest.split_once(", expected ").unwrap_or((rest, ""));
        let number = found
            .strip_prefix("integer `")
            .or_else(|| found.strip_prefix("floating point `"))
            .and_then(|r| r.strip_suffix('`'));
        if let (Some(n), true) = (number, expected.starts_with("a string")) {
            let unit = unit_example(key);
            return (
                format!("`{key}` is a quantity: it needs a unit"),
                Some(format!(
                    "write it as a string with its unit, e.g. `{key} = \"{n} {unit}\"`"
                )),
            );
        }
        if expected.starts_with("a sequence") {
            let value = number.map_or_else(|| "…".to_string(), str::to_string);
            let example = match pattern_unit(key) {
                Some(unit) => format!("`{key} = [\"{value} {unit}\"]`"),
                None => format!("`{key} = [{value}]`"),
            };
            return (
                format!("`{key}` is a list of values to try"),
                Some(format!("write it in brackets, e.g. {example}")),
            );
        }
        let wanted = match expected {
            e if e.starts_with("u8")
                || e.starts_with("u16")
                || e.starts_with("u32")
                || e.starts_with("u64")
                || e.starts_with("usize") =>
            {
                "a whole number"
            }
            e if e.starts_with("f32") || e.starts_with("f64") => "a number",
            e if e.starts_with("a boolean") => "true or false",
            e if e.starts_with("a string") => "a string in quotes",
            e if e.starts_with("a sequence") => "a list, e.g. [1, 2]",
            e if e.starts_with("struct") || e.starts_with("a map") => "a table",
            e => e,
        };
        let found = found
            .replace("string ", "the string ")
            .replace("integer ", "the number ")
            .replace("floating point ", "the number ");
        let help = (wanted == "a whole number" && found.starts_with("the string"))
            .then(|| "write the number without quotes".to_string());
        return (format!("`{key}` must be {wanted}, not {found}"), help);
    }
    // "unknown variant `prove`, expected one of `converge`, `exhaustive`, `proven`"
    if let Some(rest) = message.strip_prefix("unknown variant `")
        && let Some((found, expected)) = rest.split_once("`, expected ")
    {
        let variants: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        let help = did_you_mean(found, variants.iter().copied())
            .map(|near| format!("did you mean `{near}`?"));
        return (
            format!(
                "`{key}` cannot be `{found}`: it is one of {}",
                quoted(&variants)
            ),
            help,
        );
    }
    // "invalid value: integer `-4`, expected u64"
    if let Some(rest) = message.strip_prefix("invalid value: ") {
        let (found, expected) = rest.split_once(", expected ").unwrap_or((rest, ""));
        if expected.starts_with('u') {
            let found = found.replace("integer ", "");
            return (
                format!("`{key}` must be a whole number of at least 0, not {found}"),
                None,
            );
        }
    }
    (message.to_string(), None)
}

/// `` `a`, `b` or `c` ``.
fn quoted(words: &[&str]) -> String {
    let q: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
    match q.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => q.join(""),
    }
}

/// The unit of the quantity `key` names, if it names one.
fn pattern_unit(key: &str) -> Option<&'static str> {
    let quantity = key == "hbm"
        || key == "buffer"
        || key.contains("bandwidth")
        || key.contains("latency")
        || key == "clock"
        || key == "peak_flops"
        || key.contains("area");
    quantity.then(|| unit_example(key))
}

/// A unit that fits the quantity `key` names, for examples in help texts.
fn unit_example(key: &str) -> &'static str {
    match key {
        k if k.contains("bandwidth") => "GB/s",
        k if k.contains("clock") => "GHz",
        k if k.contains("flops") => "TFLOP/s",
        k if k.contains("area") => "mm²",
        k if k.contains("latency") || k.contains("time") => "µs",
        k if k.contains("energy") => "pJ",
        "buffer" => "MiB",
        _ => "GiB",
    }
}

/// Turns serde's "unknown field `x`, expected one of `a`, `b`" into a message with a
/// suggestion, located at the key.
fn explain_unknown_field(
    message: &str,
    field: &FieldPath,
    doc: &DeTable<'_>,
) -> Option<(String, Option<String>, Option<std::ops::Range<usize>>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (name, expected) = rest.split_once('`')?;
    let valid: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let help = match did_you_mean(name, valid.iter().copied()) {
        Some(s) => format!("did you mean `{s}`? valid keys here: {}", valid.join(", ")),
        None if valid.is_empty() => "this table takes no keys".to_string(),
        None => format!("valid keys here: {}", valid.join(", ")),
    };
    // serde_path_to_error may or may not have pushed the unknown key itself.
    let key_path = match field.0.last() {
        Some(Seg::Key(k)) if k == name => field.clone(),
        _ => field.key(name),
    };
    let span = locate_key(doc, &key_path);
    Some((format!("unknown key `{name}`"), Some(help), span))
}

#[cfg(test)]
mod tests;
