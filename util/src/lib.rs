//! Helpers every archplace crate that touches the file system or a configured duration
//! shares, so that each rule is written once:
//!
//! * [`files`] — reading a file someone else named: only a regular file, never more than a
//!   cap (the one reader the workspace's `clippy.toml` lets call `std::fs::read`);
//! * [`atomic`] — writing a file whole or not at all;
//! * [`duration`] — a number of seconds from a config or a spec as a [`std::time::Duration`]
//!   that cannot panic.

pub mod atomic;
pub mod duration;
pub mod files;
