//! Checks on what a plugin says: its info (sizes, versions, consistency) and every answer
//! (error sizes, finite non-negative costs). A failed check is a fault of the plugin.

use crate::bindings::{self, CostModelPre, wit};
use crate::store::{State, arm, classify, new_store};
use crate::{Fault, FaultKind, Limits};
use archplace_plugin_sdk::ModelInfo;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Longest error message, name or description a plugin may return.
pub const MAX_TEXT_BYTES: usize = 4096;
/// Most parameters a plugin may declare.
pub const MAX_PARAMETERS: usize = 64;

pub(crate) fn bad_output(message: String) -> Fault {
    Fault {
        kind: FaultKind::BadOutput,
        message,
    }
}

pub(crate) fn check_error_size(e: &wit::EstimateError) -> Result<(), Fault> {
    let n = bindings::error_message_len(e);
    if n > MAX_TEXT_BYTES {
        return Err(bad_output(format!(
            "returned an error message of {n} bytes (at most {MAX_TEXT_BYTES})"
        )));
    }
    Ok(())
}

pub(crate) fn check_cost(what: &str, i: usize, seconds: f64, joules: f64) -> Result<(), Fault> {
    if !(seconds.is_finite() && seconds >= 0.0 && joules.is_finite() && joules >= 0.0) {
        return Err(bad_output(format!(
            "returned {seconds} s and {joules} J for {what} {i}: costs must be finite and not negative"
        )));
    }
    Ok(())
}

/// Asks a fresh instance for the plugin's `info`.
pub fn probe_info(
    engine: &wasmtime::Engine,
    pre: &CostModelPre<State>,
    limits: &Limits,
    name: &str,
) -> Result<ModelInfo, Fault> {
    let mut store = new_store(engine, limits, name, Arc::new(AtomicBool::new(false)));
    arm(&mut store, limits, 1);
    let model = match pre.instantiate(&mut store) {
        Ok(m) => m,
        Err(e) => return Err(classify(&e, store.data(), limits)),
    };
    arm(&mut store, limits, 1);
    match model.archplace_cost_model_model().call_info(&mut store) {
        Ok(info) => Ok(bindings::info_from_wit(info)),
        Err(e) => Err(classify(&e, store.data(), limits)),
    }
}

/// Sizes and consistency of what a plugin says about itself.
pub fn check_info(info: &ModelInfo, exported: &semver::Version) -> Result<(), String> {
    let texts = [
        ("name", info.name.len(), 64),
        ("vendor", info.vendor.len(), 256),
        ("version", info.version.len(), 64),
    ];
    for (what, n, max) in texts {
        if n > max {
            return Err(format!("its {what} is {n} bytes long (at most {max})"));
        }
    }
    if info.name.is_empty() {
        return Err("its name is empty".into());
    }
    if semver::Version::parse(&info.version).is_err() {
        return Err(format!(
            "its version `{}` is not a semantic version (e.g. 1.2.0)",
            info.version
        ));
    }
    if info.parameters.len() > MAX_PARAMETERS {
        return Err(format!(
            "it declares {} parameters (at most {MAX_PARAMETERS})",
            info.parameters.len()
        ));
    }
    for p in &info.parameters {
        if p.name.len() > 64 || p.description.len() > MAX_TEXT_BYTES || p.default.len() > 256 {
            return Err(format!(
                "parameter `{}`: name, description or default too long",
                p.name.chars().take(64).collect::<String>()
            ));
        }
    }
    let (major, minor) = info.interface_version;
    if u64::from(major) != exported.major || u64::from(minor) != exported.minor {
        return Err(format!(
            "it says it implements interface {major}.{minor}, but it exports archplace:cost-model@{exported}"
        ));
    }
    if !info.provides.area && !info.provides.latency {
        return Err("it provides neither an area nor a latency model".into());
    }
    Ok(())
}
