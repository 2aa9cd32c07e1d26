//! Pictures of a finished search, written next to `result.json`:
//! * `pareto.svg` — throughput against chip area for every evaluated candidate, with the
//!   Pareto frontier, the best configuration and the reference configuration;
//! * `placement.svg` — the best training plan of each model: its pipeline stages with
//!   their layers and devices, and each stage's time and memory against the HBM size.
//!
//! Drawn with plotters' SVG backend and its built-in (font-less) text layout: no fonts,
//! no external programs, the same bytes on every machine.

mod pareto;
mod placement;

pub use pareto::{ParetoInput, pareto_svg};
pub use placement::placement_svg;

/// A picture could not be drawn (a bug, never bad input: every input draws).
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {what}: {message}")]
pub struct PlotError {
    pub what: &'static str,
    pub message: String,
}

impl PlotError {
    fn new(what: &'static str, e: impl std::fmt::Display) -> Self {
        PlotError {
            what,
            message: e.to_string(),
        }
    }
}

/// `lo..hi` widened by `pad` of its span on each side (and made non-empty).
fn padded(lo: f64, hi: f64, pad: f64) -> std::ops::Range<f64> {
    let span = (hi - lo).abs().max(hi.abs() * 0.1).max(1e-9);
    (lo - span * pad)..(hi + span * pad)
}

#[cfg(test)]
mod tests;
