//! archplace's search engine: from a validated spec's model and space to the best chip and
//! training plan.
//!
//! It does no I/O and knows nothing of the service around it: it takes validated inputs and
//! the SDK's cost-model traits, and reports through [`search::Observer`]. Its dependencies
//! (no wasmtime, no async runtime, no HTTP) and its `clippy.toml` (no `std::fs`, `std::net`,
//! `std::process`, `std::env`) keep it that way, so tests and benchmarks drive it directly.
//!
//! The modules are declared below in their order: each imports only modules declared
//! before it (ARCHITECTURE.md, "The engine's modules"; a tidy test checks it), so the
//! engine has no import cycle and reads bottom-up.
//!
//! Inputs — what a validated spec says:
//! * [`options`] — the layer schedules' solver limits and gap;
//! * [`network`] — the network's tiers and ring collectives over them;
//! * [`execution`] — which of a layer's operators may overlap (dataflow chip, or one
//!   kernel at a time);
//! * [`pipeline`] — pipeline schedules: layout, rules, activations in flight, simulation;
//! * [`training`] — precision, optimizer, recomputation, the cluster, bytes per parameter;
//! * [`plan`] — the training plan: parallelism, schedule, stages, choices (one type);
//! * [`space`] — the architecture space: its axes, enumerated and sized by the area model.
//!
//! Computation, bottom-up:
//! * [`model`] — operator graphs of a model's layers;
//! * [`schedule`] — a layer's operators on the cores (bounds, list schedule, HiGHS MIP);
//! * [`operators`] — a layer's operators priced by the latency model, as a scheduling
//!   instance restricted to what the framework allows;
//! * [`placement`] — layers over pipeline stages and devices (dynamic program);
//! * [`step`] — one training step of a fixed chip and plan, explained;
//! * [`search`] — the area-ordered co-search;
//! * [`phaze`] — the reference system's file formats, for comparing with it.

// Results must not depend on a hash map's order (ARCHITECTURE.md, "Determinism").
#![warn(clippy::iter_over_hash_type)]

// One module per group: rustfmt would sort consecutive declarations, and the order here is
// the architecture.
pub mod options;

pub mod network;

pub mod execution;

pub mod pipeline;

pub mod training;

pub mod plan;

pub mod space;

pub mod model;

pub mod schedule;

pub mod operators;

pub mod placement;

pub mod step;

pub mod search;

pub mod phaze;
