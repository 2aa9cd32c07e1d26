//! The native half of the `archplace` Python package (`archplace._archplace`): the spec
//! validator and `archplace estimate`'s work, in process, through the same functions the
//! CLI calls (`archplace_spec::load`, `archplace_job::estimated::estimate`). It hands
//! Python JSON text — `estimate --json`'s document, the validator's located problems — and
//! `archplace/__init__.py` makes objects of it: serde_json writes the shortest text that
//! reads back as the same double, and Python's `json` reads it so, so the numbers are the
//! CLI's to the bit.
//!
//! The GIL is released while Rust works: other Python threads run meanwhile.

use archplace_job::estimated::{self, EstimateError, EstimateOptions};
use archplace_plugin_host::{Host, HostOptions};
use archplace_spec::{Diagnostic, Spec};
use pyo3::exceptions::{PyException, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

pyo3::create_exception!(
    _archplace,
    NativeSpecError,
    PyException,
    "A spec with problems: args are (the problems rendered as the CLI prints them, their JSON list)."
);

/// The plugin hosts of this process by their plugin folders: each made once, so that its
/// compiled plugins and its memo of their answers serve every later call.
static HOSTS: Mutex<BTreeMap<Vec<PathBuf>, Arc<Host>>> = Mutex::new(BTreeMap::new());

/// The host that searches `dirs` first, then the default folders (as the CLI's
/// `--plugin-dir`).
fn host(dirs: Vec<PathBuf>) -> PyResult<Arc<Host>> {
    let mut hosts = HOSTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(h) = hosts.get(&dirs) {
        return Ok(h.clone());
    }
    let mut options = HostOptions::defaults();
    let mut all = dirs.clone();
    all.extend(
        options
            .plugin_dirs
            .into_iter()
            .filter(|d| !dirs.contains(d)),
    );
    options.plugin_dirs = all;
    let h = Arc::new(
        Host::new(options)
            .map_err(|e| PyRuntimeError::new_err(format!("starting the plugin host: {e}")))?,
    );
    hosts.insert(dirs, h.clone());
    Ok(h)
}

/// The problems of a spec as Python's `NativeSpecError(rendered, json)`.
fn spec_error(text: &str, diagnostics: &[Diagnostic]) -> PyErr {
    let rendered: String = diagnostics.iter().map(|d| d.render(text)).collect();
    let json = serde_json::to_string(diagnostics).unwrap_or_else(|_| "[]".into());
    NativeSpecError::new_err((rendered, json))
}

/// A spec from a file (`path`) or from TOML text (`text`, shown as `name` in diagnostics),
/// checked with the plugins it names (every problem in one report), or its problems.
fn read_spec(
    path: Option<PathBuf>,
    text: Option<String>,
    name: &str,
    host: &Host,
) -> PyResult<Spec> {
    let cancel = Arc::default();
    match (path, text) {
        (Some(p), _) => archplace_spec::load_with_plugins(&p, host, cancel).map_err(|e| match e {
            archplace_spec::LoadError::Invalid {
                text, diagnostics, ..
            } => spec_error(&text, &diagnostics),
            other => PyRuntimeError::new_err(other.to_string()),
        }),
        (None, Some(t)) => archplace_spec::parse_with_plugins(&t, name, host, cancel)
            .map_err(|d| spec_error(&t, &d)),
        (None, None) => Err(PyRuntimeError::new_err("give a spec path or text")),
    }
}

/// Validates a spec: `None` when it is valid, else raises `NativeSpecError`.
#[pyfunction]
#[pyo3(signature = (path, text, name, plugin_dirs))]
fn validate(
    py: Python<'_>,
    path: Option<PathBuf>,
    text: Option<String>,
    name: String,
    plugin_dirs: Vec<PathBuf>,
) -> PyResult<()> {
    py.detach(|| {
        let h = host(plugin_dirs)?;
        read_spec(path, text, &name, &h).map(|_| ())
    })
}

/// Estimates a spec's step as `archplace estimate` does: returns `(document, text,
/// feasible)`, the document `estimate --json`'s JSON and the text its report.
#[pyfunction]
#[pyo3(signature = (path, text, name, calibration, plugin_dirs))]
fn estimate(
    py: Python<'_>,
    path: Option<PathBuf>,
    text: Option<String>,
    name: String,
    calibration: Option<PathBuf>,
    plugin_dirs: Vec<PathBuf>,
) -> PyResult<(String, String, bool)> {
    py.detach(|| {
        let h = host(plugin_dirs)?;
        let spec = read_spec(path, text, &name, &h)?;
        let options = EstimateOptions {
            calibration: calibration.as_deref(),
            ..EstimateOptions::default()
        };
        let e = estimated::estimate(&spec, h.as_ref(), options).map_err(|e| match e {
            EstimateError::CostModel(d) => spec_error(&spec.source_text, &d),
            other => PyRuntimeError::new_err(other.to_string()),
        })?;
        let document = serde_json::to_string(&e.document())
            .map_err(|err| PyRuntimeError::new_err(err.to_string()))?;
        Ok((document, e.render(), e.feasible()))
    })
}

/// TOML text of a spec given as a dict (its JSON): what `archplace.estimate({...})` and
/// `Spec.with_values` validate, located in this text.
#[pyfunction]
fn toml_text(json: &str) -> PyResult<String> {
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| PyRuntimeError::new_err(format!("the spec's JSON: {e}")))?;
    toml::to_string(&value).map_err(|e| {
        PyValueError::new_err(format!(
            "the spec cannot be written as TOML ({e}); a spec is a table of tables, arrays, strings, numbers and booleans, without None"
        ))
    })
}

/// The native module.
#[pymodule]
fn _archplace(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("NativeSpecError", m.py().get_type::<NativeSpecError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(estimate, m)?)?;
    m.add_function(wrap_pyfunction!(toml_text, m)?)?;
    Ok(())
}
