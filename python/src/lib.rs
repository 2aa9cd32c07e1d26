//! The native half of the `archplace` Python package (`archplace._archplace`): the spec
//! validator, `archplace estimate`'s, `archplace run`'s and `archplace calibrate`'s work,
//! in process, through the same functions the CLI calls (`archplace_spec::load_with_plugins`,
//! `archplace_job::estimated::estimate`, `archplace_job::prepare`,
//! `archplace_calibrate::calibrate`). It hands
//! Python JSON text — `estimate --json`'s document, the validator's located problems — and
//! `archplace/__init__.py` makes objects of it: serde_json writes the shortest text that
//! reads back as the same double, and Python's `json` reads it so, so the numbers are the
//! CLI's to the bit.
//!
//! The GIL is released while Rust works: other Python threads run meanwhile.

use archplace_engine::search::{Observer, Progress};
use archplace_job::estimated::{self, EstimateError, EstimateOptions};
use archplace_job::lines::ExploredLine;
use archplace_job::{RunError, Steering};
use archplace_plugin_host::{Host, HostOptions};
use archplace_spec::{Diagnostic, Spec};
use pyo3::exceptions::{PyException, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

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

/// The host's options: `dirs` first, then the default folders and cache.
fn host_options(dirs: Vec<PathBuf>) -> HostOptions {
    let mut options = HostOptions::defaults();
    let defaults = std::mem::take(&mut options.plugin_dirs);
    options.plugin_dirs = dirs.clone();
    options
        .plugin_dirs
        .extend(defaults.into_iter().filter(|d| !dirs.contains(d)));
    options
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
        let document = to_json(&e.document())?;
        Ok((document, e.render(), e.feasible()))
    })
}

/// A search event as Python's progress callback gets it: `(kind, done, total,
/// best_samples_per_second, best_area_mm2)`, `kind` "progress" or "bounding".
type Event = (&'static str, usize, usize, Option<f64>, Option<f64>);

/// The search's observer: keeps the latest event for the calling thread, which hands it to
/// Python (the search's own threads never take the GIL).
struct Watch(Mutex<Option<Event>>);

impl Observer for Watch {
    fn progress(&self, p: &Progress) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((
            "progress",
            p.evaluated,
            p.total,
            p.best_throughput_samples_per_second,
            p.best_area_um2.map(|a| a / 1e6),
        ));
    }

    fn bounded(&self, done: usize, total: usize) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(("bounding", done, total, None, None));
    }
}

/// What `search` hands back: `result.json`, `explored.jsonl`'s lines as one JSON array,
/// the summary `archplace run` prints, the plots (name, SVG) and whether it was
/// interrupted.
type Searched = (String, String, String, Vec<(String, String)>, bool);

/// Runs a search as `archplace run` does, on `threads` worker threads (default: all
/// cores), writing its result folder to `out` when given (checkpointed there, so an
/// interrupted search continues). `progress(kind, done, total, best_samples_per_second,
/// best_area_mm2)` is called on the calling thread as the search goes. Ctrl-C (a
/// `KeyboardInterrupt`) stops it at its next candidate and raises; the GIL is released
/// between reports.
#[pyfunction]
#[pyo3(signature = (path, text, name, calibration, plugin_dirs, threads, out, progress))]
#[allow(clippy::too_many_arguments)]
fn search(
    py: Python<'_>,
    path: Option<PathBuf>,
    text: Option<String>,
    name: String,
    calibration: Option<PathBuf>,
    plugin_dirs: Vec<PathBuf>,
    threads: Option<usize>,
    out: Option<PathBuf>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Searched> {
    let h = py.detach(|| host(plugin_dirs))?;
    let spec = py.detach(|| read_spec(path, text, &name, &h))?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("starting worker threads: {e}")))?;
    let cancel = Arc::new(AtomicBool::new(false));
    let prepared = py
        .detach(|| {
            archplace_job::prepare(
                &spec,
                h.as_ref(),
                pool.current_num_threads(),
                None,
                &cancel,
                calibration.as_deref(),
            )
        })
        .map_err(|e| match e {
            RunError::CostModel(d) | RunError::Memory(d) | RunError::Area(d) => {
                spec_error(&spec.source_text, &d)
            }
            other => PyRuntimeError::new_err(other.to_string()),
        })?;
    let watch = Watch(Mutex::new(None));
    let (finished, interrupted) = std::thread::scope(|s| {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // In a mutex: the wait below runs detached from Python, which needs `Sync`.
        let done_rx = Mutex::new(done_rx);
        let (pool, watch, cancel, out) = (&pool, &watch, &cancel, &out);
        let worker = s.spawn(move || {
            let r = pool.install(|| {
                prepared.run(Steering {
                    observer: watch,
                    cancel,
                    checkpoint: out.as_deref(),
                    distributor: None,
                })
            });
            let _ = done_tx.send(());
            r
        });
        // The calling thread reports and listens for Ctrl-C until the search ends.
        let mut stop: Option<PyErr> = None;
        loop {
            let ended = py.detach(|| {
                done_rx
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .recv_timeout(Duration::from_millis(100))
                    .is_ok()
            });
            let event = watch
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let (Some(cb), Some(e), None) = (&progress, event, &stop)
                && let Err(err) = cb.call1(py, e)
            {
                cancel.store(true, Ordering::SeqCst);
                stop = Some(err);
            }
            if stop.is_none()
                && let Err(err) = py.check_signals()
            {
                cancel.store(true, Ordering::SeqCst);
                stop = Some(err);
            }
            if ended {
                break;
            }
        }
        let finished = py.detach(|| worker.join());
        (finished, stop)
    });
    let finished = finished
        .map_err(|_| PyRuntimeError::new_err("the search panicked"))?
        .map_err(|e| PyRuntimeError::new_err(format!("the search failed: {e}")))?;
    if let Some(dir) = &out {
        archplace_job::folder::write(dir, &finished)
            .map_err(|e| PyRuntimeError::new_err(format!("writing the results: {e}")))?;
    }
    if let Some(err) = interrupted {
        return Err(err);
    }
    let doc = to_json(&finished.doc)?;
    let explored: Vec<ExploredLine> = finished
        .outcome
        .explored
        .iter()
        .map(ExploredLine::from)
        .collect();
    let explored = to_json(&explored)?;
    let shown = out.as_deref().map_or_else(
        || "(not written: give out=)".to_string(),
        |d| d.display().to_string(),
    );
    let summary = archplace_job::summary::render(&finished.doc, Path::new(&shown));
    let plots = archplace_job::folder::plots(&finished)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
        .into_iter()
        .map(|(n, svg)| (n.to_string(), svg))
        .collect();
    Ok((doc, explored, summary, plots, finished.doc.search.cancelled))
}

/// JSON text of a serialisable value, its failure a Python error.
fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> PyResult<String> {
    serde_json::to_string(value).map_err(|e| PyRuntimeError::new_err(e.to_string()))
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

/// Fits a calibration as `archplace calibrate` does and writes it to `output`: returns
/// `(summary, text, warnings)` — `calibrate --json`'s summary, the report it prints and
/// what the calibration's own errors say against it. `progress(line)` hears the fit's
/// steps; `date` is the provenance's (RFC 3339).
#[pyfunction]
#[pyo3(signature = (measurements, output, plugin_dirs, date, progress))]
fn calibrate(
    py: Python<'_>,
    measurements: PathBuf,
    output: PathBuf,
    plugin_dirs: Vec<PathBuf>,
    date: String,
    progress: Option<Py<PyAny>>,
) -> PyResult<(String, String, Vec<String>)> {
    py.detach(|| {
        let mut options = host_options(plugin_dirs);
        // Every evaluation opens sessions with new parameters: no memo to grow.
        options.no_memo = true;
        let host = Host::new(options)
            .map_err(|e| PyRuntimeError::new_err(format!("starting the plugin host: {e}")))?;
        let tell = |line: &str| {
            if let Some(cb) = &progress {
                // The fit goes on whatever the callback does.
                Python::attach(|py| {
                    let _ = cb.call1(py, (line,));
                });
            }
        };
        let file = archplace_calibrate::calibrate(&measurements, &host, &date, &tell)
            .map_err(|e| PyRuntimeError::new_err(format!("calibrate: {e}")))?;
        let text = file
            .to_toml()
            .map_err(|e| PyRuntimeError::new_err(format!("writing the calibration: {e}")))?;
        archplace_util::atomic::write(&output, text.as_bytes())
            .map_err(|e| PyRuntimeError::new_err(format!("writing {}: {e}", output.display())))?;
        let verdicts = archplace_spec::calibration::Calibration::parse(&text)
            .map_err(|e| PyRuntimeError::new_err(format!("reading back the calibration: {e}")))?
            .verdicts();
        let summary = to_json(&file.summary(&output))?;
        Ok((summary, file.render(), verdicts))
    })
}

/// A spec's TOML text as JSON (its tables as objects): what `archplace.Spec` holds and
/// varies; TOML's own errors located in the text.
#[pyfunction]
fn json_text(toml_text: &str, name: &str) -> PyResult<String> {
    let table: toml::Table = toml::from_str(toml_text)
        .map_err(|e| PyValueError::new_err(format!("{name}: not TOML: {e}")))?;
    to_json(&table)
}

/// The native module.
#[pymodule]
fn _archplace(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("NativeSpecError", m.py().get_type::<NativeSpecError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(estimate, m)?)?;
    m.add_function(wrap_pyfunction!(toml_text, m)?)?;
    m.add_function(wrap_pyfunction!(search, m)?)?;
    m.add_function(wrap_pyfunction!(json_text, m)?)?;
    m.add_function(wrap_pyfunction!(calibrate, m)?)?;
    Ok(())
}
