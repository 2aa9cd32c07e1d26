//! archplace's search engine: from a validated spec's model and space to the best chip and
//! training plan.
//!
//! It does no I/O and knows nothing of the service around it: it takes validated inputs and
//! the SDK's cost-model traits, and reports through [`search::Observer`]. Its dependencies
//! (no wasmtime, no async runtime, no HTTP) and its `clippy.toml` (no `std::fs`, `std::net`,
//! `std::process`, `std::env`) keep it that way, so tests and benchmarks drive it directly.
//!
//! * [`model`] — operator graphs of a model's layers; [`space`] — the architecture space;
//! * [`estimate`], [`layer`] — cost-model answers for a layer's operators; [`execution`] —
//!   which of them may overlap (dataflow chip, or one kernel at a time);
//! * [`schedule`] — a layer's operators on the cores (bounds, list schedule, HiGHS MIP);
//! * [`placement`] — layers over pipeline stages and devices (dynamic program);
//! * [`search`] — the area-ordered co-search; [`training`] — precision, optimizer and
//!   recomputation, bytes per parameter;
//! * [`step`] — one training step of a fixed chip and plan, explained;
//! * [`phaze`] — the reference system's file formats, for comparing with it.

pub mod estimate;
pub mod execution;
pub mod layer;
pub mod model;
pub mod phaze;
pub mod placement;
pub mod schedule;
pub mod search;
pub mod space;
pub mod step;
pub mod training;
