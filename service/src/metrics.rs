//! The daemon's Prometheus metrics: what exists, what each means, and how the service,
//! the engine and the plugin host feed them.
//!
//! Naming follows Prometheus's rules: one `archplace_` prefix, base units (seconds, bytes,
//! square metres — the dashboard shows mm²), `_total` for counters, and only bounded
//! labels: job states, outcomes, methods, fault kinds, rescan reasons, installed plugins,
//! and — for running searches and finished results — the spec's name and file, which the
//! number of files in the spec folder bounds. Series of a spec disappear when its search
//! ends (progress) or its file leaves the folder (results).
//!
//! Every label value that is known in advance is created at start at zero, so that a
//! dashboard or an alert sees a series (and `increase` works) before the first event.

use super::jobs::unix_seconds;
use crate::lock::Lock;
use archplace_engine::schedule::Method;
use archplace_engine::search::{Progress, ScheduleEvent};
use archplace_plugin_host::FaultKind;
use archplace_pool::metrics::PoolMetrics;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::collections::HashMap;
use std::sync::Arc;

/// The wasmtime release the plugin host is built with (pinned in the workspace manifest;
/// a test checks that the two agree).
pub const WASMTIME_VERSION: &str = "48.0.8";

/// Job states, as exported in `archplace_specs{state}`.
/// `invalid`: a spec with errors (never searched); `failed`: a search that started and
/// could not finish; `waiting_for_disk`: its results or errors could not be written, and
/// are written again every `retry_seconds`.
pub const STATES: [&str; 7] = [
    "queued",
    "running",
    "done",
    "failed",
    "invalid",
    "cancelled",
    "waiting_for_disk",
];
/// Why an entry of the spec folder is not read as a spec, as exported in
/// `archplace_specs_skipped_total{reason}` (each series from the start, at 0).
pub const SKIP_REASONS: [&str; 6] = [
    "too_large",
    "not_a_file",
    "unreadable",
    "link_outside",
    "broken_link",
    "name_not_utf8",
];

/// How a search ends, as exported in `archplace_searches_finished_total{outcome}`.
/// `invalid`: the spec never started (its errors are in `error.json`); `failed`: a search
/// that started and could not finish; `interrupted`: stopped by the daemon's shutdown,
/// searched again at the next start; `waiting_for_disk`: found, but its files could not be
/// written (they are, later, without searching again).
pub const OUTCOMES: [&str; 6] = [
    "done",
    "invalid",
    "failed",
    "cancelled",
    "interrupted",
    "waiting_for_disk",
];
/// Why the spec folder was scanned, as exported in `archplace_rescans_total{reason}`.
pub const RESCAN_REASONS: [&str; 6] = [
    "start",
    "change",
    "poll",
    "periodic",
    "watcher_error",
    "reload",
];
/// Fault kinds, as exported in `archplace_plugin_faults_total{kind}`.
pub const FAULT_KINDS: [FaultKind; 5] = [
    FaultKind::Fuel,
    FaultKind::Deadline,
    FaultKind::Memory,
    FaultKind::Trap,
    FaultKind::BadOutput,
];

const SPEC_LABELS: [&str; 2] = ["spec", "file"];

/// The version of the HiGHS library linked in.
pub fn highs_version() -> String {
    // SAFETY: the three functions take no arguments and return integer constants compiled
    // into HiGHS; they touch no state.
    #[allow(unsafe_code)]
    let (major, minor, patch) = unsafe {
        (
            highs_sys::Highs_versionMajor(),
            highs_sys::Highs_versionMinor(),
            highs_sys::Highs_versionPatch(),
        )
    };
    format!("{major}.{minor}.{patch}")
}

/// Registers `$m` in `$r` and returns it.
macro_rules! reg {
    ($r:expr, $m:expr) => {{
        let m = $m;
        $r.register(Box::new(m.clone()))?;
        m
    }};
}

/// All of the daemon's metrics, registered in one registry, by concern.
pub struct Metrics {
    registry: Registry,
    jobs: JobMetrics,
    running: RunningMetrics,
    finished: ResultMetrics,
    work: WorkMetrics,
    plugins: PluginMetrics,
    folder: FolderMetrics,
    /// The pool (`--nats`); zero without one.
    pub pool: Arc<PoolMetrics>,
}

/// Specs and searches: job states, discoveries, outcomes, the queue, durations.
struct JobMetrics {
    specs: IntGaugeVec,
    specs_discovered: IntCounter,
    specs_skipped: IntCounterVec,
    searches_finished: IntCounterVec,
    queue_depth: IntGauge,
    search_duration: HistogramVec,
}

/// Running searches, by spec.
struct RunningMetrics {
    candidates_evaluated: IntGaugeVec,
    candidates: IntGaugeVec,
    bucket_area: GaugeVec,
    best_throughput: GaugeVec,
    best_area: GaugeVec,
    last_progress: GaugeVec,
}

/// Finished searches, by spec, while the spec is in the folder.
struct ResultMetrics {
    result_throughput: GaugeVec,
    result_area: GaugeVec,
    /// File name → spec name of the result series, to remove them by file.
    results: Lock<HashMap<String, String>>,
}

/// The engine's work: estimates, layer schedules, placements.
struct WorkMetrics {
    estimates_computed: IntCounter,
    estimate_cache_hits: IntCounter,
    layer_schedules: IntCounterVec,
    mip_time_limit_hits: IntCounter,
    mip_solve: Histogram,
    placement: Histogram,
}

/// Cost-model plugin calls and faults.
struct PluginMetrics {
    plugin_calls: IntCounterVec,
    plugin_items: IntCounterVec,
    plugin_call_duration: HistogramVec,
    plugin_faults: IntCounterVec,
}

/// The spec folder's watcher and scans, and config reloads.
struct FolderMetrics {
    watcher_events: IntCounter,
    watcher_errors: IntCounter,
    rescans: IntCounterVec,
    reloads: IntCounterVec,
    reload_ok: IntGauge,
    reload_time: Gauge,
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> HistogramOpts {
    HistogramOpts::new(name, help).buckets(buckets.to_vec())
}

impl JobMetrics {
    fn new(r: &Registry) -> Result<JobMetrics, prometheus::Error> {
        Ok(JobMetrics {
            specs: reg!(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "archplace_specs",
                        "Spec contents known to the daemon, by job state"
                    ),
                    &["state"],
                )?
            ),
            specs_discovered: reg!(
                r,
                IntCounter::new(
                    "archplace_specs_discovered_total",
                    "New spec contents found in the spec folder and queued",
                )?
            ),
            specs_skipped: reg!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "archplace_specs_skipped_total",
                        "Entries of the spec folder not read as specs, by reason (too_large, not_a_file, unreadable, link_outside, broken_link, name_not_utf8)",
                    ),
                    &["reason"],
                )?
            ),
            searches_finished: reg!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "archplace_searches_finished_total",
                        "Searches that ended, by outcome (done, failed, cancelled, interrupted by shutdown)",
                    ),
                    &["outcome"],
                )?
            ),
            queue_depth: reg!(
                r,
                IntGauge::new("archplace_queue_depth", "Searches waiting for a worker")?
            ),
            search_duration: reg!(
                r,
                HistogramVec::new(
                    histogram(
                        "archplace_search_duration_seconds",
                        "Wall time of a search, from its start to its result files, by outcome",
                        &[
                            1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
                            3600.0, 7200.0, 14400.0
                        ],
                    ),
                    &["outcome"],
                )?
            ),
        })
    }
}

impl RunningMetrics {
    fn new(r: &Registry) -> Result<RunningMetrics, prometheus::Error> {
        Ok(RunningMetrics {
            candidates_evaluated: reg!(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "archplace_search_candidates_evaluated",
                        "Candidate chips evaluated so far by a running search",
                    ),
                    &SPEC_LABELS,
                )?
            ),
            candidates: reg!(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "archplace_search_candidates",
                        "Candidate chips in a running search's space (it may converge before)",
                    ),
                    &SPEC_LABELS,
                )?
            ),
            bucket_area: reg!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "archplace_search_bucket_area_square_meters",
                        "Smallest area of the area bucket a running search is in (searched largest first)",
                    ),
                    &SPEC_LABELS,
                )?
            ),
            best_throughput: reg!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "archplace_search_best_throughput_samples_per_second",
                        "Best mean training throughput found so far by a running search",
                    ),
                    &SPEC_LABELS,
                )?
            ),
            best_area: reg!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "archplace_search_best_area_square_meters",
                        "Chip area of a running search's best candidate so far",
                    ),
                    &SPEC_LABELS,
                )?
            ),
            last_progress: reg!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "archplace_search_last_progress_timestamp_seconds",
                        "When a running search last finished a candidate (Unix time)",
                    ),
                    &SPEC_LABELS,
                )?
            ),
        })
    }
}

impl ResultMetrics {
    fn new(r: &Registry) -> Result<ResultMetrics, prometheus::Error> {
        Ok(ResultMetrics {
            result_throughput: reg!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "archplace_result_throughput_samples_per_second",
                        "Best mean training throughput of a finished search (while its spec is in the folder)",
                    ),
                    &SPEC_LABELS,
                )?
            ),
            result_area: reg!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "archplace_result_area_square_meters",
                        "Chip area of a finished search's best configuration",
                    ),
                    &SPEC_LABELS,
                )?
            ),
            results: Lock::new("metrics results", HashMap::new()),
        })
    }
}

impl WorkMetrics {
    fn new(r: &Registry) -> Result<WorkMetrics, prometheus::Error> {
        Ok(WorkMetrics {
            estimates_computed: reg!(
                r,
                IntCounter::new(
                    "archplace_estimates_computed_total",
                    "Operator latency estimates asked of a latency model",
                )?
            ),
            estimate_cache_hits: reg!(
                r,
                IntCounter::new(
                    "archplace_estimate_cache_hits_total",
                    "Operator latency estimates answered by a search's memo",
                )?
            ),
            layer_schedules: reg!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "archplace_layer_schedules_total",
                        "Layer schedules settled, by method: bounds (the list schedule met the lower bound) or mip",
                    ),
                    &["method"],
                )?
            ),
            mip_time_limit_hits: reg!(
                r,
                IntCounter::new(
                    "archplace_mip_time_limit_hits_total",
                    "Layer-schedule MIPs stopped by their time limit",
                )?
            ),
            mip_solve: reg!(
                r,
                Histogram::with_opts(histogram(
                    "archplace_mip_solve_duration_seconds",
                    "Wall time of a layer schedule settled by the MIP (bounds, list schedule and MIP)",
                    &[
                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                        10.0
                    ],
                ))?
            ),
            placement: reg!(
                r,
                Histogram::with_opts(histogram(
                    "archplace_placement_duration_seconds",
                    "Wall time of one run of the placement dynamic program (one model, micro-batch and recomputation setting; every HBM size and width)",
                    &[
                        1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                        1.0, 2.5
                    ],
                ))?
            ),
        })
    }
}

impl PluginMetrics {
    fn new(r: &Registry) -> Result<PluginMetrics, prometheus::Error> {
        Ok(PluginMetrics {
            plugin_calls: reg!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "archplace_plugin_calls_total",
                        "Calls into cost-model plugins"
                    ),
                    &["plugin"],
                )?
            ),
            plugin_items: reg!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "archplace_plugin_items_total",
                        "Configurations and operators sent to cost-model plugins (a call carries a batch)",
                    ),
                    &["plugin"],
                )?
            ),
            plugin_call_duration: reg!(
                r,
                HistogramVec::new(
                    histogram(
                        "archplace_plugin_call_duration_seconds",
                        "Wall time of one call into a cost-model plugin",
                        &[
                            1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
                            2.5e-3, 0.01, 0.1, 1.0, 10.0
                        ],
                    ),
                    &["plugin"],
                )?
            ),
            plugin_faults: reg!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "archplace_plugin_faults_total",
                        "Faults of cost-model plugin calls, by kind: fuel, deadline, memory, trap, bad_output",
                    ),
                    &["plugin", "kind"],
                )?
            ),
        })
    }
}

impl FolderMetrics {
    fn new(r: &Registry) -> Result<FolderMetrics, prometheus::Error> {
        Ok(FolderMetrics {
            watcher_events: reg!(
                r,
                IntCounter::new(
                    "archplace_watcher_events_total",
                    "File-system events the spec-folder watcher reported (after debouncing)",
                )?
            ),
            watcher_errors: reg!(
                r,
                IntCounter::new(
                    "archplace_watcher_errors_total",
                    "Errors of the spec-folder watcher, and scans that could not read the folder",
                )?
            ),
            rescans: reg!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "archplace_rescans_total",
                        "Scans of the spec folder, by reason: start, change, poll, periodic, watcher_error, reload",
                    ),
                    &["reason"],
                )?
            ),
            reloads: reg!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "archplace_config_reloads_total",
                        "Config reloads (SIGHUP), by result: success or failure",
                    ),
                    &["result"],
                )?
            ),
            reload_ok: reg!(
                r,
                IntGauge::new(
                    "archplace_config_last_reload_successful",
                    "Whether the last config load (at start or SIGHUP) succeeded",
                )?
            ),
            reload_time: reg!(
                r,
                Gauge::new(
                    "archplace_config_last_reload_success_timestamp_seconds",
                    "When the config was last loaded successfully (Unix time)",
                )?
            ),
        })
    }
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let r = Registry::new();
        let info = reg!(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "archplace_build_info",
                    "Versions of archplace, of the wasmtime runtime its plugins run on and of the HiGHS MIP solver (always 1)",
                ),
                &["version", "wasmtime", "highs"],
            )?
        );
        info.with_label_values(&[
            env!("CARGO_PKG_VERSION"),
            WASMTIME_VERSION,
            &highs_version(),
        ])
        .set(1);
        r.register(Box::new(ProcessMetrics::new()))?;
        let m = Metrics {
            jobs: JobMetrics::new(&r)?,
            running: RunningMetrics::new(&r)?,
            finished: ResultMetrics::new(&r)?,
            work: WorkMetrics::new(&r)?,
            plugins: PluginMetrics::new(&r)?,
            folder: FolderMetrics::new(&r)?,
            pool: Arc::new(PoolMetrics::new(&r)?),
            registry: r,
        };
        for s in STATES {
            m.jobs.specs.with_label_values(&[s]).set(0);
        }
        for o in OUTCOMES {
            m.jobs.searches_finished.with_label_values(&[o]).inc_by(0);
            m.jobs.search_duration.with_label_values(&[o]);
        }
        for r in SKIP_REASONS {
            m.jobs.specs_skipped.with_label_values(&[r]).inc_by(0);
        }
        for method in ["bounds", "mip"] {
            m.work
                .layer_schedules
                .with_label_values(&[method])
                .inc_by(0);
        }
        for r in RESCAN_REASONS {
            m.folder.rescans.with_label_values(&[r]).inc_by(0);
        }
        for r in ["success", "failure"] {
            m.folder.reloads.with_label_values(&[r]).inc_by(0);
        }
        m.config_loaded(true);
        Ok(m)
    }

    /// The Prometheus text format of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }

    pub fn set_specs(&self, state: &str, n: usize) {
        self.jobs.specs.with_label_values(&[state]).set(n as i64);
    }

    pub fn set_queue_depth(&self, n: usize) {
        self.jobs.queue_depth.set(n as i64);
    }

    pub fn spec_discovered(&self) {
        self.jobs.specs_discovered.inc();
    }

    /// An entry of the spec folder was not read as a spec, for `reason`.
    pub fn spec_skipped(&self, reason: &str) {
        self.jobs.specs_skipped.with_label_values(&[reason]).inc();
    }

    /// A search ended: its outcome and duration; its progress series are removed.
    pub fn search_ended(&self, labels: &SpecLabels, outcome: &str, seconds: f64) {
        self.jobs
            .searches_finished
            .with_label_values(&[outcome])
            .inc();
        self.jobs
            .search_duration
            .with_label_values(&[outcome])
            .observe(seconds);
        self.search_ended_series(labels);
    }

    /// Removes the progress series of the search of `labels` (it ended, or its spec was
    /// renamed and it goes on under the new name).
    pub fn search_ended_series(&self, labels: &SpecLabels) {
        let l = labels.values();
        for g in [&self.running.candidates_evaluated, &self.running.candidates] {
            let _ = g.remove_label_values(&l);
        }
        for g in [
            &self.running.bucket_area,
            &self.running.best_throughput,
            &self.running.best_area,
            &self.running.last_progress,
        ] {
            let _ = g.remove_label_values(&l);
        }
    }

    /// The best configuration of a finished search, kept while its file is in the folder.
    pub fn set_result(&self, labels: &SpecLabels, throughput: f64, area_um2: f64) {
        self.forget_result(&labels.file);
        let l = labels.values();
        self.finished
            .result_throughput
            .with_label_values(&l)
            .set(throughput);
        self.finished
            .result_area
            .with_label_values(&l)
            .set(area_um2 * 1e-12);
        self.finished
            .results
            .lock()
            .insert(labels.file.clone(), labels.spec.clone());
    }

    /// The spec file `file` left the folder (or changed): its result series go.
    pub fn forget_result(&self, file: &str) {
        let Some(spec) = self.finished.results.lock().remove(file) else {
            return;
        };
        let l = [spec.as_str(), file];
        let _ = self.finished.result_throughput.remove_label_values(&l);
        let _ = self.finished.result_area.remove_label_values(&l);
    }

    /// The progress of the search of `labels`; `counted` holds its estimate counters
    /// already added (the engine reports running totals).
    pub fn progress(&self, labels: &SpecLabels, p: &Progress, counted: (u64, u64)) {
        let l = labels.values();
        self.running
            .candidates_evaluated
            .with_label_values(&l)
            .set(p.evaluated as i64);
        self.running
            .candidates
            .with_label_values(&l)
            .set(p.total as i64);
        self.running
            .bucket_area
            .with_label_values(&l)
            .set(p.bucket_area_um2 * 1e-12);
        if let Some(t) = p.best_throughput_samples_per_second {
            self.running.best_throughput.with_label_values(&l).set(t);
        }
        if let Some(a) = p.best_area_um2 {
            self.running.best_area.with_label_values(&l).set(a * 1e-12);
        }
        self.running
            .last_progress
            .with_label_values(&l)
            .set(unix_seconds());
        self.work
            .estimates_computed
            .inc_by(p.estimates_computed.saturating_sub(counted.0));
        self.work
            .estimate_cache_hits
            .inc_by(p.estimate_cache_hits.saturating_sub(counted.1));
    }

    pub fn schedule(&self, e: &ScheduleEvent) {
        match e.method {
            Method::Bounds => self
                .work
                .layer_schedules
                .with_label_values(&["bounds"])
                .inc(),
            Method::Mip => {
                self.work.layer_schedules.with_label_values(&["mip"]).inc();
                self.work.mip_solve.observe(e.solve_seconds);
            }
        }
        if e.hit_time_limit {
            self.work.mip_time_limit_hits.inc();
        }
    }

    pub fn placement(&self, seconds: f64) {
        self.work.placement.observe(seconds);
    }

    /// Creates the series of `plugin` at zero (at start and whenever the catalog changes),
    /// so its faults show as 0 rather than as nothing.
    pub fn plugin_known(&self, plugin: &str) {
        self.plugins
            .plugin_calls
            .with_label_values(&[plugin])
            .inc_by(0);
        self.plugins
            .plugin_items
            .with_label_values(&[plugin])
            .inc_by(0);
        self.plugins
            .plugin_call_duration
            .with_label_values(&[plugin]);
        for k in FAULT_KINDS {
            self.plugins
                .plugin_faults
                .with_label_values(&[plugin, k.name()])
                .inc_by(0);
        }
    }

    pub fn watcher_events(&self, n: usize) {
        self.folder.watcher_events.inc_by(n as u64);
    }

    pub fn watcher_error(&self) {
        self.folder.watcher_errors.inc();
    }

    pub fn rescan(&self, reason: &str) {
        self.folder.rescans.with_label_values(&[reason]).inc();
    }

    /// A config reload (SIGHUP) succeeded or failed.
    pub fn config_reloaded(&self, ok: bool) {
        self.folder
            .reloads
            .with_label_values(&[if ok { "success" } else { "failure" }])
            .inc();
        self.config_loaded(ok);
    }

    fn config_loaded(&self, ok: bool) {
        self.folder.reload_ok.set(i64::from(ok));
        if ok {
            self.folder.reload_time.set(unix_seconds());
        }
    }
}

impl archplace_plugin_host::Telemetry for Metrics {
    fn call(&self, plugin: &str, seconds: f64, items: usize) {
        self.plugins.plugin_calls.with_label_values(&[plugin]).inc();
        self.plugins
            .plugin_items
            .with_label_values(&[plugin])
            .inc_by(items as u64);
        self.plugins
            .plugin_call_duration
            .with_label_values(&[plugin])
            .observe(seconds);
    }

    fn fault(&self, plugin: &str, kind: FaultKind) {
        self.plugins
            .plugin_faults
            .with_label_values(&[plugin, kind.name()])
            .inc();
    }
}

/// The labels of one spec's series: its name and its file's name in the folder (two
/// files may carry the same spec name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecLabels {
    pub spec: String,
    pub file: String,
}

impl SpecLabels {
    fn values(&self) -> [&str; 2] {
        [&self.spec, &self.file]
    }
}

/// The process's CPU, memory, threads and file descriptors (prometheus's process
/// collector), but CPU time to the clock tick: that collector counts whole seconds, so
/// `rate()` over a minute of an idle or lightly loaded daemon reads as 0 or jumps by 1/60.
struct ProcessMetrics {
    inner: prometheus::process_collector::ProcessCollector,
}

impl ProcessMetrics {
    const CPU: &'static str = "archplace_process_cpu_seconds_total";

    fn new() -> ProcessMetrics {
        ProcessMetrics {
            inner: prometheus::process_collector::ProcessCollector::new(
                std::process::id() as i32,
                "archplace",
            ),
        }
    }

    /// User plus system CPU seconds of this process, to the tick (10 ms on Linux).
    fn cpu_seconds() -> Option<f64> {
        let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
        Some((stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64)
    }
}

impl prometheus::core::Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.inner.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut families = self.inner.collect();
        if let Some(seconds) = Self::cpu_seconds() {
            for f in families.iter_mut().filter(|f| f.name() == Self::CPU) {
                for m in f.mut_metric() {
                    let mut c = prometheus::proto::Counter::default();
                    c.set_value(seconds);
                    m.set_counter(c);
                }
            }
        }
        families
    }
}

/// The engine's work events of a pool worker's evaluations (layer schedules, placements).
impl archplace_engine::search::Observer for Metrics {
    fn schedule(&self, e: &ScheduleEvent) {
        Metrics::schedule(self, e);
    }

    fn placement(&self, seconds: f64) {
        Metrics::placement(self, seconds);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn text(m: &Metrics) -> String {
        String::from_utf8(m.render()).unwrap()
    }

    #[test]
    fn every_name_is_prefixed_and_counters_end_in_total() {
        let m = Metrics::new().unwrap();
        let t = text(&m);
        for line in t.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut w = line.split_whitespace().skip(2);
            let (name, kind) = (w.next().unwrap(), w.next().unwrap());
            assert!(name.starts_with("archplace_"), "{name}");
            assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
        }
        assert!(t.contains("archplace_process_resident_memory_bytes"), "{t}");
        assert!(t.contains("archplace_process_open_fds"), "{t}");
        assert!(t.contains(&format!("highs=\"{}\"", highs_version())));
    }

    #[test]
    fn highs_version_is_a_release() {
        let v = highs_version();
        let parts: Vec<u32> = v.split('.').map(|p| p.parse().unwrap()).collect();
        assert_eq!(parts.len(), 3, "{v}");
        assert!(parts[0] >= 1, "{v}");
    }

    /// Every panel of the dashboard says its unit and what it shows, and rates use
    /// Grafana's `$__rate_interval` (not a fixed window that breaks at other scrape
    /// intervals).
    #[test]
    fn every_dashboard_panel_has_a_unit_and_a_description() {
        let d: serde_json::Value = serde_json::from_str(include_str!(
            "../../config/grafana/dashboards/archplace.json"
        ))
        .unwrap();
        let mut panels = 0;
        for p in d["panels"].as_array().unwrap() {
            let title = p["title"].as_str().unwrap_or("");
            assert!(
                p["description"].as_str().is_some_and(|s| !s.is_empty()),
                "panel `{title}` has no description"
            );
            if p["type"] == "row" {
                continue;
            }
            assert!(
                p["fieldConfig"]["defaults"]["unit"].as_str().is_some(),
                "panel `{title}` has no unit"
            );
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or("");
                assert!(!expr.contains("[5m]"), "panel `{title}`: {expr}");
                if expr.contains("rate(") && !expr.contains("increase(") {
                    assert!(expr.contains("$__rate_interval"), "panel `{title}`: {expr}");
                }
            }
            panels += 1;
        }
        assert!(panels >= 25, "{panels} panels");
    }

    /// Every alert says how long it must hold, how bad it is, what happened, and links a
    /// runbook section that exists.
    #[test]
    fn every_alert_is_complete_and_has_a_runbook_section() {
        let rules = include_str!("../../config/prometheus/alerts.yml");
        let runbook = include_str!("../../docs/runbook.md");
        let blocks: Vec<&str> = rules.split("- alert: ").skip(1).collect();
        assert!(blocks.len() >= 8, "{} alerts", blocks.len());
        for block in blocks {
            let name = block.lines().next().unwrap().trim();
            for key in ["expr:", "for:", "severity:", "summary:", "description:"] {
                assert!(block.contains(key), "alert {name} has no `{key}`");
            }
            let url = format!(
                "runbook_url: \"file:///usr/share/doc/archplace/runbook.md#{}\"",
                name.to_lowercase()
            );
            assert!(block.contains(&url), "alert {name}: no {url}");
            assert!(
                runbook.lines().any(|l| l == format!("## {name}")),
                "docs/runbook.md has no section `## {name}`"
            );
        }
    }

    /// CPU time to the tick, not in whole seconds: a tenth of a second of work shows.
    #[test]
    fn process_cpu_seconds_are_fractional() {
        let m = Metrics::new().unwrap();
        let cpu = |t: &str| -> f64 {
            t.lines()
                .find_map(|l| l.strip_prefix("archplace_process_cpu_seconds_total "))
                .unwrap()
                .parse()
                .unwrap()
        };
        let before = cpu(&text(&m));
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = cpu(&text(&m));
        assert!(after - before >= 0.1, "{before} → {after}");
        assert!(
            after.fract() != 0.0 || before.fract() != 0.0,
            "{before} → {after}"
        );
    }

    #[test]
    fn the_wasmtime_version_is_the_pinned_one() {
        let manifest = include_str!("../../Cargo.toml");
        assert!(
            manifest.contains(&format!("wasmtime = {{ version = \"={WASMTIME_VERSION}\"")),
            "Cargo.toml pins another wasmtime than WASMTIME_VERSION"
        );
    }

    #[test]
    fn series_of_a_search_go_when_it_ends_and_results_when_the_file_goes() {
        let m = Metrics::new().unwrap();
        let a = SpecLabels {
            spec: "alpha".into(),
            file: "alpha.toml".into(),
        };
        let p = Progress {
            evaluated: 3,
            total: 10,
            bucket: 4,
            bucket_area_um2: 4e4,
            best_throughput_samples_per_second: Some(12.5),
            best_area_um2: Some(2e8),
            estimates_computed: 100,
            estimate_cache_hits: 40,
        };
        m.progress(&a, &p, (0, 0));
        // The same totals again: nothing more is counted.
        m.progress(&a, &p, (100, 40));
        let t = text(&m);
        assert!(
            t.contains(
                r#"archplace_search_candidates_evaluated{file="alpha.toml",spec="alpha"} 3"#
            ),
            "{t}"
        );
        let area: f64 = t
            .lines()
            .find_map(|l| {
                l.strip_prefix(
                    r#"archplace_search_best_area_square_meters{file="alpha.toml",spec="alpha"} "#,
                )
            })
            .unwrap()
            .parse()
            .unwrap();
        assert!((area - 2e-4).abs() < 1e-15, "{area}");
        // Running totals are added once.
        assert!(t.contains("archplace_estimates_computed_total 100"), "{t}");
        assert!(t.contains("archplace_estimate_cache_hits_total 40"), "{t}");
        m.search_ended(&a, "done", 2.0);
        m.set_result(&a, 12.5, 2e8);
        let t = text(&m);
        assert!(!t.contains("archplace_search_candidates_evaluated{"), "{t}");
        assert!(
            t.contains(r#"archplace_searches_finished_total{outcome="done"} 1"#),
            "{t}"
        );
        assert!(t.contains(r#"archplace_result_throughput_samples_per_second{file="alpha.toml",spec="alpha"} 12.5"#), "{t}");
        // The file is edited and renamed inside: the old name's series goes.
        m.set_result(
            &SpecLabels {
                spec: "beta".into(),
                file: "alpha.toml".into(),
            },
            3.0,
            1e8,
        );
        let t = text(&m);
        assert!(!t.contains(r#"spec="alpha""#), "{t}");
        m.forget_result("alpha.toml");
        assert!(!text(&m).contains("archplace_result_throughput_samples_per_second{"));
    }

    #[test]
    fn plugin_series_exist_at_zero_once_known() {
        use archplace_plugin_host::Telemetry;
        let m = Metrics::new().unwrap();
        m.plugin_known("reference");
        let t = text(&m);
        assert!(
            t.contains(r#"archplace_plugin_faults_total{kind="fuel",plugin="reference"} 0"#),
            "{t}"
        );
        m.fault("reference", FaultKind::Memory);
        m.call("reference", 1e-4, 7);
        let t = text(&m);
        assert!(
            t.contains(r#"archplace_plugin_faults_total{kind="memory",plugin="reference"} 1"#),
            "{t}"
        );
        assert!(
            t.contains(r#"archplace_plugin_items_total{plugin="reference"} 7"#),
            "{t}"
        );
        assert!(
            t.contains(r#"archplace_plugin_call_duration_seconds_count{plugin="reference"} 1"#),
            "{t}"
        );
    }
}
