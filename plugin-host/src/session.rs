//! One plugin with one set of parameters for one search: a pool of instances, each call
//! run under the limits, every answer checked, faults counted.

use super::bindings::{self, CostModel, CostModelPre, Level, wit};
use super::{Fault, FaultKind, Limits, Loaded, PluginError};
use archplace_plugin_sdk::{
    AcceleratorConfig, AreaModel, CoreConfig, EstimateError, LatencyModel, ModelInfo, Op, OpCost,
    Parameter, ParameterError,
};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// Bytes of a plugin's stderr kept (it is only read after a trap).
pub const STDERR_BYTES: usize = 8 << 10;

/// Longest error message, name or description a plugin may return.
pub const MAX_TEXT_BYTES: usize = 4096;
/// Most parameters a plugin may declare.
pub const MAX_PARAMETERS: usize = 64;
/// Longest log line kept (longer ones are cut).
pub const MAX_LOG_BYTES: usize = 1024;
/// Log lines a plugin instance may write in a burst, and per second after it.
pub const LOG_BURST: f64 = 20.0;
pub const LOG_PER_SECOND: f64 = 5.0;
/// Most memoised estimates kept per plugin and parameters, per kind (area, latency); past
/// it the cache evicts the least useful entries (S3-FIFO, quick_cache).
pub const MEMO_CAPACITY: usize = 1 << 20;

/// Why the epoch callback stopped a call.
#[derive(Debug, thiserror::Error)]
enum Interrupt {
    #[error("ran past its deadline of {0:?}")]
    Deadline(Duration),
    #[error("stopped: the search was cancelled")]
    Cancelled,
}

/// Store data of one instance.
pub struct State {
    wasi: WasiCtx,
    /// The guest's stderr, kept in memory (capped) so that a panic's message can be shown.
    stderr: MemoryOutputPipe,
    table: ResourceTable,
    limiter: Limiter,
    log: LogBucket,
    plugin: String,
    cancel: Arc<AtomicBool>,
    call_started: Instant,
    deadline: Duration,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The shared types interface has no functions to implement.
impl bindings::archplace::cost_model::types::Host for State {}

impl bindings::archplace::cost_model::host::Host for State {
    fn log(&mut self, level: Level, message: String) {
        self.log.emit(&self.plugin, level, message);
    }
}

/// Caps a plugin's memory; remembers a refusal so the trap that follows is reported as
/// what it is.
struct Limiter {
    memory_bytes: usize,
    total_bytes: usize,
    refused: Option<usize>,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self
            .total_bytes
            .saturating_sub(current)
            .saturating_add(desired);
        if total > self.memory_bytes {
            self.refused = Some(total);
            return Ok(false);
        }
        self.total_bytes = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 16)
    }

    fn instances(&self) -> usize {
        64
    }
    fn tables(&self) -> usize {
        64
    }
    fn memories(&self) -> usize {
        16
    }
}

/// Cuts `text` to at most `max` bytes (on a character boundary), marking the cut.
fn cut_text(text: &mut String, max: usize) {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(" […]");
    }
}

/// Token bucket for a plugin's log lines.
pub(crate) struct LogBucket {
    tokens: f64,
    last: Instant,
    dropped: u64,
}

impl LogBucket {
    pub(crate) fn new() -> Self {
        LogBucket {
            tokens: LOG_BURST,
            last: Instant::now(),
            dropped: 0,
        }
    }

    /// Lines dropped since the last one written.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    pub(crate) fn emit(&mut self, plugin: &str, level: Level, mut message: String) {
        let now = Instant::now();
        self.tokens =
            (self.tokens + (now - self.last).as_secs_f64() * LOG_PER_SECOND).min(LOG_BURST);
        self.last = now;
        if self.tokens < 1.0 {
            self.dropped += 1;
            return;
        }
        self.tokens -= 1.0;
        cut_text(&mut message, MAX_LOG_BYTES);
        let dropped = std::mem::take(&mut self.dropped);
        match level {
            Level::Error => tracing::error!(plugin, dropped, "{message}"),
            Level::Warn => tracing::warn!(plugin, dropped, "{message}"),
            Level::Info => tracing::info!(plugin, dropped, "{message}"),
            Level::Debug => tracing::debug!(plugin, dropped, "{message}"),
        }
    }
}

struct Slot {
    store: Store<State>,
    model: CostModel,
}

fn new_store(
    engine: &wasmtime::Engine,
    limits: &Limits,
    plugin: &str,
    cancel: Arc<AtomicBool>,
) -> Store<State> {
    let stderr = MemoryOutputPipe::new(STDERR_BYTES);
    let state = State {
        // No preopened folders, no environment, no arguments, no sockets, stdin and stdout
        // closed; stderr goes to a small in-memory buffer.
        wasi: WasiCtxBuilder::new()
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .stderr(stderr.clone())
            .build(),
        stderr,
        table: ResourceTable::new(),
        limiter: Limiter {
            memory_bytes: usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX),
            total_bytes: 0,
            refused: None,
        },
        log: LogBucket::new(),
        plugin: plugin.to_string(),
        cancel,
        call_started: Instant::now(),
        deadline: Duration::from_secs_f64(limits.deadline_seconds.max(0.001)),
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limiter);
    store.epoch_deadline_callback(|ctx| {
        let s = ctx.data();
        if s.cancel.load(Ordering::Relaxed) {
            return Err(wasmtime::Error::new(Interrupt::Cancelled));
        }
        if s.call_started.elapsed() > s.deadline {
            return Err(wasmtime::Error::new(Interrupt::Deadline(s.deadline)));
        }
        Ok(UpdateDeadline::Continue(1))
    });
    store
}

/// Arms the limits for a call over `items` configurations or operators.
fn arm(store: &mut Store<State>, limits: &Limits, items: usize) {
    // Fuel is always enabled on our engine; setting it cannot fail then.
    let _ = store.set_fuel(limits.fuel_budget(items));
    store.set_epoch_deadline(1);
    store.data_mut().call_started = Instant::now();
}

/// What a failed call was.
fn classify(err: &wasmtime::Error, state: &State, limits: &Limits) -> Fault {
    if let Some(i) = err.downcast_ref::<Interrupt>() {
        return Fault {
            kind: match i {
                Interrupt::Deadline(_) => FaultKind::Deadline,
                Interrupt::Cancelled => FaultKind::Cancelled,
            },
            message: i.to_string(),
        };
    }
    if let Some(asked) = state.limiter.refused {
        return Fault {
            kind: FaultKind::Memory,
            message: format!(
                "exceeded its memory limit of {} (it asked for {})",
                archplace_plugin_sdk::units::format_bytes(limits.memory_bytes),
                archplace_plugin_sdk::units::format_bytes(asked as u64)
            ),
        };
    }
    if let Some(trap) = err.downcast_ref::<wasmtime::Trap>()
        && *trap == wasmtime::Trap::OutOfFuel
    {
        return Fault {
            kind: FaultKind::Fuel,
            message: "ran out of fuel (its instruction budget for this call); an endless loop?"
                .into(),
        };
    }
    // The trap itself, and what the guest printed before it (a Rust panic's message).
    tracing::debug!(plugin = %state.plugin, "plugin trap: {err:?}");
    let cause = err.root_cause().to_string();
    let printed = String::from_utf8_lossy(&state.stderr.contents()).into_owned();
    let printed: Vec<&str> = printed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    let mut message = format!("trapped ({cause})");
    if !printed.is_empty() {
        let mut text = printed.join(" ");
        cut_text(&mut text, MAX_LOG_BYTES);
        message.push_str(&format!(" after printing: {text}"));
    }
    Fault {
        kind: FaultKind::Trap,
        message,
    }
}

fn bad_output(message: String) -> Fault {
    Fault {
        kind: FaultKind::BadOutput,
        message,
    }
}

fn check_error_size(e: &wit::EstimateError) -> Result<(), Fault> {
    let n = bindings::error_message_len(e);
    if n > MAX_TEXT_BYTES {
        return Err(bad_output(format!(
            "returned an error message of {n} bytes (at most {MAX_TEXT_BYTES})"
        )));
    }
    Ok(())
}

fn check_cost(what: &str, i: usize, seconds: f64, joules: f64) -> Result<(), Fault> {
    if !(seconds.is_finite() && seconds >= 0.0 && joules.is_finite() && joules >= 0.0) {
        return Err(bad_output(format!(
            "returned {seconds} s and {joules} J for {what} {i}: costs must be finite and not negative"
        )));
    }
    Ok(())
}

/// Asks a fresh instance for the plugin's `info`.
pub fn probe_info(
    engine: &wasmtime::Engine,
    pre: &CostModelPre<State>,
    limits: &Limits,
    name: &str,
) -> Result<ModelInfo, Fault> {
    let mut store = new_store(engine, limits, name, Arc::new(AtomicBool::new(false)));
    arm(&mut store, limits, 1);
    let model = match pre.instantiate(&mut store) {
        Ok(m) => m,
        Err(e) => return Err(classify(&e, store.data(), limits)),
    };
    arm(&mut store, limits, 1);
    match model.archplace_cost_model_model().call_info(&mut store) {
        Ok(info) => Ok(bindings::info_from_wit(info)),
        Err(e) => Err(classify(&e, store.data(), limits)),
    }
}

/// Sizes and consistency of what a plugin says about itself.
pub fn check_info(info: &ModelInfo, exported: &semver::Version) -> Result<(), String> {
    let texts = [
        ("name", info.name.len(), 64),
        ("vendor", info.vendor.len(), 256),
        ("version", info.version.len(), 64),
    ];
    for (what, n, max) in texts {
        if n > max {
            return Err(format!("its {what} is {n} bytes long (at most {max})"));
        }
    }
    if info.name.is_empty() {
        return Err("its name is empty".into());
    }
    if semver::Version::parse(&info.version).is_err() {
        return Err(format!(
            "its version `{}` is not a semantic version (e.g. 1.2.0)",
            info.version
        ));
    }
    if info.parameters.len() > MAX_PARAMETERS {
        return Err(format!(
            "it declares {} parameters (at most {MAX_PARAMETERS})",
            info.parameters.len()
        ));
    }
    for p in &info.parameters {
        if p.name.len() > 64 || p.description.len() > MAX_TEXT_BYTES || p.default.len() > 256 {
            return Err(format!(
                "parameter `{}`: name, description or default too long",
                p.name.chars().take(64).collect::<String>()
            ));
        }
    }
    let (major, minor) = info.interface_version;
    if u64::from(major) != exported.major || u64::from(minor) != exported.minor {
        return Err(format!(
            "it says it implements interface {major}.{minor}, but it exports archplace:cost-model@{exported}"
        ));
    }
    if !info.provides.area && !info.provides.latency {
        return Err("it provides neither an area nor a latency model".into());
    }
    Ok(())
}

/// Memoised estimates of a deterministic plugin with fixed parameters: bounded caches
/// shared by every search that uses the same plugin and parameters.
pub struct Memo {
    latency: quick_cache::sync::Cache<(CoreConfig, Op), OpCost>,
    area: quick_cache::sync::Cache<AcceleratorConfig, Result<f64, EstimateError>>,
}

impl Default for Memo {
    fn default() -> Self {
        Memo {
            latency: quick_cache::sync::Cache::new(MEMO_CAPACITY),
            area: quick_cache::sync::Cache::new(MEMO_CAPACITY),
        }
    }
}

/// Counters of one session (for `plugin check`, benchmarks and metrics).
#[derive(Debug, Default)]
pub struct Counters {
    pub calls: AtomicU64,
    pub items: AtomicU64,
    pub call_nanos: AtomicU64,
    pub memo_hits: AtomicU64,
    pub fuel: AtomicU64,
}

struct Pool {
    idle: Vec<Slot>,
    live: usize,
}

/// One plugin, one parameter set, one search. Implements the SDK's model traits.
pub struct Session {
    loaded: Arc<Loaded>,
    parameters: Vec<Parameter>,
    limits: Limits,
    cancel: Arc<AtomicBool>,
    pool: Mutex<Pool>,
    freed: Condvar,
    faults: AtomicU32,
    fault_log: Mutex<Vec<Fault>>,
    memo: Option<Arc<Memo>>,
    telemetry: Option<Arc<dyn super::Telemetry>>,
    pub counters: Counters,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("plugin", &self.loaded.info.name)
            .finish()
    }
}

impl Session {
    /// Opens a session and configures its first instance, so bad parameters are reported
    /// now, before any search.
    pub fn open(
        loaded: Arc<Loaded>,
        parameters: Vec<Parameter>,
        limits: Limits,
        cancel: Arc<AtomicBool>,
        memo: Option<Arc<Memo>>,
        telemetry: Option<Arc<dyn super::Telemetry>>,
    ) -> Result<Arc<Session>, PluginError> {
        let s = Session {
            loaded,
            parameters,
            limits,
            cancel,
            pool: Mutex::new(Pool {
                idle: Vec::new(),
                live: 0,
            }),
            freed: Condvar::new(),
            faults: AtomicU32::new(0),
            fault_log: Mutex::new(Vec::new()),
            memo,
            telemetry,
            counters: Counters::default(),
        };
        let slot = s.instantiate().map_err(|e| match e {
            Ok(errors) => PluginError::Parameters {
                plugin: s.loaded.info.name.clone(),
                errors,
            },
            Err(fault) => PluginError::Fault {
                plugin: s.loaded.info.name.clone(),
                during: "starting (configure)".into(),
                fault,
            },
        })?;
        if let Ok(mut p) = s.pool.lock() {
            p.live = 1;
            p.idle.push(slot);
        }
        Ok(Arc::new(s))
    }

    pub fn loaded(&self) -> &Arc<Loaded> {
        &self.loaded
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Faults so far, oldest first.
    pub fn faults(&self) -> Vec<Fault> {
        self.fault_log.lock().map(|f| f.clone()).unwrap_or_default()
    }

    /// A fresh, configured instance. `Err(Ok(_))`: the plugin rejects the parameters.
    fn instantiate(&self) -> Result<Slot, Result<Vec<ParameterError>, Fault>> {
        let name = &self.loaded.info.name;
        let mut store = new_store(&self.loaded.engine, &self.limits, name, self.cancel.clone());
        arm(&mut store, &self.limits, self.parameters.len() + 1);
        let model = self
            .loaded
            .pre
            .instantiate(&mut store)
            .map_err(|e| Err(classify(&e, store.data(), &self.limits)))?;
        let params = bindings::parameters_to_wit(&self.parameters);
        match model
            .archplace_cost_model_model()
            .call_configure(&mut store, &params)
        {
            Ok(Ok(())) => Ok(Slot { store, model }),
            Ok(Err(errors)) => {
                if errors.len() > MAX_PARAMETERS
                    || errors
                        .iter()
                        .any(|e| e.name.len() > 256 || e.message.len() > MAX_TEXT_BYTES)
                {
                    return Err(Err(bad_output(
                        "returned oversized parameter errors".into(),
                    )));
                }
                Err(Ok(errors
                    .into_iter()
                    .map(|e| ParameterError::new(e.name, e.message))
                    .collect()))
            }
            Err(e) => Err(Err(classify(&e, store.data(), &self.limits))),
        }
    }

    fn take(&self) -> Result<Slot, Fault> {
        let mut pool = self
            .pool
            .lock()
            .map_err(|_| bad_output("instance pool poisoned".into()))?;
        loop {
            if let Some(s) = pool.idle.pop() {
                return Ok(s);
            }
            if pool.live < self.limits.max_instances.max(1) {
                pool.live += 1;
                drop(pool);
                return self.instantiate().map_err(|e| {
                    if let Ok(mut p) = self.pool.lock() {
                        p.live -= 1;
                    }
                    self.freed.notify_one();
                    match e {
                        Ok(errors) => bad_output(format!(
                            "a fresh instance rejected the parameters the first accepted: {}",
                            errors
                                .iter()
                                .map(|e| e.to_string())
                                .collect::<Vec<_>>()
                                .join("; ")
                        )),
                        Err(f) => f,
                    }
                });
            }
            pool = self
                .freed
                .wait(pool)
                .map_err(|_| bad_output("instance pool poisoned".into()))?;
        }
    }

    fn give_back(&self, slot: Slot) {
        if let Ok(mut p) = self.pool.lock() {
            p.idle.push(slot);
        }
        self.freed.notify_one();
    }

    fn discard(&self) {
        if let Ok(mut p) = self.pool.lock() {
            p.live -= 1;
        }
        self.freed.notify_one();
    }

    /// Runs `f` on an instance under the limits, checks its answer with `check`, and
    /// handles faults: the instance is dropped (if it trapped), the fault recorded, the
    /// call retried on a fresh instance until `max_faults`.
    fn call<R>(
        &self,
        what: &str,
        items: usize,
        f: impl Fn(&mut Store<State>, &CostModel) -> wasmtime::Result<R>,
        check: impl Fn(&R) -> Result<(), Fault>,
    ) -> Result<R, EstimateError> {
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(self.to_error(&Fault {
                    kind: FaultKind::Cancelled,
                    message: "stopped: the search was cancelled".into(),
                }));
            }
            let fault = match self.take() {
                Err(fault) => fault,
                Ok(mut slot) => {
                    arm(&mut slot.store, &self.limits, items);
                    let t = Instant::now();
                    let r = f(&mut slot.store, &slot.model);
                    let nanos = t.elapsed().as_nanos() as u64;
                    self.counters.calls.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .items
                        .fetch_add(items as u64, Ordering::Relaxed);
                    self.counters.call_nanos.fetch_add(nanos, Ordering::Relaxed);
                    if let Some(t) = &self.telemetry {
                        t.call(&self.loaded.info.name, nanos as f64 * 1e-9, items);
                    }
                    match r {
                        Ok(v) => {
                            let budget = self.limits.fuel_budget(items);
                            let left = slot.store.get_fuel().unwrap_or(0);
                            self.counters
                                .fuel
                                .fetch_add(budget.saturating_sub(left), Ordering::Relaxed);
                            match check(&v) {
                                Ok(()) => {
                                    self.give_back(slot);
                                    return Ok(v);
                                }
                                Err(fault) => {
                                    self.give_back(slot);
                                    fault
                                }
                            }
                        }
                        Err(e) => {
                            let fault = classify(&e, slot.store.data(), &self.limits);
                            drop(slot);
                            self.discard();
                            fault
                        }
                    }
                }
            };
            if fault.kind == FaultKind::Cancelled {
                return Err(self.to_error(&fault));
            }
            let n = self.faults.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(t) = &self.telemetry {
                t.fault(&self.loaded.info.name, fault.kind);
            }
            tracing::warn!(
                plugin = %self.loaded.info.name,
                kind = fault.kind.name(),
                fault = n,
                of = self.limits.max_faults,
                "plugin fault during {what}: {}",
                fault.message
            );
            if let Ok(mut log) = self.fault_log.lock() {
                log.push(fault.clone());
            }
            if n >= self.limits.max_faults.max(1) {
                return Err(self.to_error(&Fault {
                    kind: fault.kind,
                    message: format!(
                        "{} during {what} ({} fault{} in this search, the limit)",
                        fault.message,
                        n,
                        if n == 1 { "" } else { "s" }
                    ),
                }));
            }
        }
    }

    fn to_error(&self, fault: &Fault) -> EstimateError {
        EstimateError::Internal(format!(
            "plugin `{}` {} ({} fault): {}",
            self.loaded.info.name,
            self.loaded.info.version,
            fault.kind.name(),
            fault.message
        ))
    }

    fn plugin_error(&self, e: wit::EstimateError) -> EstimateError {
        let prefix = format!("plugin `{}`: ", self.loaded.info.name);
        match bindings::error_from_wit(e) {
            EstimateError::OutOfDomain(m) => EstimateError::OutOfDomain(m),
            EstimateError::Unsupported(m) => EstimateError::Unsupported(prefix + &m),
            EstimateError::Internal(m) => EstimateError::Internal(prefix + &m),
        }
    }

    /// Latency without the memo (benchmarks, `plugin check`).
    pub fn latency_uncached(
        &self,
        core: &CoreConfig,
        ops: &[Op],
    ) -> Result<Vec<OpCost>, EstimateError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let wcore = bindings::core_to_wit(core);
        let wops: Vec<wit::Op> = ops.iter().map(bindings::op_to_wit).collect();
        let n = ops.len();
        let r = self.call(
            "latency",
            n,
            |store, model| {
                model
                    .archplace_cost_model_model()
                    .call_latency(store, wcore, &wops)
            },
            |r| match r {
                Ok(costs) => {
                    if costs.len() != n {
                        return Err(bad_output(format!(
                            "returned {} results for {n} operators",
                            costs.len()
                        )));
                    }
                    for (i, c) in costs.iter().enumerate() {
                        check_cost("operator", i, c.seconds, c.joules)?;
                    }
                    Ok(())
                }
                Err(e) => check_error_size(e),
            },
        )?;
        match r {
            Ok(costs) => Ok(costs
                .into_iter()
                .map(|c| OpCost {
                    seconds: c.seconds,
                    joules: c.joules,
                })
                .collect()),
            Err(e) => Err(self.plugin_error(e)),
        }
    }

    /// Areas without the memo.
    pub fn area_uncached(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
        if configs.is_empty() {
            return Ok(Vec::new());
        }
        let wconfigs: Vec<wit::AcceleratorConfig> =
            configs.iter().map(bindings::config_to_wit).collect();
        let n = configs.len();
        let r = self.call(
            "area",
            n,
            |store, model| model.archplace_cost_model_model().call_area(store, &wconfigs),
            |r| match r {
                Ok(areas) => {
                    if areas.len() != n {
                        return Err(bad_output(format!(
                            "returned {} areas for {n} configurations",
                            areas.len()
                        )));
                    }
                    for (i, a) in areas.iter().enumerate() {
                        match a {
                            Ok(a) if !(a.is_finite() && *a >= 0.0) => {
                                return Err(bad_output(format!(
                                    "returned an area of {a} µm² for configuration {i}: areas must be finite and not negative"
                                )));
                            }
                            Ok(_) => {}
                            Err(e) => check_error_size(e)?,
                        }
                    }
                    Ok(())
                }
                Err(e) => check_error_size(e),
            },
        )?;
        match r {
            Ok(areas) => Ok(areas
                .into_iter()
                .map(|a| a.map_err(|e| self.plugin_error(e)))
                .collect()),
            Err(e) => Err(self.plugin_error(e)),
        }
    }
}

impl Session {
    /// Answers from `memo` where it has them; asks `fetch` for the rest (given their
    /// indices into `keys`) in one batch and remembers its answers.
    fn memoised<K: Eq + std::hash::Hash + Clone, V: Clone>(
        &self,
        memo: &quick_cache::sync::Cache<K, V>,
        keys: Vec<K>,
        fetch: impl FnOnce(&[usize]) -> Result<Vec<V>, EstimateError>,
    ) -> Result<Vec<V>, EstimateError> {
        let mut out: Vec<Option<V>> = vec![None; keys.len()];
        let mut missing = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            match memo.get(k) {
                Some(v) => out[i] = Some(v),
                None => missing.push(i),
            }
        }
        self.counters
            .memo_hits
            .fetch_add((keys.len() - missing.len()) as u64, Ordering::Relaxed);
        if !missing.is_empty() {
            let got = fetch(&missing)?;
            for (&i, v) in missing.iter().zip(&got) {
                memo.insert(keys[i].clone(), v.clone());
            }
            for (i, v) in missing.into_iter().zip(got) {
                out[i] = Some(v);
            }
        }
        out.into_iter()
            .map(|v| v.ok_or_else(|| EstimateError::Internal("memo hole".into())))
            .collect()
    }
}

impl AreaModel for Session {
    fn info(&self) -> ModelInfo {
        self.loaded.info.clone()
    }

    fn area_um2(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
        let Some(memo) = &self.memo else {
            return self.area_uncached(configs);
        };
        self.memoised(&memo.area, configs.to_vec(), |missing| {
            let ask: Vec<AcceleratorConfig> = missing.iter().map(|&i| configs[i]).collect();
            self.area_uncached(&ask)
        })
    }
}

impl LatencyModel for Session {
    fn info(&self) -> ModelInfo {
        self.loaded.info.clone()
    }

    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
        let Some(memo) = &self.memo else {
            return self.latency_uncached(core, ops);
        };
        let keys = ops.iter().map(|op| (*core, op.clone())).collect();
        self.memoised(&memo.latency, keys, |missing| {
            let ask: Vec<Op> = missing.iter().map(|&i| ops[i].clone()).collect();
            self.latency_uncached(core, &ask)
        })
    }
}
