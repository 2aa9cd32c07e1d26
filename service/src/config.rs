//! The daemon's configuration: a TOML file (strict: unknown keys are errors, located by
//! line and column), every setting with a default, flags overriding the file.

use archplace_plugin_host::Limits;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The daemon's settings. Relative paths in a file are relative to the file's folder;
/// without a file, to the current folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// Folder watched for spec files (`*.toml`); created (with the default spec in it)
    /// when it does not exist.
    pub spec_dir: PathBuf,
    /// Root of result folders: `<results_dir>/<spec name>/<hash>/`.
    pub results_dir: PathBuf,
    /// Where job states are kept across restarts.
    pub state_dir: PathBuf,
    /// Plugin folders (default: the same as the CLI's).
    pub plugin_dirs: Option<Vec<PathBuf>>,
    /// Compiled-plugin cache (default: the same as the CLI's).
    pub cache_dir: Option<PathBuf>,
    /// Where a spec's `[cost_model] calibration` is looked for when it is not beside the
    /// spec (calibrations shared by the specs of a folder; docs/calibration.md).
    pub calibrations_dir: Option<PathBuf>,
    /// Address of the metrics endpoint (loopback by default).
    pub listen: String,
    /// Searches run at once (2 by default, so that one slow spec does not hold up the
    /// others).
    pub max_concurrent_searches: usize,
    /// Worker threads per search (0: all cores).
    pub threads_per_search: usize,
    /// The most memory one search may need (bytes), by the estimate made before it starts:
    /// a spec above it is refused with the numbers instead of searched (3 GiB by default).
    pub search_memory_bytes: u64,
    /// Most specs waiting to be searched; beyond it new specs wait in the folder.
    pub max_queue: usize,
    /// The largest spec file read (bytes; 1 MiB by default). A larger file is not read: it
    /// gets a job in state `invalid` with the reason in its `error.json`.
    pub max_spec_bytes: u64,
    /// How often the whole folder is rescanned.
    pub rescan_interval_seconds: f64,
    /// Poll the folder instead of watching it (for network filesystems, where change
    /// notifications do not arrive).
    pub poll: bool,
    /// How often the folder is polled in polling mode (and rechecked while a file settles).
    pub poll_interval_seconds: f64,
    /// A spec must be unchanged this long before it is read (protects against specs
    /// written in several steps without the rename protocol).
    pub settle_seconds: f64,
    /// After a search could not write its results (disk full, folder not writable), how
    /// long until it is tried again.
    pub retry_seconds: f64,
    /// What to log: a level (`error`, `warn`, `info`, `debug`, `trace`) or `tracing`
    /// directives (`info,archplace_plugin_host=debug`). `RUST_LOG` and `-v` take precedence.
    /// Applied again on SIGHUP.
    pub log_level: String,
    /// Limits of every plugin call.
    pub plugin_limits: Limits,
    /// Limits of particular plugins, by name (`[plugins.gpu-like] deadline_seconds = 30`).
    pub plugins: BTreeMap<String, Limits>,
    /// Searching with other daemons through NATS JetStream (`[pool] nats = "nats://…"`).
    pub pool: archplace_pool::PoolConfig,
}

/// The settings read once, when the daemon starts: folders, the listener, the workers, the
/// plugin host. A SIGHUP that changes one logs that it takes effect at the next start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StartSettings {
    pub spec_dir: PathBuf,
    pub results_dir: PathBuf,
    pub state_dir: PathBuf,
    pub plugin_dirs: Option<Vec<PathBuf>>,
    pub cache_dir: Option<PathBuf>,
    pub listen: String,
    pub max_concurrent_searches: usize,
    pub poll: bool,
    pub plugin_limits: Limits,
    pub plugins: BTreeMap<String, Limits>,
    pub pool: archplace_pool::PoolConfig,
}

/// The settings a SIGHUP applies to the running daemon.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveSettings {
    pub calibrations_dir: Option<PathBuf>,
    pub threads_per_search: usize,
    pub search_memory_bytes: u64,
    pub max_queue: usize,
    pub max_spec_bytes: u64,
    pub rescan_interval_seconds: f64,
    pub poll_interval_seconds: f64,
    pub settle_seconds: f64,
    pub retry_seconds: f64,
    pub log_level: String,
}

impl DaemonConfig {
    /// The settings by when they apply. Every field is named here (no `..`), so a new
    /// setting does not compile until it is put on one side — reload cannot drop it.
    pub fn split(self) -> (StartSettings, LiveSettings) {
        let DaemonConfig {
            spec_dir,
            results_dir,
            state_dir,
            plugin_dirs,
            cache_dir,
            calibrations_dir,
            listen,
            max_concurrent_searches,
            threads_per_search,
            search_memory_bytes,
            max_queue,
            max_spec_bytes,
            rescan_interval_seconds,
            poll,
            poll_interval_seconds,
            settle_seconds,
            retry_seconds,
            log_level,
            plugin_limits,
            plugins,
            pool,
        } = self;
        (
            StartSettings {
                spec_dir,
                results_dir,
                state_dir,
                plugin_dirs,
                cache_dir,
                listen,
                max_concurrent_searches,
                poll,
                plugin_limits,
                plugins,
                pool,
            },
            LiveSettings {
                calibrations_dir,
                threads_per_search,
                search_memory_bytes,
                max_queue,
                max_spec_bytes,
                rescan_interval_seconds,
                poll_interval_seconds,
                settle_seconds,
                retry_seconds,
                log_level,
            },
        )
    }
}

/// The keys whose values differ between `old` and `new` (compared in serialized form, so
/// the list follows the type's fields).
pub fn changed_keys<T: Serialize>(old: &T, new: &T) -> Vec<String> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return Vec::new();
    };
    a.keys()
        .chain(b.keys().filter(|k| !a.contains_key(*k)))
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// The daemon's log level unless the config, `-v` or `RUST_LOG` say otherwise. HiGHS
/// reports every MIP time-limit hit as a warning; the results and metrics count them.
pub const DEFAULT_LOG_LEVEL: &str = "info,highs=error";

/// The range of `max_spec_bytes`.
pub const MIN_SPEC_BYTES: u64 = 1 << 10;
pub const MAX_SPEC_BYTES_LIMIT: u64 = 16 << 20;

/// The smallest memory budget of one search: one thread's layer-schedule solver.
pub const MIN_SEARCH_MEMORY_BYTES: u64 = archplace_engine::search::memory::SOLVER_BYTES_PER_THREAD;

use archplace_util::duration::MAX_INTERVAL_SECONDS;

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            spec_dir: "specs".into(),
            results_dir: "results".into(),
            state_dir: ".archplace-state".into(),
            plugin_dirs: None,
            cache_dir: None,
            calibrations_dir: None,
            listen: "127.0.0.1:9464".into(),
            max_concurrent_searches: 2,
            threads_per_search: 0,
            search_memory_bytes: archplace_job::memory::DEFAULT_BUDGET_BYTES,
            max_queue: 10_000,
            max_spec_bytes: archplace_spec::MAX_SPEC_BYTES,
            rescan_interval_seconds: 30.0,
            poll: false,
            poll_interval_seconds: 0.5,
            settle_seconds: 1.0,
            retry_seconds: 60.0,
            log_level: DEFAULT_LOG_LEVEL.into(),
            plugin_limits: Limits::default(),
            plugins: BTreeMap::new(),
            pool: archplace_pool::PoolConfig::default(),
        }
    }
}

/// A located problem in a config file: a spec's diagnostic (file, line, column, the key,
/// what is wrong, what would be valid), rendered with its snippet.
pub type ConfigError = archplace_spec::Diagnostic;

impl DaemonConfig {
    /// Parses a config file's text; `file` names it in errors and anchors relative paths.
    /// Every problem comes in one run, as a spec's do: each value that cannot be read
    /// (located, unknown keys with a did-you-mean), and the rules between the values
    /// that could (a value that could not is left at its default, which they accept).
    pub fn parse(text: &str, file: &Path) -> Result<DaemonConfig, Vec<ConfigError>> {
        let shown = file.display().to_string();
        let (read, mut errors) = archplace_spec::read_toml::<DaemonConfig>(text, &shown);
        let Some(mut c) = read else {
            return Err(errors);
        };
        errors.extend(rule_errors(&c, text, &shown));
        if !errors.is_empty() {
            errors.sort_by_key(|d| (d.line, d.column));
            return Err(errors);
        }
        let base = file.parent().unwrap_or(Path::new("."));
        c.anchor(base);
        Ok(c)
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<DaemonConfig, Vec<ConfigError>> {
        let shown = path.display().to_string();
        let text = archplace_spec::read_input(path)
            .and_then(|b| {
                String::from_utf8(b).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text")
                })
            })
            .map_err(|e| {
                vec![ConfigError::new(
                    &shown,
                    "",
                    None,
                    String::new(),
                    format!("cannot read the config: {e}"),
                )]
            })?;
        Self::parse(&text, path)
    }

    fn anchor(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut self.spec_dir);
        fix(&mut self.results_dir);
        fix(&mut self.state_dir);
        if let Some(d) = &mut self.plugin_dirs {
            d.iter_mut().for_each(fix);
        }
        if let Some(d) = &mut self.calibrations_dir {
            fix(d);
        }
        if let Some(d) = &mut self.cache_dir {
            fix(d);
        }
        self.pool.anchor(base);
    }

    /// Rules between values: (key, problem).
    pub fn check(&self) -> Vec<(String, String)> {
        let mut e = Vec::new();
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            e.push((
                "listen",
                format!(
                    "`{}` is not an address and port, e.g. 127.0.0.1:9464",
                    self.listen
                ),
            ));
        }
        if self.max_concurrent_searches == 0 {
            e.push(("max_concurrent_searches", "must be at least 1".into()));
        }
        if self.max_queue == 0 {
            e.push(("max_queue", "must be at least 1".into()));
        }
        if !(MIN_SPEC_BYTES..=MAX_SPEC_BYTES_LIMIT).contains(&self.max_spec_bytes) {
            e.push((
                "max_spec_bytes",
                format!(
                    "is {}; must be from {MIN_SPEC_BYTES} (1 KiB) to {MAX_SPEC_BYTES_LIMIT} (16 MiB: a spec is a page of TOML, and each is held in memory while queued)",
                    self.max_spec_bytes
                ),
            ));
        }
        if self.search_memory_bytes < MIN_SEARCH_MEMORY_BYTES {
            e.push((
                "search_memory_bytes",
                format!(
                    "is {}; must be at least {MIN_SEARCH_MEMORY_BYTES} (32 MiB: one search thread's solver alone may need that)",
                    self.search_memory_bytes
                ),
            ));
        }
        for (key, v) in [
            ("rescan_interval_seconds", self.rescan_interval_seconds),
            ("poll_interval_seconds", self.poll_interval_seconds),
            ("retry_seconds", self.retry_seconds),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= MAX_INTERVAL_SECONDS) {
                e.push((
                    key,
                    format!("is {v}; must be more than 0 and at most {MAX_INTERVAL_SECONDS} seconds (a week)"),
                ));
            }
        }
        let settle = self.settle_seconds;
        if !(settle.is_finite() && (0.0..=MAX_INTERVAL_SECONDS).contains(&settle)) {
            e.push((
                "settle_seconds",
                format!("is {settle}; must be from 0 to {MAX_INTERVAL_SECONDS} seconds (a week)"),
            ));
        }
        if let Err(err) = tracing_subscriber::EnvFilter::builder().parse(&self.log_level) {
            e.push((
                "log_level",
                format!(
                    "`{}` is not a level or a list of tracing directives ({err}); e.g. \"info\" or \"info,archplace_plugin_host=debug\"",
                    self.log_level
                ),
            ));
        }
        let mut e: Vec<(String, String)> = e.into_iter().map(|(k, m)| (k.to_string(), m)).collect();
        for (field, problem) in self.plugin_limits.problems() {
            e.push((format!("plugin_limits.{field}"), problem));
        }
        for (plugin, limits) in &self.plugins {
            for (field, problem) in limits.problems() {
                e.push((format!("plugins.{plugin}.{field}"), problem));
            }
        }
        e.extend(self.pool.check());
        e
    }
}

impl StartSettings {
    /// The plugin host's options for this config.
    pub fn host_options(&self) -> archplace_plugin_host::HostOptions {
        let mut o = archplace_plugin_host::HostOptions::defaults();
        if let Some(d) = &self.plugin_dirs {
            o.plugin_dirs = d.clone();
        }
        if let Some(d) = &self.cache_dir {
            o.cache_dir = Some(d.clone());
        }
        o.limits = self.plugin_limits;
        o.plugin_limits = self.plugins.clone();
        o
    }
}

/// The problems [`DaemonConfig::check`] finds, located at their keys in `text`.
fn rule_errors(c: &DaemonConfig, text: &str, file: &str) -> Vec<ConfigError> {
    c.check()
        .into_iter()
        .map(|(key, message)| {
            archplace_spec::diagnostic_at_key(text, file, &key, format!("{key}: {message}"), None)
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_is_valid_and_paths_are_anchored() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/archplace.toml");
        let c = DaemonConfig::load(&path).unwrap();
        assert!(c.spec_dir.starts_with(path.parent().unwrap()));
        // The calibrations folder too; it is reloaded with SIGHUP.
        let c = DaemonConfig::parse(
            "calibrations_dir = \"calibrations\"\n",
            Path::new("/etc/archplace/d.toml"),
        )
        .unwrap();
        assert_eq!(
            c.calibrations_dir.as_deref(),
            Some(Path::new("/etc/archplace/calibrations"))
        );
        assert!(c.split().1.calibrations_dir.is_some());
    }

    /// `[pool]`: every limit refused where it is written, paths anchored to the file.
    #[test]
    fn pool_settings_are_checked_and_located() {
        let text = "[pool]\nnats = \" \"\nitem_candidates = 0\nlook_ahead_items = 5000\n\
                    ack_wait_seconds = 0.5\nmax_deliveries = 0\ntls_cert_file = \"c.pem\"\n";
        let e = DaemonConfig::parse(text, Path::new("d.toml")).unwrap_err();
        let at = |key: &str| {
            e.iter()
                .find(|e| e.message.starts_with(&format!("pool.{key}: ")))
                .map(|e| e.line)
                .unwrap_or_else(|| panic!("no error for {key}: {e:?}"))
        };
        assert_eq!(at("nats"), 2);
        assert_eq!(at("item_candidates"), 3);
        assert_eq!(at("look_ahead_items"), 4);
        assert_eq!(at("ack_wait_seconds"), 5);
        assert_eq!(at("max_deliveries"), 6);
        assert_eq!(at("tls_cert_file"), 7);
        assert_eq!(e.len(), 6, "{e:?}");
        let ok = DaemonConfig::parse(
            "[pool]\nnats = \"nats://n:4222\"\ncredentials_file = \"x.creds\"\n",
            Path::new("/etc/archplace/d.toml"),
        )
        .unwrap();
        assert_eq!(
            ok.pool.credentials_file.as_deref(),
            Some(Path::new("/etc/archplace/x.creds"))
        );
        // Without the section: no pool, and the defaults the docs give.
        let none = DaemonConfig::parse("", Path::new("d.toml")).unwrap();
        assert_eq!(none.pool, archplace_pool::PoolConfig::default());
        assert!(none.pool.nats.is_none());
    }

    /// The Kubernetes deployment's shared config (deploy/kubernetes) is one this daemon
    /// accepts, and it joins a pool.
    #[test]
    fn the_kubernetes_config_map_holds_a_valid_pool_config() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/kubernetes/archplace-config.yaml");
        let doc: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let text = doc["data"]["archplace.toml"].as_str().unwrap();
        let c = DaemonConfig::parse(text, Path::new("/etc/archplace/archplace.toml")).unwrap();
        assert!(c.pool.nats.is_some());
        assert!(c.listen.starts_with("0.0.0.0:"), "probes reach it");
    }

    #[test]
    fn errors_are_located() {
        let e = DaemonConfig::parse(
            "spec_dir = \"s\"\nlisten = \"anywhere\"\n",
            Path::new("d.toml"),
        )
        .unwrap_err();
        // At the value, as spec errors are (the parsed document's spans).
        assert_eq!((e[0].line, e[0].column), (2, 10));
        assert!(e[0].message.contains("not an address"), "{e:?}");
        let e = DaemonConfig::parse("spec_dri = \"s\"\n", Path::new("d.toml")).unwrap_err();
        assert_eq!((e[0].line, e[0].column), (1, 1));
        assert!(e[0].message.contains("unknown key `spec_dri`"), "{e:?}");
        assert!(
            e[0].help
                .as_deref()
                .unwrap_or("")
                .contains("did you mean `spec_dir`"),
            "{e:?}"
        );
        let e = DaemonConfig::parse(
            "[plugins.x]\nfuel_per_call = \"lots\"\n",
            Path::new("d.toml"),
        )
        .unwrap_err();
        assert_eq!(e[0].line, 2, "{e:?}");
    }

    #[test]
    fn log_levels_are_checked_and_located() {
        let c = DaemonConfig::parse(
            "log_level = \"info,archplace_plugin_host=debug\"\n",
            Path::new("d.toml"),
        )
        .unwrap();
        assert_eq!(c.log_level, "info,archplace_plugin_host=debug");
        let e = DaemonConfig::parse(
            "spec_dir = \"s\"\nlog_level = \"loud=verbose\"\n",
            Path::new("d.toml"),
        )
        .unwrap_err();
        assert_eq!((e[0].line, e[0].column), (2, 13), "{e:?}");
        assert!(
            e[0].message.starts_with("log_level: `loud=verbose`"),
            "{e:?}"
        );
        assert_eq!(DaemonConfig::default().log_level, DEFAULT_LOG_LEVEL);
    }

    /// Values the checks once let through panicked the daemon when
    /// they became a `Duration` (`settle_seconds = 1e30`) or its search threads
    /// (`[plugin_limits] deadline_seconds = 1e30`). Now each is refused where it is written.
    #[test]
    fn durations_beyond_what_the_daemon_can_wait_are_refused_with_their_place() {
        let text = "settle_seconds = 1e30\nrescan_interval_seconds = 1e20\nretry_seconds = inf\n\
                    [plugin_limits]\ndeadline_seconds = 1e30\n\
                    [plugins.gpu-like]\ndeadline_seconds = nan\nmemory_bytes = 1\n";
        let e = DaemonConfig::parse(text, Path::new("d.toml")).unwrap_err();
        let at = |key: &str| {
            e.iter()
                .find(|e| e.message.starts_with(&format!("{key}: ")))
                .map(|e| e.line)
                .unwrap_or_else(|| panic!("no error for {key}: {e:?}"))
        };
        assert_eq!(at("settle_seconds"), 1);
        assert_eq!(at("rescan_interval_seconds"), 2);
        assert_eq!(at("retry_seconds"), 3);
        assert_eq!(at("plugin_limits.deadline_seconds"), 5);
        assert_eq!(at("plugins.gpu-like.deadline_seconds"), 7);
        assert_eq!(at("plugins.gpu-like.memory_bytes"), 8);
        assert_eq!(e.len(), 6, "{e:?}");
        // The largest accepted values are usable durations.
        let ok = DaemonConfig::parse(
            "settle_seconds = 604800\n[plugin_limits]\ndeadline_seconds = 86400\n",
            Path::new("d.toml"),
        )
        .unwrap();
        assert_eq!(
            archplace_util::duration::interval(ok.settle_seconds).as_secs(),
            604_800
        );
        assert_eq!(ok.plugin_limits.deadline().as_secs(), 86_400);
        // And the conversions never panic, whatever they are given.
        for v in [f64::NAN, f64::INFINITY, -1.0, 1e300] {
            let _ = archplace_util::duration::interval(v);
            let l = Limits {
                deadline_seconds: v,
                ..Limits::default()
            };
            let _ = l.deadline();
        }
    }
}
