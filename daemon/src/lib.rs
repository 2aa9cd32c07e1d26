//! archplace: joint search of an AI accelerator's architecture and of the placement of a
//! training job over many such accelerators — the spec language, the runner, the service
//! and the plots around the engine ([`archplace_engine`]) and the plugin host
//! ([`archplace_plugin_host`]).
//!
//! * [`spec`] reads and validates search specs (TOML), with located errors.
//! * [`cost`] resolves the cost models a spec names (plugins, or the native reference).
//! * [`runner`] runs one spec end to end and writes its result files.
//! * [`estimate`] explains one training step of a fixed chip and plan.
//! * [`service`] is the daemon; [`plot`] draws the result pictures.
//! * [`pool`] spreads a daemon's searches over many daemons through NATS JetStream.

pub mod atomic;
pub mod cost;
pub mod estimate;
pub mod journal;
pub mod memory;
pub mod plot;
pub mod pool;
pub mod runner;
pub mod service;
pub mod spec;
