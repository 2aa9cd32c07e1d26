//! One job: one search from a validated spec to its result folder. Everything the
//! one-shot CLI and the daemon do alike with a search lives here — resolving its cost
//! models and checking its memory budget ([`run::prepare`], [`memory`]), running it with
//! its checkpoint ([`run`], [`journal`]), and every file of its result folder
//! ([`folder`], the formats in [`result`], the pictures in [`plot`], the words in
//! [`summary`]) — and so does `archplace estimate`'s work on one fixed chip and plan
//! ([`estimated`]) and its explanation ([`estimate`]). The CLI and the Python package call
//! the same functions and only print or convert what they return.
//!
//! Below it: the spec language (`archplace-spec`), the engine and the cost-model port;
//! above it: the pool (which implements [`run::Distributor`]) and the service.

// Results must not depend on a hash map's order (ARCHITECTURE.md, "Determinism").
#![warn(clippy::iter_over_hash_type)]

// In their order: each imports only those before it (ARCHITECTURE.md, invariant 19; a
// tidy test checks it). One per group: rustfmt would sort consecutive declarations.
pub mod lines;

pub mod chip;

pub mod journal;

pub mod memory;

pub mod plot;

pub mod domains;

pub mod explain;

pub mod calibrated;

pub mod result;

pub mod summary;

pub mod estimate;

pub mod timeline;

pub mod estimated;

pub mod run;

pub mod folder;

pub use run::{Finished, Prepared, RunError, Steering, prepare};
