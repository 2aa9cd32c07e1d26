//! archplace's end-to-end tests, one binary (as ripgrep's `tests/tests.rs`): the real
//! `archplace` binary as users and operators run it, with one shared harness
//! ([`util`]), and the tidy checks of the source tree ([`tidy`]).
//!
//! Tests run in parallel; the few that measure timing or load the machine on purpose take
//! [`util::alone`], every other test that starts processes [`util::shared`].
// Tests read the files they made and print what they measured; the invariants these lints
// keep are the product's, not the harness's.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::print_stderr,
    clippy::print_stdout
)]

mod util;

mod answer;
mod cli;
mod daemon;
mod determinism;
mod fuzz;
mod pool;
mod resume;
mod runbook;
mod seccomp;
mod tidy;
mod validation;
