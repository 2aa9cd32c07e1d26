//! `archplace calibrate MEASUREMENTS`: fits the cost model's calibratable parameters to
//! measurements and writes a calibration file (docs/calibration.md).

use super::{Exit, print_json};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct CalibrateArgs {
    /// Measurements file (TOML; docs/calibration.md). Not needed with --schema.
    #[arg(required_unless_present = "schema")]
    pub measurements: Option<PathBuf>,
    /// Where to write the calibration (default: next to the measurements, named after
    /// them: `NAME.calibration.toml`).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print the calibration's summary as JSON on stdout (errors per source, parameters).
    #[arg(long)]
    pub json: bool,
    /// Print the JSON Schema of measurements files and exit.
    #[arg(long)]
    pub schema: bool,
}

pub fn run(args: &CalibrateArgs, plugins: &super::plugin::PluginArgs) -> Result<Exit> {
    if args.schema {
        let schema = schemars::schema_for!(archplace_calibrate::measurements::MeasurementsFile);
        print_json(&schema)?;
        return Ok(Exit::Success);
    }
    let path = args
        .measurements
        .as_deref()
        .context("give a measurements file")?;
    let mut options = plugins.options();
    // Every evaluation opens sessions with new parameters: no memo to grow.
    options.no_memo = true;
    let host = archplace_plugin_host::Host::new(options).context("starting the plugin host")?;
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    // Progress is for the person waiting: on stderr, whatever the log level (a write
    // error is not worth stopping the fit for).
    let progress = |line: &str| {
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    };
    let started = std::time::Instant::now();
    let file = archplace_calibrate::calibrate(path, &host, &date, &progress)?;
    let out = args.output.clone().unwrap_or_else(|| default_output(path));
    let text = file.to_toml().context("writing the calibration")?;
    archplace_util::atomic::write(&out, text.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    // What the calibration's own errors say against it, as `estimate` will repeat it.
    let verdicts = archplace_spec::calibration::Calibration::parse(&text)
        .map_err(|e| anyhow::anyhow!("reading back the calibration written: {e}"))?
        .verdicts();
    errln!(
        "calibrate: wrote {} ({:.1} s, {} evaluations)",
        out.display(),
        started.elapsed().as_secs_f64(),
        file.fit.evaluations
    );
    if args.json {
        let mut s = file.summary(&out);
        s["verdicts"] = serde_json::json!(verdicts);
        print_json(&s)?;
    } else {
        outln!("{}", file.render())?;
        for v in &verdicts {
            outln!("warning: {v}")?;
        }
    }
    Ok(Exit::Success)
}

/// `NAME.calibration.toml` next to `NAME.toml`.
fn default_output(measurements: &Path) -> PathBuf {
    let stem = measurements
        .file_stem()
        .map_or("measurements".into(), |s| s.to_string_lossy().into_owned());
    measurements.with_file_name(format!("{stem}.calibration.toml"))
}
