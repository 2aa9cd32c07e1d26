//! Misbehaving cost-model plugins: test fixtures for the plugin host. Each cargo feature
//! builds one of them (`scripts/build-plugins` builds them all); without a feature this
//! crate is empty. Every one answers `info` and `configure` properly (so the host gets as
//! far as a real call) unless its fault is in exactly that:
//!
//! | feature                   | what it does                                          |
//! |---------------------------|-------------------------------------------------------|
//! | `infinite-loop`           | `latency` never returns                               |
//! | `memory-bomb`             | `latency` allocates until it is refused               |
//! | `trap`                    | `latency` panics                                      |
//! | `nan-output`              | `latency` returns NaN seconds                         |
//! | `negative-output`         | `latency` returns −1 s                                |
//! | `wrong-count`             | `latency` returns one result too many                 |
//! | `enormous-output`         | `latency` fails with a 32 MiB error message           |
//! | `wrong-interface-version` | exports `archplace:cost-model@2.0.0`                  |
//! | `missing-export`          | exports `archplace:cost-model/model` without `info`   |
//! | `memory-over-latency`     | says an operator's memory time exceeds its time       |
//! | `area-nan`                | `area` returns NaN µm² (its latency is honest)        |
//! | `future-minor`            | well-behaved, but built for interface 1.4.0 (loads)   |
//! | `interface-1-0`           | well-behaved, built for interface 1.0.0 (loads; no    |
//! |                           | memory times)                                         |
//! | `interface-1-1`           | well-behaved, built for interface 1.1.0 (loads; no    |
//! |                           | element types: refused for FP8)                       |
//! | `interface-1-2`           | well-behaved, built for interface 1.2.0 (loads; no    |
//! |                           | calibratable parameters)                              |
//!
//! Areas are honest (1 mm² per tensor core), so a search can start before it faults.

#[cfg(any(
    feature = "infinite-loop",
    feature = "memory-bomb",
    feature = "trap",
    feature = "nan-output",
    feature = "negative-output",
    feature = "wrong-count",
    feature = "enormous-output",
    feature = "memory-over-latency",
    feature = "area-nan",
))]
mod misbehaving {
    use archplace_plugin_sdk::{
        AcceleratorConfig, CoreConfig, EstimateError, ModelInfo, Op, OpCost, Parameter,
        ParameterError, Plugin,
    };

    pub struct Hostile;

    const NAME: &str = if cfg!(feature = "infinite-loop") {
        "hostile-infinite-loop"
    } else if cfg!(feature = "memory-bomb") {
        "hostile-memory-bomb"
    } else if cfg!(feature = "trap") {
        "hostile-trap"
    } else if cfg!(feature = "nan-output") {
        "hostile-nan-output"
    } else if cfg!(feature = "negative-output") {
        "hostile-negative-output"
    } else if cfg!(feature = "wrong-count") {
        "hostile-wrong-count"
    } else if cfg!(feature = "memory-over-latency") {
        "hostile-memory-over-latency"
    } else if cfg!(feature = "area-nan") {
        "hostile-area-nan"
    } else {
        "hostile-enormous-output"
    };

    impl Plugin for Hostile {
        fn info() -> ModelInfo {
            ModelInfo::new(NAME, "archplace test fixtures", env!("CARGO_PKG_VERSION"))
        }

        fn new(parameters: &[Parameter]) -> Result<Self, Vec<ParameterError>> {
            match parameters.first() {
                Some(p) => Err(vec![ParameterError::unknown(&p.name, &Self::info())]),
                None => Ok(Hostile),
            }
        }

        fn area_um2(
            &self,
            configs: &[AcceleratorConfig],
        ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
            let honest = |c: &AcceleratorConfig| 1e6 * f64::from(c.tensor_cores + c.vector_cores);
            let area = if cfg!(feature = "area-nan") {
                |_: &AcceleratorConfig| f64::NAN
            } else {
                honest
            };
            Ok(configs.iter().map(|c| Ok(area(c))).collect())
        }

        fn latency(&self, _core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError> {
            let good = OpCost::new(1e-6, 1e-6).with_memory_seconds(0.5e-6);
            let _ = (&good, ops.len());
            #[cfg(feature = "infinite-loop")]
            {
                let mut i: u64 = 0;
                loop {
                    i = std::hint::black_box(i.wrapping_add(1));
                }
            }
            #[cfg(feature = "memory-bomb")]
            {
                // Reserve, don't touch: the cap must trip, not the fuel budget.
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(std::hint::black_box(Vec::with_capacity(1 << 20)));
                }
            }
            #[cfg(feature = "trap")]
            {
                panic!(
                    "hostile plugin: deliberate panic in latency ({} ops)",
                    ops.len()
                );
            }
            #[cfg(feature = "nan-output")]
            {
                let mut v = vec![good; ops.len()];
                v[ops.len() - 1].seconds = f64::NAN;
                return Ok(v);
            }
            #[cfg(feature = "negative-output")]
            {
                let mut v = vec![good; ops.len()];
                v[0].seconds = -1.0;
                return Ok(v);
            }
            #[cfg(feature = "wrong-count")]
            {
                return Ok(vec![good; ops.len() + 1]);
            }
            #[cfg(feature = "memory-over-latency")]
            {
                return Ok(vec![good.with_memory_seconds(2e-6); ops.len()]);
            }
            #[cfg(feature = "enormous-output")]
            {
                // 32 MiB of NULs (valid UTF-8), zeroed by the allocator rather than written,
                // so that the size check trips rather than the fuel budget.
                #[allow(unsafe_code)]
                let message = unsafe { String::from_utf8_unchecked(vec![0u8; 32 << 20]) };
                return Err(EstimateError::Internal(message));
            }
            #[allow(unreachable_code)]
            Ok(vec![good; ops.len()])
        }
    }

    archplace_plugin_sdk::export_plugin!(Hostile);
}

#[cfg(all(feature = "wrong-interface-version", target_arch = "wasm32"))]
#[allow(unsafe_code, clippy::all)]
mod wrong_version {
    wit_bindgen::generate!({ path: "wit/wrong-version", world: "cost-model" });

    struct Export;
    impl exports::archplace::cost_model::model::Guest for Export {
        fn info() -> String {
            "hostile-wrong-interface-version".into()
        }
    }
    export!(Export);
}

#[cfg(all(feature = "missing-export", target_arch = "wasm32"))]
#[allow(unsafe_code, clippy::all)]
mod missing_export {
    wit_bindgen::generate!({ path: "wit/missing-export", world: "cost-model" });

    struct Export;
    impl exports::archplace::cost_model::model::Guest for Export {
        fn configure(_parameters: Vec<(String, String)>) -> Result<(), ()> {
            Ok(())
        }
    }
    export!(Export);
}

#[cfg(all(feature = "future-minor", target_arch = "wasm32"))]
#[allow(unsafe_code, clippy::all)]
mod future_minor {
    wit_bindgen::generate!({ path: "wit/future-minor", world: "cost-model" });

    use archplace::cost_model::types::{
        AcceleratorConfig, CoreConfig, EstimateError, InterfaceVersion, Op, OpCost, Parameter,
        ParameterError, PluginInfo, Provides,
    };

    struct Export;
    impl exports::archplace::cost_model::model::Guest for Export {
        fn info() -> PluginInfo {
            PluginInfo {
                name: "future-minor".into(),
                vendor: "archplace test fixtures".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                interface_version: InterfaceVersion { major: 1, minor: 4 },
                deterministic: true,
                provides: Provides {
                    area: true,
                    latency: true,
                },
                parameters: vec![],
            }
        }
        fn configure(_parameters: Vec<Parameter>) -> Result<(), Vec<ParameterError>> {
            Ok(())
        }
        fn area(
            configs: Vec<AcceleratorConfig>,
        ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
            Ok(configs
                .iter()
                .map(|c| Ok(1e6 * f64::from(c.tensor_cores + c.vector_cores)))
                .collect())
        }
        fn latency(_core: CoreConfig, ops: Vec<Op>) -> Result<Vec<OpCost>, EstimateError> {
            Ok(ops
                .iter()
                .map(|_| OpCost {
                    seconds: 1e-6,
                    joules: 1e-6,
                })
                .collect())
        }
        fn describe_units() -> String {
            "SI; area in square micrometres".into()
        }
    }
    impl exports::archplace::cost_model::detail::Guest for Export {
        fn latency_detail(
            _core: CoreConfig,
            ops: Vec<Op>,
        ) -> Result<Vec<exports::archplace::cost_model::detail::OpDetail>, EstimateError> {
            Ok(ops
                .iter()
                .map(|_| exports::archplace::cost_model::detail::OpDetail {
                    seconds: 1e-6,
                    joules: 1e-6,
                    memory_seconds: Some(0.25e-6),
                })
                .collect())
        }
        fn attention_detail(
            _core: CoreConfig,
            ops: Vec<exports::archplace::cost_model::detail::Attention>,
        ) -> Result<Vec<exports::archplace::cost_model::detail::OpDetail>, EstimateError> {
            Ok(ops
                .iter()
                .map(|_| exports::archplace::cost_model::detail::OpDetail {
                    seconds: 2e-6,
                    joules: 1e-6,
                    memory_seconds: None,
                })
                .collect())
        }
    }
    impl exports::archplace::cost_model::typed::Guest for Export {
        fn tensor_element_types() -> Vec<exports::archplace::cost_model::typed::ElementType> {
            use exports::archplace::cost_model::typed::ElementType as E;
            vec![E::Bf16, E::Fp8]
        }
        fn latency_typed(
            _core: CoreConfig,
            ops: Vec<exports::archplace::cost_model::typed::TypedOp>,
        ) -> Result<Vec<exports::archplace::cost_model::detail::OpDetail>, EstimateError> {
            use exports::archplace::cost_model::typed::ElementType as E;
            // An FP8 operator answers half a microsecond, the others one.
            Ok(ops
                .iter()
                .map(|o| exports::archplace::cost_model::detail::OpDetail {
                    seconds: if o.element == E::Fp8 { 0.5e-6 } else { 1e-6 },
                    joules: 1e-6,
                    memory_seconds: Some(0.25e-6),
                })
                .collect())
        }
    }
    impl exports::archplace::cost_model::calibration::Guest for Export {
        fn calibratable() -> Vec<exports::archplace::cost_model::calibration::CalibratableParameter>
        {
            vec![]
        }
        fn configured() -> Vec<exports::archplace::cost_model::calibration::ParameterValue> {
            vec![]
        }
    }
    export!(Export);
}

/// A well-behaved plugin built against interface 1.2.0 exactly (no `calibration`): it
/// loads, and calibration fits none of its parameters.
#[cfg(all(feature = "interface-1-2", target_arch = "wasm32"))]
#[allow(unsafe_code, clippy::all)]
mod interface_1_2 {
    wit_bindgen::generate!({ path: "wit/interface-1.2", world: "cost-model" });

    use archplace::cost_model::types::{
        AcceleratorConfig, CoreConfig, EstimateError, InterfaceVersion, Op, OpCost, Parameter,
        ParameterError, PluginInfo, Provides,
    };

    struct Export;
    impl exports::archplace::cost_model::model::Guest for Export {
        fn info() -> PluginInfo {
            PluginInfo {
                name: "interface-1-2".into(),
                vendor: "archplace test fixtures".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                interface_version: InterfaceVersion { major: 1, minor: 2 },
                deterministic: true,
                provides: Provides {
                    area: true,
                    latency: true,
                },
                parameters: vec![],
            }
        }
        fn configure(_parameters: Vec<Parameter>) -> Result<(), Vec<ParameterError>> {
            Ok(())
        }
        fn area(
            configs: Vec<AcceleratorConfig>,
        ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
            Ok(configs
                .iter()
                .map(|c| Ok(1e6 * f64::from(c.tensor_cores + c.vector_cores)))
                .collect())
        }
        fn latency(_core: CoreConfig, ops: Vec<Op>) -> Result<Vec<OpCost>, EstimateError> {
            Ok(ops
                .iter()
                .map(|_| OpCost {
                    seconds: 1e-6,
                    joules: 1e-6,
                })
                .collect())
        }
    }
    impl exports::archplace::cost_model::detail::Guest for Export {
        fn latency_detail(
            _core: CoreConfig,
            ops: Vec<Op>,
        ) -> Result<Vec<exports::archplace::cost_model::detail::OpDetail>, EstimateError> {
            Ok(ops
                .iter()
                .map(|_| exports::archplace::cost_model::detail::OpDetail {
                    seconds: 1e-6,
                    joules: 1e-6,
                    memory_seconds: Some(0.25e-6),
                })
                .collect())
        }
        fn attention_detail(
            _core: CoreConfig,
            ops: Vec<exports::archplace::cost_model::detail::Attention>,
        ) -> Result<Vec<exports::archplace::cost_model::detail::OpDetail>, EstimateError> {
            Ok(ops
                .iter()
                .map(|_| exports::archplace::cost_model::detail::OpDetail {
                    seconds: 2e-6,
                    joules: 1e-6,
                    memory_seconds: None,
                })
                .collect())
        }
    }
    impl exports::archplace::cost_model::typed::Guest for Export {
        fn tensor_element_types() -> Vec<exports::archplace::cost_model::typed::ElementType> {
            use exports::archplace::cost_model::typed::ElementType as E;
            vec![E::Bf16, E::Fp8]
        }
        fn latency_typed(
            _core: CoreConfig,
            ops: Vec<exports::archplace::cost_model::typed::TypedOp>,
        ) -> Result<Vec<exports::archplace::cost_model::detail::OpDetail>, EstimateError> {
            use exports::archplace::cost_model::typed::ElementType as E;
            // An FP8 operator answers half a microsecond, the others one.
            Ok(ops
                .iter()
                .map(|o| exports::archplace::cost_model::detail::OpDetail {
                    seconds: if o.element == E::Fp8 { 0.5e-6 } else { 1e-6 },
                    joules: 1e-6,
                    memory_seconds: Some(0.25e-6),
                })
                .collect())
        }
    }
    export!(Export);
}

/// A well-behaved plugin built against interface 1.1.0 exactly (no `typed`): it cannot be
/// told an operator's element type, so the host refuses FP8 work for it.
#[cfg(all(feature = "interface-1-1", target_arch = "wasm32"))]
#[allow(unsafe_code, clippy::all)]
mod interface_1_1 {
    wit_bindgen::generate!({ path: "wit/interface-1.1", world: "cost-model" });

    use archplace::cost_model::types::{
        AcceleratorConfig, CoreConfig, EstimateError, InterfaceVersion, Op, OpCost, Parameter,
        ParameterError, PluginInfo, Provides,
    };
    use exports::archplace::cost_model::detail::{Attention, OpDetail};

    struct Export;
    impl exports::archplace::cost_model::model::Guest for Export {
        fn info() -> PluginInfo {
            PluginInfo {
                name: "interface-1-1".into(),
                vendor: "archplace test fixtures".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                interface_version: InterfaceVersion { major: 1, minor: 1 },
                deterministic: true,
                provides: Provides {
                    area: true,
                    latency: true,
                },
                parameters: vec![],
            }
        }
        fn configure(_parameters: Vec<Parameter>) -> Result<(), Vec<ParameterError>> {
            Ok(())
        }
        fn area(
            configs: Vec<AcceleratorConfig>,
        ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
            Ok(configs
                .iter()
                .map(|c| Ok(1e6 * f64::from(c.tensor_cores + c.vector_cores)))
                .collect())
        }
        fn latency(_core: CoreConfig, ops: Vec<Op>) -> Result<Vec<OpCost>, EstimateError> {
            Ok(ops
                .iter()
                .map(|_| OpCost {
                    seconds: 1e-6,
                    joules: 1e-6,
                })
                .collect())
        }
    }
    impl exports::archplace::cost_model::detail::Guest for Export {
        fn latency_detail(_core: CoreConfig, ops: Vec<Op>) -> Result<Vec<OpDetail>, EstimateError> {
            Ok(ops
                .iter()
                .map(|_| OpDetail {
                    seconds: 1e-6,
                    joules: 1e-6,
                    memory_seconds: Some(0.5e-6),
                })
                .collect())
        }
        fn attention_detail(
            _core: CoreConfig,
            ops: Vec<Attention>,
        ) -> Result<Vec<OpDetail>, EstimateError> {
            Ok(ops
                .iter()
                .map(|_| OpDetail {
                    seconds: 2e-6,
                    joules: 1e-6,
                    memory_seconds: None,
                })
                .collect())
        }
    }
    export!(Export);
}

/// A well-behaved plugin built against interface 1.0.0 exactly (no `detail`): the memory
/// times of its operators are unknown to the host.
#[cfg(all(feature = "interface-1-0", target_arch = "wasm32"))]
#[allow(unsafe_code, clippy::all)]
mod interface_1_0 {
    wit_bindgen::generate!({ path: "wit/interface-1.0", world: "cost-model" });

    use archplace::cost_model::types::{
        AcceleratorConfig, CoreConfig, EstimateError, InterfaceVersion, Op, OpCost, Parameter,
        ParameterError, PluginInfo, Provides,
    };

    struct Export;
    impl exports::archplace::cost_model::model::Guest for Export {
        fn info() -> PluginInfo {
            PluginInfo {
                name: "interface-1-0".into(),
                vendor: "archplace test fixtures".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                interface_version: InterfaceVersion { major: 1, minor: 0 },
                deterministic: true,
                provides: Provides {
                    area: true,
                    latency: true,
                },
                parameters: vec![],
            }
        }
        fn configure(_parameters: Vec<Parameter>) -> Result<(), Vec<ParameterError>> {
            Ok(())
        }
        fn area(
            configs: Vec<AcceleratorConfig>,
        ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError> {
            Ok(configs
                .iter()
                .map(|c| Ok(1e6 * f64::from(c.tensor_cores + c.vector_cores)))
                .collect())
        }
        fn latency(_core: CoreConfig, ops: Vec<Op>) -> Result<Vec<OpCost>, EstimateError> {
            Ok(ops
                .iter()
                .map(|_| OpCost {
                    seconds: 1e-6,
                    joules: 1e-6,
                })
                .collect())
        }
    }
    export!(Export);
}
