//! Search specs: the TOML files people write to describe a search.
//!
//! Reading a spec never stops at the first problem where it can go on: syntax errors are
//! collected with recovery, each section is deserialized on its own (an unknown key in
//! `[training]` does not hide a bad value in `[cluster]`), and the rules that relate fields
//! (a micro-batch that must divide the global batch, heads that must divide by the
//! tensor-parallel width, ...) are all checked and reported together. Every problem names
//! the file, line, column and field, and says what would be valid.

pub mod diagnostic;
pub mod raw;
mod validate;

use archplace_engine::model::ModelConfig;
use archplace_engine::space::SpaceSpec;
use archplace_engine::step::StepPlan;
use archplace_engine::training::{Baseline, Cluster, Training};
use archplace_plugin_sdk::AcceleratorConfig;
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
    archplace_plugin_host::files::read_regular(path, MAX_SPEC_BYTES).map_err(|e| match e {
        archplace_plugin_host::files::ReadError::Io(e) => e,
        other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
    })
}

/// A model to train, with an optional fixed strategy to compare against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    pub config: ModelConfig,
    pub baseline: Option<Baseline>,
}

/// Which cost models to use and their parameters (values as written in the spec; each
/// model validates its own). The type belongs to the plugin host, which resolves it.
pub use crate::cost::CostModelSpec;

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
    let bytes = read_input(path).map_err(|source| LoadError::Io {
        path: shown.clone(),
        source,
    })?;
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let offset = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
            let d = Diagnostic::new(
                &shown,
                &text,
                Some(offset..offset + 1),
                String::new(),
                "the file is not valid UTF-8".into(),
            );
            return Err(LoadError::Invalid {
                path: shown,
                text,
                diagnostics: vec![d],
            });
        }
    };
    parse(&text, &shown).map_err(|diagnostics| LoadError::Invalid {
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
    let (doc, syntax) = DeTable::parse_recoverable(source);
    let mut ctx = Ctx {
        file,
        source,
        doc: doc.get_ref(),
        root: doc.span(),
        diagnostics: Vec::new(),
    };
    if !syntax.is_empty() {
        for e in syntax {
            ctx.push(
                e.span(),
                FieldPath::root(),
                format!("invalid TOML: {}", e.message().trim()),
                None,
            );
        }
        return Err(ctx.diagnostics);
    }
    let (raw, failed) = ctx.sections();
    let spec = validate::validate(&raw, &failed, &mut ctx, source);
    match spec {
        Some(spec) if ctx.diagnostics.is_empty() => Ok(spec),
        _ => {
            // In file order, as a reader fixes them.
            ctx.diagnostics.sort_by_key(|d| (d.line, d.column));
            Err(ctx.diagnostics)
        }
    }
}

impl Spec {
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
    models: &dyn crate::cost::CostModelSource,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<crate::cost::CostModels, Vec<Diagnostic>> {
    models.resolve(&spec.cost_model, cancel).map_err(|errors| {
        let source = spec.source_text.as_str();
        let (doc, _) = DeTable::parse_recoverable(source);
        let mut ctx = Ctx {
            file: &spec.source_file,
            source,
            doc: doc.get_ref(),
            root: doc.span(),
            diagnostics: Vec::new(),
        };
        validate::cost_model_errors(&errors, &spec.cost_model, &mut ctx);
        ctx.diagnostics.sort_by_key(|d| (d.line, d.column));
        ctx.diagnostics
    })
}

/// The JSON Schema of spec files.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(RawSpec)).unwrap_or(serde_json::Value::Null)
}

/// Collects diagnostics while a spec is read.
pub(crate) struct Ctx<'a> {
    file: &'a str,
    source: &'a str,
    doc: &'a DeTable<'a>,
    root: std::ops::Range<usize>,
    diagnostics: Vec<Diagnostic>,
}

impl Ctx<'_> {
    pub(crate) fn file(&self) -> &str {
        self.file
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

    /// Reports a problem with the value at `field`.
    pub(crate) fn error(
        &mut self,
        field: &FieldPath,
        message: impl Into<String>,
        help: Option<String>,
    ) {
        self.push(None, field.clone(), message.into(), help);
    }

    fn deserialize<T: DeserializeOwned>(
        &mut self,
        value: &Spanned<DeValue<'_>>,
        path: &FieldPath,
    ) -> Option<T> {
        let de = ValueDeserializer::from(value.clone());
        match serde_path_to_error::deserialize::<_, T>(de) {
            Ok(v) => Some(v),
            Err(e) => {
                let mut field = path.clone();
                for seg in e.path().iter() {
                    match seg {
                        serde_path_to_error::Segment::Seq { index } => {
                            field.0.push(Seg::Index(*index))
                        }
                        serde_path_to_error::Segment::Map { key } => {
                            field.0.push(Seg::Key(key.clone()))
                        }
                        serde_path_to_error::Segment::Enum { variant } => {
                            field.0.push(Seg::Key(variant.clone()))
                        }
                        serde_path_to_error::Segment::Unknown => {}
                    }
                }
                let inner = e.into_inner();
                let message = inner.message().trim().to_string();
                let (message, help, span) = explain_unknown_field(&message, &field, self.doc)
                    .unwrap_or((message, None, inner.span()));
                self.push(span, field, message, help);
                None
            }
        }
    }

    /// Deserializes the document section by section. A section that does not deserialize
    /// is replaced by its default and named in the returned list, so that the rules of the
    /// other sections can still be checked (and the failed ones skipped).
    fn sections(&mut self) -> (RawSpec, Vec<&'static str>) {
        let doc = self.doc;
        let get = |k: &str| {
            doc.iter()
                .find(|(key, _)| key.get_ref().as_ref() == k)
                .map(|(_, v)| v)
        };
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
                let parsed: Vec<Option<RawModel>> = items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        self.deserialize::<RawModel>(item, &root.key("models").index(i))
                    })
                    .collect();
                parsed.into_iter().collect::<Option<Vec<_>>>()
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
