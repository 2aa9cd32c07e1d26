//! Subcommands of the `archplace` binary. Output goes to stdout; logs and human notes to
//! stderr.

/// `println!` that returns an error instead of panicking when stdout is closed (a pipe
/// whose reader has gone): the caller's `?` carries it to `main`, which ends quietly.
/// stdout carries a command's output and nothing else.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// A line for people on stderr (errors, notes, progress): `eprintln!` that never panics —
/// a closed stderr leaves nobody to tell.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// Text for people on stderr, without a newline (rendered diagnostics end their own lines).
macro_rules! err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr().lock(), $($arg)*);
    }};
}

// In their order: each imports only those before it (ARCHITECTURE.md, invariant 19; a
// tidy test checks it). One per group: rustfmt would sort consecutive declarations.
pub mod plugin_new;

pub mod plugin;

pub mod calibrate;

pub mod daemon;

pub mod estimate;

pub mod explain;

pub mod model;

pub mod placement;

pub mod run;

pub mod schedule;

pub mod space;

pub mod stacks;

pub mod validate;

use anyhow::{Context, Result};
use archplace_spec::{self as spec, Spec};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// How a command ends, as its exit status. An error (`Err`) ends with 1 and its message on
/// stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It did what was asked: 0.
    Success,
    /// The input has problems, each reported (`validate`, `plugin check`): 1.
    Problems,
    /// The plan cannot run, or no candidate can train the models (`estimate`, `run`): 3.
    Infeasible,
    /// Stopped by Ctrl-C or SIGTERM: 130 (128 + SIGINT, as shells report it).
    Interrupted,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Problems => 1,
            Exit::Infeasible => 3,
            Exit::Interrupted => 130,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// The largest input in the reference system's formats that is read (`placement`,
/// `schedule`): a GPT-3-sized placement input is about 100 KB.
pub const MAX_REFERENCE_INPUT_BYTES: u64 = 64 << 20;

/// The text of a file a user named: a regular file of at most `cap` bytes, UTF-8.
pub fn read_text(path: &Path, cap: u64) -> Result<String> {
    let bytes = archplace_util::files::read_regular(path, cap)
        .with_context(|| format!("cannot read {}", path.display()))?;
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

/// A size on the command line: "8 GiB", "512 MiB", or bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    archplace_plugin_sdk::units::parse_bytes(s).map_err(|e| e.to_string())
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human lines, coloured on a terminal.
    #[default]
    Text,
    /// One JSON object per line, with the current span's fields (e.g. the search's spec
    /// name and hash) — for log shippers.
    Json,
}

/// The running subscriber's level filter, replaceable (the daemon's config sets it, and
/// SIGHUP sets it again).
#[derive(Clone)]
pub struct Logging {
    handle: tracing_subscriber::reload::Handle<
        tracing_subscriber::EnvFilter,
        tracing_subscriber::Registry,
    >,
    /// `RUST_LOG` or `-v` chose the level: the config does not override them.
    fixed: bool,
}

impl Logging {
    /// Applies `directives` (a config's `log_level`) unless `RUST_LOG` or `-v` chose.
    pub fn set_level(&self, directives: &str) {
        if self.fixed {
            tracing::debug!("log level from RUST_LOG or -v; the config's `log_level` is not used");
            return;
        }
        match tracing_subscriber::EnvFilter::builder().parse(directives) {
            Ok(f) => {
                if let Err(e) = self.handle.reload(f) {
                    tracing::warn!("cannot change the log level: {e}");
                }
            }
            Err(e) => tracing::warn!("log level `{directives}`: {e}"),
        }
    }
}

/// Logs to stderr: warnings by default (`info` for the daemon, whose log is its output,
/// or its config's `log_level`), more with `-v`; `RUST_LOG` overrides all.
pub fn init_logging(verbose: u8, daemon: bool, format: LogFormat) -> Option<Logging> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // -v and -vv are archplace's own events; wasmtime's, cranelift's and hyper's internals
    // only at -vvv (or with RUST_LOG).
    const OURS: &str = "archplace=LEVEL,archplace_engine=LEVEL,archplace_plugin_host=LEVEL,archplace_plugin_sdk=LEVEL";
    let ours = |level: &str| format!("warn,highs=warn,{}", OURS.replace("LEVEL", level));
    let default = match verbose {
        0 if daemon => archplace_service::config::DEFAULT_LOG_LEVEL.to_string(),
        // HiGHS reports every MIP time-limit hit as a warning; the results count them.
        0 => "warn,highs=error".to_string(),
        1 => ours("debug"),
        2 => ours("trace"),
        _ => "trace".to_string(),
    };
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let fixed = from_env.is_some() || verbose > 0;
    let filter = from_env.unwrap_or_else(|| tracing_subscriber::EnvFilter::new(&default));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(std::io::stderr)
    });
    let text = (format == LogFormat::Text).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(colour())
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(json)
        .with(text)
        .try_init()
        .ok()
        .map(|()| Logging { handle, fixed })
}

/// Whether stderr gets colour: a terminal, and no `NO_COLOR` (https://no-color.org: set
/// and not empty).
pub fn colour() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Loads the spec at `path`, or the embedded default. Invalid specs print their located
/// errors on stderr — with `plugins`, also those of the plugins an invalid spec names (as
/// [`spec::load_with_plugins`]), so that every mistake comes in one run.
pub fn load_spec(path: Option<&Path>, plugins: Option<&plugin::PluginArgs>) -> Result<Spec> {
    match path {
        Some(p) => {
            // A good spec needs no plugin host here (the command starts its own); an
            // invalid one is read again with the plugins it names, so that their problems
            // are in the same report.
            let loaded = match (spec::load(p), plugins) {
                (Err(spec::LoadError::Invalid { .. }), Some(plugins)) => {
                    spec::load_with_plugins(p, &plugins.host()?, Default::default())
                }
                (loaded, _) => loaded,
            };
            loaded.map_err(|e| {
                err!("{}", e.render());
                anyhow::anyhow!("{e}")
            })
        }
        None => {
            tracing::info!("using the embedded default spec");
            spec::default_spec().map_err(|diags| {
                for d in &diags {
                    err!("{}", d.render(spec::DEFAULT_SPEC));
                }
                anyhow::anyhow!("the embedded default spec is invalid")
            })
        }
    }
}

/// Resolves the spec's cost models with the plugin host; problems are printed located in
/// the spec, as a spec error would be.
pub fn cost_models(
    spec: &Spec,
    host: &archplace_plugin_host::Host,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<archplace_cost_port::CostModels> {
    spec::resolve_cost_models(spec, host, cancel).map_err(|diags| {
        for d in &diags {
            err!("{}", d.render(&spec.source_text));
        }
        anyhow::anyhow!("{} error(s) in the spec's cost models", diags.len())
    })
}

/// Whether `e` is stdout's reader going away (EPIPE), which ends a command successfully.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    let pipe = Some(std::io::ErrorKind::BrokenPipe);
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().map(std::io::Error::kind) == pipe
            // serde_json wraps the writer's error in its own.
            || c.downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == pipe
    })
}

/// Writes `value` as pretty JSON and a newline to stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value).context("writing JSON")?;
    writeln!(out).context("writing to stdout")?;
    Ok(())
}

pub use archplace_plugin_sdk::text::thousands;
