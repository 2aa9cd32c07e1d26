//! Subcommands of the `archplace` binary. Output goes to stdout; logs and human notes to
//! stderr.

pub mod bench;
pub mod daemon;
pub mod model;
pub mod placement;
pub mod plugin;
pub mod run;
pub mod schedule;
pub mod space;
pub mod validate;

use anyhow::{Context, Result};
use archplace::spec::{self, Spec};
use std::io::Write;
use std::path::Path;

/// Logs to stderr: warnings by default (`info` for the daemon, whose log is its output),
/// more with `-v`; `RUST_LOG` overrides.
pub fn init_logging(verbose: u8, daemon: bool) {
    // HiGHS reports every MIP time-limit hit as a warning; the results count them.
    let default = match verbose {
        0 if daemon => "info,highs=error",
        0 => "warn,highs=error",
        1 => "debug,highs=warn",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Loads the spec at `path`, or the embedded default. Invalid specs print their located
/// errors on stderr.
pub fn load_spec(path: Option<&Path>) -> Result<Spec> {
    match path {
        Some(p) => spec::load(p).map_err(|e| {
            eprint!("{}", e.render());
            anyhow::anyhow!("{e}")
        }),
        None => {
            tracing::info!("using the embedded default spec");
            spec::default_spec().map_err(|diags| {
                for d in &diags {
                    eprint!("{}", d.render(spec::DEFAULT_SPEC));
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
    host: &archplace::plugin::Host,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<archplace::cost::CostModels> {
    spec::resolve_cost_models(spec, host, cancel).map_err(|diags| {
        for d in &diags {
            eprint!("{}", d.render(&spec.source_text));
        }
        anyhow::anyhow!("{} error(s) in the spec's cost models", diags.len())
    })
}

/// Writes `value` as pretty JSON and a newline to stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value).context("writing JSON")?;
    writeln!(out).context("writing to stdout")?;
    Ok(())
}

/// `1234567` → `"1,234,567"`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands() {
        assert_eq!(super::thousands(0), "0");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(1_234_567), "1,234,567");
    }
}
