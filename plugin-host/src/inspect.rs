//! Checks on what a plugin says: its info (sizes, versions, consistency) and every answer
//! (error sizes, finite non-negative costs). A failed check is a fault of the plugin.

use crate::bindings::{self, PluginPre, wit};
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

/// An operator's memory time (interface 1.1) must be a time the operator can take: finite,
/// not negative, and not longer than the operator itself (a relative 1e-9 for rounding).
pub(crate) fn check_memory(what: &str, i: usize, seconds: f64, memory: f64) -> Result<(), Fault> {
    if !(memory.is_finite() && memory >= 0.0) {
        return Err(bad_output(format!(
            "returned a memory time of {memory} s for {what} {i}: it must be finite and not negative"
        )));
    }
    if memory > seconds * (1.0 + 1e-9) {
        return Err(bad_output(format!(
            "returned a memory time of {memory} s for {what} {i}, longer than the {seconds} s it says the {what} takes"
        )));
    }
    Ok(())
}

/// Asks a fresh instance for the plugin's `info`.
pub fn probe_info(
    engine: &wasmtime::Engine,
    pre: &PluginPre<State>,
    limits: &Limits,
    name: &str,
) -> Result<ModelInfo, Fault> {
    let never = || Arc::new(AtomicBool::new(false));
    let mut store = new_store(engine, limits, name, [never(), never()]);
    arm(&mut store, limits, 1);
    let model = match pre.instantiate(&mut store) {
        Ok(m) => m,
        Err(e) => return Err(classify(&e, store.data(), limits)),
    };
    arm(&mut store, limits, 1);
    let mut info = match model.model.call_info(&mut store) {
        Ok(info) => bindings::info_from_wit(info),
        Err(e) => return Err(classify(&e, store.data(), limits)),
    };
    if let Some(c) = &model.calibration {
        arm(&mut store, limits, 1);
        match c.call_calibratable(&mut store) {
            Ok(list) => info.calibratable = bindings::calibratable_from_wit(list),
            Err(e) => return Err(classify(&e, store.data(), limits)),
        }
    }
    Ok(info)
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
    check_calibratable(info)?;
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

/// Each calibratable parameter is a declared parameter, once, with a short unit and
/// finite bounds in order.
fn check_calibratable(info: &ModelInfo) -> Result<(), String> {
    if info.calibratable.len() > MAX_PARAMETERS {
        return Err(format!(
            "it declares {} calibratable parameters (at most {MAX_PARAMETERS})",
            info.calibratable.len()
        ));
    }
    for (i, c) in info.calibratable.iter().enumerate() {
        let name: String = c.name.chars().take(64).collect();
        if !info.parameters.iter().any(|p| p.name == c.name) {
            return Err(format!(
                "calibratable parameter `{name}` is not one of its parameters"
            ));
        }
        if info.calibratable[..i].iter().any(|d| d.name == c.name) {
            return Err(format!("calibratable parameter `{name}` is declared twice"));
        }
        if c.unit.len() > 16 {
            return Err(format!(
                "calibratable parameter `{name}`: its unit is {} bytes long (at most 16)",
                c.unit.len()
            ));
        }
        if !(c.lower.is_finite() && c.upper.is_finite() && c.lower < c.upper) {
            return Err(format!(
                "calibratable parameter `{name}`: bounds {} to {} are not finite and in order",
                c.lower, c.upper
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod calibratable {
    use super::*;

    /// A calibratable parameter must be a declared one, once, with finite ordered bounds.
    #[test]
    fn bad_declarations_are_refused_with_the_reason() {
        let v = semver::Version::new(1, 3, 0);
        let base = ModelInfo::new("m", "v", "1.0.0").parameter("x", "a ratio", "0.5");
        assert!(check_info(&base.clone().calibratable("x", "", 0.1, 1.0, true), &v).is_ok());
        for (info, says) in [
            (
                base.clone().calibratable("y", "", 0.1, 1.0, true),
                "not one of its parameters",
            ),
            (
                base.clone()
                    .calibratable("x", "", 0.1, 1.0, true)
                    .calibratable("x", "", 0.1, 1.0, true),
                "declared twice",
            ),
            (
                base.clone().calibratable("x", "", 1.0, 0.1, true),
                "not finite and in order",
            ),
            (
                base.clone().calibratable("x", "", f64::NAN, 1.0, true),
                "not finite",
            ),
            (
                base.clone()
                    .calibratable("x", &"u".repeat(17), 0.1, 1.0, true),
                "unit",
            ),
        ] {
            let e = check_info(&info, &v).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}

/// Property tests of the answer checks: whatever a plugin returns, the check accepts exactly
/// what the contract allows and never panics (fuzzing of the plugin output checks).
#[cfg(test)]
mod properties {
    use super::*;
    use archplace_plugin_sdk::{ParameterInfo, Provides};
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, RngSeed};

    fn config() -> Config {
        Config {
            cases: 4000,
            failure_persistence: None,
            rng_algorithm: RngAlgorithm::ChaCha,
            rng_seed: RngSeed::Fixed(0x16),
            ..Config::default()
        }
    }

    /// Any f64, weighted towards the edges.
    fn number() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(-0.0),
            Just(0.0),
            Just(f64::MIN_POSITIVE),
            Just(f64::MAX),
        ]
    }

    fn text(max: usize) -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,80}",
            proptest::collection::vec(any::<char>(), 0..max).prop_map(String::from_iter),
        ]
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn costs_pass_exactly_when_finite_and_not_negative(s in number(), j in number()) {
            let ok = s.is_finite() && s >= 0.0 && j.is_finite() && j >= 0.0;
            prop_assert_eq!(check_cost("op", 3, s, j).is_ok(), ok);
        }

        #[test]
        fn info_checks_never_panic_and_bound_what_they_echo(
            name in text(100),
            vendor in text(300),
            version in prop_oneof![Just("1.0.0".to_string()), text(80)],
            interface in (0u16..3, 0u16..3),
            provides in (any::<bool>(), any::<bool>()),
            parameters in proptest::collection::vec((text(100), text(80), text(300)), 0..70),
        ) {
            let info = ModelInfo {
                calibratable: Vec::new(),
                name,
                vendor,
                version,
                interface_version: interface,
                deterministic: true,
                provides: Provides { area: provides.0, latency: provides.1 },
                parameters: parameters
                    .into_iter()
                    .map(|(name, description, default)| ParameterInfo { name, description, default })
                    .collect(),
            };
            let exported = semver::Version::new(1, 0, 0);
            match check_info(&info, &exported) {
                Ok(()) => {
                    prop_assert!(!info.name.is_empty() && info.name.len() <= 64);
                    prop_assert!(info.parameters.len() <= MAX_PARAMETERS);
                    prop_assert_eq!(info.interface_version, (1, 0));
                    prop_assert!(info.provides.area || info.provides.latency);
                }
                // A refusal never echoes more than a bounded part of what the plugin said.
                Err(message) => prop_assert!(message.len() <= 600, "{}", message.len()),
            }
        }
    }
}
