//! The plugin host: cost models as sandboxed WebAssembly components.
//!
//! A plugin is a component of the `archplace:cost-model` world (`plugin-sdk/wit`). It gets
//! no capabilities: WASI is linked with an empty context (no files, network, environment
//! or arguments; stdio closed), and the only other import is a capped `log`. Every call
//! runs under limits ([`Limits`]): a fuel budget proportional to the batch, a wall-clock
//! deadline enforced through epoch interruption (whose callback also stops the call when
//! the search is cancelled), and a memory cap. A call that traps, runs out of fuel or time,
//! is refused memory or returns bad numbers is a *fault*: its instance is thrown away, the
//! call is retried on a fresh one, and the `max_faults`-th fault of a search fails the
//! search naming the plugin and the fault.
//!
//! * [`Host`] — the engine, linker, compiled-component caches and catalog;
//!   [`Host::load_file`] compiles (or loads from the [`cache`]) and inspects a component;
//! * [`session::Session`] — one plugin with its parameters for one search: a pool of
//!   instances behind the SDK's `AreaModel` and `LatencyModel`, used by the engine;
//! * [`catalog`] — plugin folders and manifests; [`check`] — `archplace plugin check`;
//! * the host is the application's [`CostModelSource`]: what a search asks for
//!   ([`CostModelSpec`]) and gets ([`CostModels`]) are the cost-model port's
//!   (`archplace-cost-port`).

// The host's API is what the service, the pool and the CLI use: every item says what it is.
#![deny(missing_docs)]

// In their order: each imports only those before it (ARCHITECTURE.md, invariant 19; a
// tidy test checks it). One per group: rustfmt would sort consecutive declarations.
mod bindings;

pub mod cache;

pub mod catalog;

pub mod check;

mod store;

mod inspect;

mod memo;

mod session;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
#[cfg(test)]
mod tests;

use archplace_cost_port::{
    CostModelError, CostModelSource, CostModelSpec, CostModels, ModelSource, PluginRef,
};
use archplace_plugin_sdk::{ModelInfo, Parameter, ParameterError};
use archplace_util::files;
use bindings::PluginPre;
use serde::{Deserialize, Serialize};
pub use session::{AREA_BATCH, Session};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use store::State;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

/// Interface major version this host implements; it loads every minor version of it.
pub const INTERFACE_MAJOR: u16 = archplace_plugin_sdk::INTERFACE_VERSION.0;
/// Largest `.wasm` file the host reads.
pub const MAX_COMPONENT_BYTES: u64 = 256 << 20;
/// How often the epoch ticks: the granularity of deadlines and cancellation.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Limits on every call into a plugin. Defaults suit the reference model with two orders
/// of magnitude to spare; a vendor's heavier model can be given more per plugin.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Fuel (≈ WebAssembly instructions) for one call, plus `fuel_per_item` per
    /// configuration or operator in its batch.
    pub fuel_per_call: u64,
    /// Fuel for each configuration or operator in a call's batch.
    pub fuel_per_item: u64,
    /// Wall-clock backstop of one call.
    pub deadline_seconds: f64,
    /// Linear memory of one instance.
    pub memory_bytes: u64,
    /// Instances of one plugin alive at once in one search.
    pub max_instances: usize,
    /// Faults of one plugin that fail a search.
    pub max_faults: u32,
}

/// The longest wall-clock deadline of one plugin call: a day. Beyond it a deadline is no
/// backstop at all, and [`Duration`] cannot hold every `f64` (1e30 s would panic).
pub const MAX_DEADLINE_SECONDS: f64 = 86_400.0;

/// The most linear memory an instance may have: 4 GiB, all that 32-bit WebAssembly
/// addresses.
pub const MAX_MEMORY_BYTES: u64 = 4 << 30;

impl Limits {
    /// What is wrong with these limits, as `(field, problem)` pairs; empty when they are
    /// usable. Config validation reports them, so a daemon never starts with a limit it
    /// cannot apply.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut e = Vec::new();
        let d = self.deadline_seconds;
        if !(d.is_finite() && d > 0.0 && d <= MAX_DEADLINE_SECONDS) {
            e.push((
                "deadline_seconds",
                format!(
                    "is {d}; must be more than 0 and at most {MAX_DEADLINE_SECONDS} seconds (a day)"
                ),
            ));
        }
        if self.fuel_per_call == 0 {
            e.push(("fuel_per_call", "must be at least 1".into()));
        }
        if !(64 << 10..=MAX_MEMORY_BYTES).contains(&self.memory_bytes) {
            e.push((
                "memory_bytes",
                format!(
                    "is {}; must be from 65536 (one WebAssembly page) to {MAX_MEMORY_BYTES} (4 GiB)",
                    self.memory_bytes
                ),
            ));
        }
        if !(1..=1024).contains(&self.max_instances) {
            e.push((
                "max_instances",
                format!("is {}; must be from 1 to 1024", self.max_instances),
            ));
        }
        if self.max_faults == 0 {
            e.push(("max_faults", "must be at least 1".into()));
        }
        e
    }

    /// The deadline as a [`Duration`], clamped to what [`Limits::problems`] accepts: never
    /// panics, whatever the field holds.
    pub fn deadline(&self) -> Duration {
        archplace_util::duration::clamped(self.deadline_seconds, 0.001, MAX_DEADLINE_SECONDS)
    }

    /// The fuel of one call over `items` configurations or operators.
    pub fn fuel_budget(&self, items: usize) -> u64 {
        self.fuel_per_call
            .saturating_add(self.fuel_per_item.saturating_mul(items as u64))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel_per_call: 50_000_000,
            fuel_per_item: 1_000_000,
            deadline_seconds: 10.0,
            memory_bytes: 64 << 20,
            max_instances: 8,
            max_faults: 3,
        }
    }
}

/// How the host is set up.
#[derive(Debug, Clone, Default)]
pub struct HostOptions {
    /// Folders of installed plugins, searched in order.
    pub plugin_dirs: Vec<PathBuf>,
    /// Compiled-component cache; `None` compiles every time.
    pub cache_dir: Option<PathBuf>,
    /// Limits of every plugin without its own.
    pub limits: Limits,
    /// Limits for particular plugins, by name.
    pub plugin_limits: BTreeMap<String, Limits>,
    /// Keep no memo of estimates: for callers that open sessions with many different
    /// parameters once each (calibration, error bars), whose memos would only grow.
    pub no_memo: bool,
}

impl HostOptions {
    /// The default folders and cache (see [`catalog::default_dirs`], [`cache::default_dir`]).
    pub fn defaults() -> Self {
        HostOptions {
            plugin_dirs: catalog::default_dirs(),
            cache_dir: cache::default_dir(),
            ..HostOptions::default()
        }
    }

    /// The limits of `plugin`: its own, or the common ones.
    pub fn limits_for(&self, plugin: &str) -> Limits {
        self.plugin_limits
            .get(plugin)
            .copied()
            .unwrap_or(self.limits)
    }
}

/// What went wrong with a plugin as a whole (a fault inside a call is a [`Fault`]).
#[derive(Debug, Clone, thiserror::Error)]
pub enum PluginError {
    /// The component's file cannot be read.
    #[error("cannot read {}: {message}", path.display())]
    Read {
        /// The component.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// It is not a component wasmtime compiles.
    #[error("{} is not a WebAssembly component archplace can compile: {message}", path.display())]
    Compile {
        /// The component.
        path: PathBuf,
        /// wasmtime's reason.
        message: String,
    },
    /// It was built for another major version of the interface.
    #[error("{} was built for {found}; this archplace supports archplace:cost-model {INTERFACE_MAJOR}.x (rebuild it with a {INTERFACE_MAJOR}.x archplace-plugin-sdk)", path.display())]
    InterfaceVersion {
        /// The component.
        path: PathBuf,
        /// The interface it exports.
        found: String,
    },
    /// It does not export the interface as the WIT says.
    #[error("{} does not implement archplace:cost-model/model {INTERFACE_MAJOR}.x: {message}", path.display())]
    Interface {
        /// The component.
        path: PathBuf,
        /// What is missing or different.
        message: String,
    },
    /// It cannot be instantiated.
    #[error("{} cannot be instantiated (it may import something archplace does not offer): {message}", path.display())]
    Instantiate {
        /// The component.
        path: PathBuf,
        /// wasmtime's reason.
        message: String,
    },
    /// Its `info` is unusable (no name, a bad version, parameters without defaults, …).
    #[error("{} describes itself badly: {message}", path.display())]
    BadInfo {
        /// The component.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A call faulted outside a search (loading, checking parameters).
    #[error("plugin `{plugin}` faulted while {during}: {fault}")]
    Fault {
        /// The plugin.
        plugin: String,
        /// What the host was asking of it.
        during: String,
        /// The fault.
        fault: Fault,
    },
    /// The plugin refuses the parameters a spec gives it.
    #[error("plugin `{plugin}` rejects its parameters: {}", errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Parameters {
        /// The plugin.
        plugin: String,
        /// Each parameter's problem, as the plugin words it.
        errors: Vec<ParameterError>,
    },
    /// The component is not the one a manifest or a spec pins.
    #[error("{} has blake3 {actual}, but {pinned_by} pins {expected}", path.display())]
    HashMismatch {
        /// The component.
        path: PathBuf,
        /// The pinned hash.
        expected: String,
        /// The component's hash.
        actual: String,
        /// Who pins it (a manifest, a spec).
        pinned_by: String,
    },
    /// A manifest is unusable.
    #[error("{}: {message}", manifest.display())]
    Manifest {
        /// The manifest.
        manifest: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The plugin a spec names is not installed in a matching version.
    #[error(transparent)]
    Find(#[from] catalog::FindError),
    /// wasmtime's engine cannot be made.
    #[error("cannot start the plugin host: {0}")]
    Engine(String),
}

/// Kinds of faults, for messages and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Ran out of its fuel budget (e.g. an endless loop).
    Fuel,
    /// Ran past the wall-clock deadline.
    Deadline,
    /// Was refused memory beyond its cap.
    Memory,
    /// Trapped (a Rust panic, an `unreachable`, an out-of-bounds access, ...).
    Trap,
    /// Returned numbers that cannot be costs, the wrong count, or oversized data.
    BadOutput,
    /// Stopped because its search was cancelled (not counted as a fault).
    Cancelled,
}

impl FaultKind {
    /// The kind's name in messages and the metrics' `kind` label.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Fuel => "fuel",
            FaultKind::Deadline => "deadline",
            FaultKind::Memory => "memory",
            FaultKind::Trap => "trap",
            FaultKind::BadOutput => "bad_output",
            FaultKind::Cancelled => "cancelled",
        }
    }
}

/// One fault of a plugin call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Fault {
    /// What kind of fault.
    pub kind: FaultKind,
    /// What happened, for people.
    pub message: String,
}

/// A component compiled and inspected, ready to instantiate.
pub struct Loaded {
    /// The component's file.
    pub path: PathBuf,
    /// Its blake3 hash.
    pub hash: blake3::Hash,
    /// What it says of itself.
    pub info: ModelInfo,
    /// The interface version its export names (e.g. `1.0.0`).
    pub interface: semver::Version,
    /// Compiling it (or loading it from the cache).
    pub compile_seconds: f64,
    /// Whether it came from the compiled-component cache.
    pub from_cache: bool,
    pub(crate) pre: PluginPre<State>,
    pub(crate) engine: Engine,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("path", &self.path)
            .field("hash", &self.hash.to_hex().to_string())
            .field("info", &self.info)
            .finish()
    }
}

/// Memoised estimates of one deterministic plugin with one set of parameters, shared by
/// every search that uses them.
pub type MemoKey = (blake3::Hash, Vec<Parameter>);

/// Where the host reports each plugin call and fault — the daemon's metrics. The
/// one-shot CLI and the tests have none.
pub trait Telemetry: Send + Sync {
    /// A call of `plugin` with `items` configurations or operators took `seconds`
    /// (whether it succeeded or faulted).
    fn call(&self, plugin: &str, seconds: f64, items: usize);
    /// A call of `plugin` faulted. Cancellations are not faults and are not reported.
    fn fault(&self, plugin: &str, kind: FaultKind);
}

/// The plugin host.
pub struct Host {
    engine: Engine,
    telemetry: Option<Arc<dyn Telemetry>>,
    linker: Linker<State>,
    cache: Option<cache::DiskCache>,
    compiled: Mutex<HashMap<blake3::Hash, Component>>,
    /// Components loaded, by hash: what [`CostModelSource::reconfigure`] reuses.
    loaded: Mutex<HashMap<blake3::Hash, Arc<Loaded>>>,
    memos: Mutex<HashMap<MemoKey, Arc<memo::Memo>>>,
    options: HostOptions,
    catalog: RwLock<catalog::Catalog>,
    ticker_stop: Arc<AtomicBool>,
}

impl Drop for Host {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

impl Host {
    /// A host with `options`: wasmtime's engine and linker, the compiled-component cache (if
    /// it can be used) and the epoch ticker.
    pub fn new(options: HostOptions) -> Result<Host, PluginError> {
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .consume_fuel(true)
            .epoch_interruption(true)
            .cranelift_opt_level(wasmtime::OptLevel::Speed);
        let engine = Engine::new(&config).map_err(|e| PluginError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| PluginError::Engine(format!("{e:#}")))?;
        bindings::CostModel::add_to_linker::<State, wasmtime::component::HasSelf<State>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| PluginError::Engine(format!("{e:#}")))?;
        let cache = match &options.cache_dir {
            Some(dir) => match cache::DiskCache::open(dir, &engine) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!("{e}; plugins will be compiled on every start");
                    None
                }
            },
            None => None,
        };
        // The epoch clock: deadlines and cancellation are checked at every tick.
        let ticker_stop = Arc::new(AtomicBool::new(false));
        {
            let engine = engine.clone();
            let stop = ticker_stop.clone();
            std::thread::Builder::new()
                .name("archplace-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| PluginError::Engine(format!("cannot start the epoch thread: {e}")))?;
        }
        let catalog = catalog::Catalog::scan(&options.plugin_dirs);
        Ok(Host {
            engine,
            telemetry: None,
            linker,
            cache,
            compiled: Mutex::new(HashMap::new()),
            loaded: Mutex::new(HashMap::new()),
            memos: Mutex::new(HashMap::new()),
            options,
            catalog: RwLock::new(catalog),
            ticker_stop,
        })
    }

    /// Reports every call and fault of the sessions opened from now on to `telemetry`.
    pub fn with_telemetry(mut self, telemetry: Arc<dyn Telemetry>) -> Host {
        self.telemetry = Some(telemetry);
        self
    }

    /// The options it was made with.
    pub fn options(&self) -> &HostOptions {
        &self.options
    }

    /// Rereads the plugin folders.
    pub fn rescan(&self) {
        let cat = catalog::Catalog::scan(&self.options.plugin_dirs);
        if let Ok(mut c) = self.catalog.write() {
            *c = cat;
        }
    }

    /// The plugins in its folders, as last scanned.
    pub fn catalog(&self) -> catalog::Catalog {
        self.catalog.read().map(|c| c.clone()).unwrap_or_default()
    }

    /// The compiled form of `wasm`: from memory, from the disk cache, or compiled now.
    fn compile(
        &self,
        path: &Path,
        wasm: &[u8],
        hash: &blake3::Hash,
    ) -> Result<(Component, bool), PluginError> {
        if let Some(c) = self.compiled.lock().ok().and_then(|m| m.get(hash).cloned()) {
            return Ok((c, true));
        }
        let mut from_cache = false;
        let mut component = None;
        if let Some(cache) = &self.cache
            && let Some(bytes) = cache.load(hash)
        {
            // SAFETY: `Component::deserialize` runs the bytes as machine code without
            // checking them. `DiskCache::load` only returns bytes whose keyed MAC verifies
            // under the cache's secret key, i.e. bytes that this program serialized from
            // a component it compiled itself, with this engine configuration (the
            // configuration hash is both in the file name and under the MAC), in a folder
            // it checked is private to its user.
            #[allow(unsafe_code)]
            let c = unsafe { Component::deserialize(&self.engine, &bytes) };
            match c {
                Ok(c) => {
                    component = Some(c);
                    from_cache = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "stale compiled-plugin cache entry; recompiling")
                }
            }
        }
        let component = match component {
            Some(c) => c,
            None => {
                let c = Component::new(&self.engine, wasm).map_err(|e| PluginError::Compile {
                    path: path.to_path_buf(),
                    message: format!("{e:#}"),
                })?;
                if let Some(cache) = &self.cache {
                    match c.serialize() {
                        Ok(bytes) => cache.store(hash, &bytes),
                        Err(e) => tracing::warn!(error = %e, "cannot serialize a compiled plugin"),
                    }
                }
                c
            }
        };
        if let Ok(mut m) = self.compiled.lock() {
            m.insert(*hash, component.clone());
        }
        Ok((component, from_cache))
    }

    /// Reads, compiles (or loads compiled) and inspects the component at `path`: checks
    /// its interface version and exports, instantiates it once under the default limits
    /// and asks for its `info`.
    pub fn load_file(&self, path: &Path) -> Result<Arc<Loaded>, PluginError> {
        let read = |message: String| PluginError::Read {
            path: path.to_path_buf(),
            message,
        };
        let wasm =
            files::read_regular(path, MAX_COMPONENT_BYTES).map_err(|e| read(e.to_string()))?;
        self.load_bytes(path, &wasm)
    }

    /// [`Host::load_file`] for bytes already read; `path` names them in messages.
    pub fn load_bytes(&self, path: &Path, wasm: &[u8]) -> Result<Arc<Loaded>, PluginError> {
        self.load_hashed(path, wasm, blake3::hash(wasm))
    }

    /// [`Host::load_bytes`] with the bytes' blake3 hash already computed.
    fn load_hashed(
        &self,
        path: &Path,
        wasm: &[u8],
        hash: blake3::Hash,
    ) -> Result<Arc<Loaded>, PluginError> {
        let t = Instant::now();
        let (component, from_cache) = self.compile(path, wasm, &hash)?;
        let interface = interface_version(&component, &self.engine, path)?;
        let pre =
            self.linker
                .instantiate_pre(&component)
                .map_err(|e| PluginError::Instantiate {
                    path: path.to_path_buf(),
                    message: format!("{e:#}"),
                })?;
        let pre = PluginPre::new(pre, u16::try_from(interface.minor).unwrap_or(u16::MAX)).map_err(
            |e| PluginError::Interface {
                path: path.to_path_buf(),
                message: format!("{e:#}"),
            },
        )?;
        let compile_seconds = t.elapsed().as_secs_f64();
        let shown = path.display().to_string();
        let info = inspect::probe_info(&self.engine, &pre, &self.options.limits, &shown).map_err(
            |fault| PluginError::Fault {
                plugin: shown.clone(),
                during: "describing itself (info)".into(),
                fault,
            },
        )?;
        inspect::check_info(&info, &interface).map_err(|message| PluginError::BadInfo {
            path: path.to_path_buf(),
            message,
        })?;
        let loaded = Arc::new(Loaded {
            path: path.to_path_buf(),
            hash,
            info,
            interface,
            compile_seconds,
            from_cache,
            pre,
            engine: self.engine.clone(),
        });
        if let Ok(mut m) = self.loaded.lock() {
            m.insert(hash, loaded.clone());
        }
        Ok(loaded)
    }

    /// Loads the plugin a spec names, checking its manifest and pins.
    pub fn load(&self, r: &PluginRef) -> Result<Arc<Loaded>, PluginError> {
        let entry = {
            let cat = self
                .catalog
                .read()
                .map_err(|_| PluginError::Engine("catalog lock poisoned".into()))?;
            cat.find(&r.name, r.version.as_deref())?.clone()
        };
        let unusable = |message: String| PluginError::Manifest {
            manifest: entry.manifest_path.clone(),
            message,
        };
        let real = catalog::component_path(&entry).map_err(unusable)?;
        let wasm = files::read_regular(&real, MAX_COMPONENT_BYTES).map_err(|e| {
            unusable(format!(
                "cannot read its component {}: {e}",
                entry.wasm_path.display()
            ))
        })?;
        let hash = blake3::hash(&wasm);
        let actual = hash.to_hex().to_string();
        for (pin, by) in [
            (
                entry.manifest.blake3.as_deref(),
                entry.manifest_path.display().to_string(),
            ),
            (r.blake3.as_deref(), "the spec".to_string()),
        ] {
            if let Some(expected) = pin
                && !expected.eq_ignore_ascii_case(&actual)
            {
                return Err(PluginError::HashMismatch {
                    path: entry.wasm_path.clone(),
                    expected: expected.to_string(),
                    actual,
                    pinned_by: by,
                });
            }
        }
        let loaded = self.load_hashed(&entry.wasm_path, &wasm, hash)?;
        if loaded.info.name != entry.manifest.name || loaded.info.version != entry.manifest.version
        {
            return Err(PluginError::Manifest {
                manifest: entry.manifest_path.clone(),
                message: format!(
                    "says `{}` {}, but the component says it is `{}` {}",
                    entry.manifest.name,
                    entry.manifest.version,
                    loaded.info.name,
                    loaded.info.version
                ),
            });
        }
        Ok(loaded)
    }

    /// A session of `loaded` with `parameters` for one search; fails if the plugin
    /// rejects them.
    pub fn open(
        &self,
        loaded: &Arc<Loaded>,
        parameters: Vec<Parameter>,
        cancel: Arc<AtomicBool>,
    ) -> Result<Arc<Session>, PluginError> {
        let limits = self.options.limits_for(&loaded.info.name);
        let memo = if loaded.info.deterministic && !self.options.no_memo {
            let key = (loaded.hash, parameters.clone());
            self.memos
                .lock()
                .ok()
                .map(|mut m| m.entry(key).or_default().clone())
        } else {
            None
        };
        Session::open(
            loaded.clone(),
            parameters,
            limits,
            cancel,
            memo,
            self.telemetry.clone(),
        )
    }
}

/// The version of `archplace:cost-model/model` the component exports.
fn interface_version(
    component: &Component,
    engine: &Engine,
    path: &Path,
) -> Result<semver::Version, PluginError> {
    let prefix = format!("{}/model@", archplace_plugin_sdk::WIT_PACKAGE);
    let ty = component.component_type();
    let names: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let Some(found) = names.iter().find_map(|n| n.strip_prefix(&prefix)) else {
        return Err(PluginError::Interface {
            path: path.to_path_buf(),
            message: if names.is_empty() {
                "it exports nothing".into()
            } else {
                format!("it exports {}", names.join(", "))
            },
        });
    };
    let v = semver::Version::parse(found).map_err(|e| PluginError::Interface {
        path: path.to_path_buf(),
        message: format!("export version `{found}`: {e}"),
    })?;
    if v.major != u64::from(INTERFACE_MAJOR) {
        return Err(PluginError::InterfaceVersion {
            path: path.to_path_buf(),
            found: format!("archplace:cost-model@{v}"),
        });
    }
    Ok(v)
}

impl CostModelSource for Host {
    fn memo_memory_bytes(&self) -> u64 {
        memo::memory_bytes()
    }

    fn instance_memory_bytes(&self, plugin: &str) -> u64 {
        let limits = self.options.limits_for(plugin);
        limits
            .memory_bytes
            .saturating_mul(limits.max_instances as u64)
    }

    fn resolve(
        &self,
        spec: &CostModelSpec,
        cancel: Arc<AtomicBool>,
    ) -> Result<CostModels, Vec<CostModelError>> {
        self.resolve_with(spec, cancel, &|r: &PluginRef| self.load(r))
    }

    fn reconfigure(
        &self,
        spec: &CostModelSpec,
        like: &CostModels,
        cancel: Arc<AtomicBool>,
    ) -> Result<CostModels, Vec<CostModelError>> {
        // The component `like` used for a plugin of the same name, as loaded then.
        let reuse = |r: &PluginRef| -> Result<Arc<Loaded>, PluginError> {
            let same = [&like.area_source, &like.latency_source]
                .into_iter()
                .find(|s| s.plugin == r.name)
                .and_then(|s| s.blake3.as_deref())
                .and_then(|h| blake3::Hash::from_hex(h).ok())
                .and_then(|h| self.loaded.lock().ok()?.get(&h).cloned());
            match same {
                Some(l) => Ok(l),
                None => self.load(r),
            }
        };
        self.resolve_with(spec, cancel, &reuse)
    }
}

impl Host {
    /// Opens the sessions of `spec`'s area and latency models on the components `load`
    /// gives, every problem reported.
    fn resolve_with(
        &self,
        spec: &CostModelSpec,
        cancel: Arc<AtomicBool>,
        load: &dyn Fn(&PluginRef) -> Result<Arc<Loaded>, PluginError>,
    ) -> Result<CostModels, Vec<CostModelError>> {
        let mut errors = Vec::new();
        let mut open = |role: &'static str, r: &PluginRef| -> Option<(Arc<Session>, ModelSource)> {
            let loaded = match load(r) {
                Ok(l) => l,
                Err(e) => {
                    errors.push(CostModelError::Plugin {
                        role,
                        plugin: r.name.clone(),
                        message: e.to_string(),
                    });
                    return None;
                }
            };
            let provides = if role == "area" {
                loaded.info.provides.area
            } else {
                loaded.info.provides.latency
            };
            if !provides {
                errors.push(CostModelError::Plugin {
                    role,
                    plugin: r.name.clone(),
                    message: format!("`{}` provides no {role} model", r.name),
                });
                return None;
            }
            let params = spec.parameters_of(&r.name);
            match self.open(&loaded, params, cancel.clone()) {
                Ok(s) => Some((
                    s,
                    ModelSource {
                        plugin: loaded.info.name.clone(),
                        version: loaded.info.version.clone(),
                        blake3: Some(loaded.hash.to_hex().to_string()),
                        path: Some(loaded.path.display().to_string()),
                    },
                )),
                Err(PluginError::Parameters {
                    plugin,
                    errors: errs,
                }) => {
                    errors.extend(errs.into_iter().map(|e| CostModelError::Parameter {
                        model: plugin.clone(),
                        parameter: e.name,
                        message: e.message,
                    }));
                    None
                }
                Err(e) => {
                    errors.push(CostModelError::Plugin {
                        role,
                        plugin: r.name.clone(),
                        message: e.to_string(),
                    });
                    None
                }
            }
        };
        let area = open("area", &spec.area);
        let latency = if spec.latency == spec.area && area.is_some() {
            area.clone()
        } else {
            open("latency", &spec.latency)
        };
        match (area, latency) {
            (Some((a, asrc)), Some((l, lsrc))) if errors.is_empty() => Ok(CostModels {
                area: a,
                latency: l,
                area_source: asrc,
                latency_source: lsrc,
            }),
            _ => {
                let mut out: Vec<CostModelError> = Vec::new();
                for e in errors {
                    if !out.contains(&e) {
                        out.push(e);
                    }
                }
                Err(out)
            }
        }
    }
}
