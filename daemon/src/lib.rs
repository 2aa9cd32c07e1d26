//! archplace: joint search of an AI accelerator's architecture and of the placement of a
//! training job over many such accelerators.
//!
//! * [`spec`] reads and validates search specs (TOML), with located errors.
//! * [`engine`] is the search itself: model graphs, the architecture space, and (later)
//!   layer schedules and placement. It does no I/O.
//! * [`cost`] connects the engine to cost models.

pub mod atomic;
pub mod cost;
pub mod engine;
pub mod phaze;
pub mod plot;
pub mod plugin;
pub mod runner;
pub mod service;
pub mod spec;

#[cfg(test)]
mod testutil;
