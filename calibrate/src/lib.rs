//! Calibration and error bars.
//!
//! `archplace calibrate MEASUREMENTS` fits the parameters a cost model declares calibratable
//! (interface 1.3) and the cluster's collective efficiencies to measurements — end-to-end
//! training steps and single operators — and writes a calibration file: factors on the
//! parameters' values, each measurement's residual before and after, cross-validated
//! errors (leave one out, leave one source out), the parameters' bootstrap uncertainty and
//! the provenance. A spec applies a calibration with `[cost_model] calibration`, and
//! estimates and searches turn its uncertainty, or ranges a spec declares, into intervals
//! ([`interval`]).
//!
//! In pipeline order the modules are: [`measurements`] (the file), [`parallel`] (independent
//! evaluations at once), [`problem`] (the exact
//! model of each measurement under factors), [`linear`] (its linearisation and robust
//! minimisation), [`fit`] (the fit, cross-validation, bootstrap), [`report`] (the file
//! written), [`interval`] (Monte Carlo over the uncertainty).

// In their order: each imports only those before it (ARCHITECTURE.md, invariant 19; a
// tidy test checks it). One per group: rustfmt would sort consecutive declarations.
pub mod linear;

pub mod measurements;

pub mod parallel;

pub mod problem;

pub mod fit;

pub mod interval;

pub mod report;

pub use fit::{Fit, Options};
pub use measurements::{Loaded, MeasurementsError};
pub use problem::{CalibrateError, Problem};
pub use report::CalibrationFile;

use archplace_cost_port::CostModelSource;
use std::path::Path;

/// Why `archplace calibrate` failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Measurements(#[from] MeasurementsError),
    #[error(transparent)]
    Calibrate(#[from] CalibrateError),
    #[error("{0}")]
    Settings(String),
}

/// Reads the measurements at `path`, fits, cross-validates and bootstraps, and returns
/// the calibration file; `date` is recorded as the provenance's (the caller's clock).
pub fn calibrate(
    path: &Path,
    source: &dyn CostModelSource,
    date: &str,
    progress: fit::Progress<'_>,
) -> Result<CalibrationFile, Error> {
    let loaded = measurements::load(path)?;
    let s = &loaded.settings;
    let options = Options {
        robust_scale: s.robust_scale.unwrap_or(0.05),
        bootstrap: s.bootstrap.unwrap_or(200),
        seed: s.seed.unwrap_or(1),
    };
    if !(options.robust_scale.is_finite()
        && options.robust_scale > 0.0
        && options.robust_scale <= 1.0)
    {
        return Err(Error::Settings(format!(
            "[calibrate] robust_scale {}: give a number in (0, 1]",
            options.robust_scale
        )));
    }
    if options.bootstrap > 10_000 {
        return Err(Error::Settings(format!(
            "[calibrate] bootstrap {}: at most 10,000 refits",
            options.bootstrap
        )));
    }
    let problem = Problem::new(source, &loaded.measurements, s.fit.as_deref())?;
    let fit = fit::fit(&problem, options, progress)?;
    Ok(CalibrationFile::new(
        &problem,
        &fit,
        options,
        report::Provenance {
            measurements_blake3: loaded.blake3.clone(),
            measurements_file: path.display().to_string(),
            archplace_version: env!("CARGO_PKG_VERSION").into(),
            date: date.into(),
        },
    ))
}

#[cfg(test)]
mod tests;
