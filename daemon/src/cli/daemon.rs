//! `archplace daemon` and `archplace validate --config`.

use super::{Exit, print_json};
use anyhow::{Context, Result};
use archplace_service::config::DaemonConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Flags (and environment variables) override the config file.
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonArgs {
    /// Config file (TOML; see config/archplace.toml). Without it, every setting has its
    /// default and paths are relative to the current folder.
    #[arg(long, env = "ARCHPLACE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Folder of spec files to watch.
    #[arg(long, env = "ARCHPLACE_SPEC_DIR", value_name = "DIR")]
    pub spec_dir: Option<PathBuf>,
    /// Root of result folders.
    #[arg(long, env = "ARCHPLACE_RESULTS_DIR", value_name = "DIR")]
    pub results_dir: Option<PathBuf>,
    /// Where job states are kept.
    #[arg(long, env = "ARCHPLACE_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Metrics address (`127.0.0.1:0` takes a free port).
    #[arg(long, env = "ARCHPLACE_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// Searches at once.
    #[arg(long, value_name = "N")]
    pub max_concurrent_searches: Option<usize>,
    /// Poll the spec folder instead of watching it (network filesystems).
    #[arg(long)]
    pub poll: bool,
    /// Seconds before a search that could not write its results is tried again.
    #[arg(long, value_name = "SECONDS")]
    pub retry_seconds: Option<f64>,
    /// Seconds a spec must be unchanged before it is read.
    #[arg(long, value_name = "SECONDS")]
    pub settle_seconds: Option<f64>,
    /// Join the pool of daemons on this NATS server (JetStream enabled), e.g.
    /// nats://10.0.0.5:4222: specs dropped here are searched by the whole pool, and this
    /// daemon evaluates the pool's work items (`[pool]` in the config has the rest).
    #[arg(long, env = "ARCHPLACE_NATS", value_name = "URL")]
    pub nats: Option<String>,
    /// NATS credentials file (JWT and nkey seed).
    #[arg(long, env = "ARCHPLACE_NATS_CREDENTIALS", value_name = "FILE")]
    pub nats_credentials: Option<PathBuf>,
    /// CA certificate (PEM) to verify the NATS server's TLS certificate with.
    #[arg(long, env = "ARCHPLACE_NATS_CA", value_name = "FILE")]
    pub nats_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS with the NATS server (with --nats-key).
    #[arg(
        long,
        env = "ARCHPLACE_NATS_CERT",
        value_name = "FILE",
        requires = "nats_key"
    )]
    pub nats_cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(
        long,
        env = "ARCHPLACE_NATS_KEY",
        value_name = "FILE",
        requires = "nats_cert"
    )]
    pub nats_key: Option<PathBuf>,
    /// Threads this daemon evaluates pool items on (0: all cores).
    #[arg(long, env = "ARCHPLACE_POOL_THREADS", value_name = "N")]
    pub pool_threads: Option<usize>,
    /// This daemon's name in the pool (default: host name and process id).
    #[arg(long, env = "ARCHPLACE_POOL_NAME", value_name = "NAME")]
    pub pool_name: Option<String>,
}

fn config_of(args: &DaemonArgs, plugins: &super::plugin::PluginArgs) -> Result<DaemonConfig> {
    let mut c = match &args.config {
        // Every error in the one message: at start `main` prints it, at a reload the
        // service logs it as a field of its event (also in JSON logs), not as loose lines.
        Some(p) => DaemonConfig::load(p).map_err(|errs| {
            let all: Vec<String> = errs.iter().map(ToString::to_string).collect();
            anyhow::anyhow!(
                "{} error(s) in {}: {}",
                errs.len(),
                p.display(),
                all.join("; ")
            )
        })?,
        None => DaemonConfig::default(),
    };
    if let Some(d) = &args.spec_dir {
        c.spec_dir = d.clone();
    }
    if let Some(d) = &args.results_dir {
        c.results_dir = d.clone();
    }
    if let Some(d) = &args.state_dir {
        c.state_dir = d.clone();
    }
    if let Some(l) = &args.listen {
        c.listen = l.clone();
    }
    if let Some(n) = args.max_concurrent_searches {
        c.max_concurrent_searches = n;
    }
    if args.poll {
        c.poll = true;
    }
    if let Some(s) = args.retry_seconds {
        c.retry_seconds = s;
    }
    if let Some(s) = args.settle_seconds {
        c.settle_seconds = s;
    }
    if let Some(u) = &args.nats {
        c.pool.nats = Some(u.clone());
    }
    for (flag, key) in [
        (&args.nats_credentials, &mut c.pool.credentials_file),
        (&args.nats_ca, &mut c.pool.tls_ca_file),
        (&args.nats_cert, &mut c.pool.tls_cert_file),
        (&args.nats_key, &mut c.pool.tls_key_file),
    ] {
        if let Some(f) = flag {
            *key = Some(f.clone());
        }
    }
    if let Some(n) = args.pool_threads {
        c.pool.worker_threads = n;
    }
    if let Some(n) = &args.pool_name {
        c.pool.name = Some(n.clone());
    }
    if !plugins.plugin_dirs.is_empty() {
        c.plugin_dirs = Some(plugins.plugin_dirs.clone());
    }
    if let Some(d) = &plugins.cache_dir {
        c.cache_dir = Some(archplace_plugin_host::cache::dir_in(d));
    }
    let problems = c.check();
    if !problems.is_empty() {
        for (k, m) in &problems {
            errln!("error: {k}: {m}");
        }
        anyhow::bail!("invalid daemon settings");
    }
    Ok(c)
}

pub fn run(
    args: &DaemonArgs,
    plugins: &super::plugin::PluginArgs,
    logging: Option<super::Logging>,
) -> Result<Exit> {
    let config = config_of(args, plugins)?;
    if let Some(l) = &logging {
        l.set_level(&config.log_level);
    }
    let shutdown = Arc::new(AtomicBool::new(false));
    let reload = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone())
        .context("installing signal handlers")?;
    let (a, p) = (args.clone(), plugins.clone());
    // SIGHUP: the new config's log level applies at once.
    let load = Box::new(move || {
        let c = config_of(&a, &p).map_err(|e| format!("{e:#}"))?;
        if let Some(l) = &logging {
            l.set_level(&c.log_level);
        }
        Ok(c)
    });
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // A second signal while shutting down ends the process at once.
        signal_hook::flag::register_conditional_shutdown(sig, 1, shutdown.clone())
            .context("installing signal handlers")?;
        signal_hook::flag::register(sig, shutdown.clone()).context("installing signal handlers")?;
    }
    let signals = archplace_service::Signals {
        shutdown,
        reload,
        load,
    };
    archplace_service::run(config, signals).context("the daemon failed")?;
    Ok(Exit::Success)
}

pub fn validate_config(path: &Path, json: bool) -> Result<Exit> {
    match DaemonConfig::load(path) {
        Ok(c) => {
            if json {
                print_json(&serde_json::json!([]))?;
            } else {
                outln!(
                    "ok: {} (watches {}, writes {})",
                    path.display(),
                    c.spec_dir.display(),
                    c.results_dir.display()
                )?;
            }
            Ok(Exit::Success)
        }
        Err(errs) => {
            if json {
                print_json(&errs)?;
            } else {
                // With their snippets, as a spec's errors are shown.
                let text = archplace_spec::read_input(path)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                for e in &errs {
                    err!("{}", e.render(&text));
                }
                errln!("{} error(s)", errs.len());
            }
            Ok(Exit::Problems)
        }
    }
}
