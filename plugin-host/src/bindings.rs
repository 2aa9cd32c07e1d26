//! Host bindings of the `archplace:cost-model` world and conversions between its records
//! and the SDK's types. The SDK's guest side has the mirror image of these conversions;
//! they cannot be shared because each side's records are generated separately.

use archplace_plugin_sdk as sdk;

wasmtime::component::bindgen!({
    path: "../plugin-sdk/wit",
    world: "cost-model",
});

pub use self::archplace::cost_model::host::Level;
pub use self::archplace::cost_model::types as wit;
pub use self::exports::archplace::cost_model::{calibration, detail, model, typed};
use wasmtime::component::InstancePre;
use wasmtime::{AsContextMut, Store};

/// The name of interface `name` of this host's version in a component's exports.
fn export_name(name: &str) -> String {
    format!(
        "{}/{name}@{}.{}.0",
        sdk::WIT_PACKAGE,
        sdk::INTERFACE_VERSION.0,
        sdk::INTERFACE_VERSION.1
    )
}

/// A component ready to instantiate, with the exports of the interface version it was
/// built for: `model` always, `detail` from 1.1 on, `typed` from 1.2 on, `calibration`
/// from 1.3 on. (The world's
/// generated `CostModelPre` would demand every export of the newest minor version,
/// refusing older plugins.)
pub struct PluginPre<T: 'static> {
    pre: InstancePre<T>,
    model: model::GuestIndices,
    detail: Option<detail::GuestIndices>,
    typed: Option<typed::GuestIndices>,
    calibration: Option<calibration::GuestIndices>,
}

impl<T: 'static> Clone for PluginPre<T> {
    fn clone(&self) -> Self {
        PluginPre {
            pre: self.pre.clone(),
            model: self.model.clone(),
            detail: self.detail.clone(),
            typed: self.typed.clone(),
            calibration: self.calibration.clone(),
        }
    }
}

impl<T: 'static> PluginPre<T> {
    /// Whether the plugin exports interface 1.1's `detail` (memory times, fused attention).
    pub fn has_detail(&self) -> bool {
        self.detail.is_some()
    }

    /// Whether the plugin exports interface 1.2's `typed` (element types, casts).
    pub fn has_typed(&self) -> bool {
        self.typed.is_some()
    }

    /// Whether the plugin exports interface 1.3's `calibration` (calibratable parameters).
    pub fn has_calibration(&self) -> bool {
        self.calibration.is_some()
    }

    /// Finds the exports of interface `1.minor`: `detail` from 1.1 on, `typed` from 1.2
    /// on and `calibration` from 1.3 on, each of which must then be there.
    pub fn new(pre: InstancePre<T>, minor: u16) -> wasmtime::Result<Self> {
        let model = model::GuestIndices::new(&pre)?;
        let require = |name: &str, since: u16| -> wasmtime::Result<bool> {
            if minor < since {
                return Ok(false);
            }
            if pre
                .component()
                .get_export_index(None, export_name(name))
                .is_none()
            {
                return Err(wasmtime::format_err!(
                    "it implements interface 1.{since} or later but does not export `{}`",
                    export_name(name)
                ));
            }
            Ok(true)
        };
        let detail = if require("detail", 1)? {
            Some(detail::GuestIndices::new(&pre)?)
        } else {
            None
        };
        let typed = if require("typed", 2)? {
            Some(typed::GuestIndices::new(&pre)?)
        } else {
            None
        };
        let calibration = if require("calibration", 3)? {
            Some(calibration::GuestIndices::new(&pre)?)
        } else {
            None
        };
        Ok(PluginPre {
            pre,
            model,
            detail,
            typed,
            calibration,
        })
    }

    pub fn instantiate(&self, store: &mut Store<T>) -> wasmtime::Result<Plugin> {
        let instance = self.pre.instantiate(store.as_context_mut())?;
        let model = self.model.load(store.as_context_mut(), &instance)?;
        let detail = match &self.detail {
            Some(t) => Some(t.load(store.as_context_mut(), &instance)?),
            None => None,
        };
        let typed = match &self.typed {
            Some(t) => Some(t.load(store.as_context_mut(), &instance)?),
            None => None,
        };
        let calibration = match &self.calibration {
            Some(t) => Some(t.load(store.as_context_mut(), &instance)?),
            None => None,
        };
        Ok(Plugin {
            model,
            detail,
            typed,
            calibration,
        })
    }
}

/// One instance's exports.
pub struct Plugin {
    pub model: model::Guest,
    /// Interface 1.1's operator details; `None` for a plugin of interface 1.0.
    pub detail: Option<detail::Guest>,
    /// Interface 1.2's typed operators; `None` for a plugin of interface 1.0 or 1.1.
    pub typed: Option<typed::Guest>,
    /// Interface 1.3's calibratable parameters; `None` before 1.3.
    pub calibration: Option<calibration::Guest>,
}

pub fn element_to_wit(e: sdk::ElementType) -> typed::ElementType {
    use sdk::ElementType as E;
    use typed::ElementType as W;
    match e {
        E::Fp32 => W::Fp32,
        E::Bf16 => W::Bf16,
        E::Fp16 => W::Fp16,
        E::Fp8 => W::Fp8,
        E::Mxfp8 => W::Mxfp8,
        E::Nvfp4 => W::Nvfp4,
    }
}

pub fn element_from_wit(e: typed::ElementType) -> sdk::ElementType {
    use sdk::ElementType as E;
    use typed::ElementType as W;
    match e {
        W::Fp32 => E::Fp32,
        W::Bf16 => E::Bf16,
        W::Fp16 => E::Fp16,
        W::Fp8 => E::Fp8,
        W::Mxfp8 => E::Mxfp8,
        W::Nvfp4 => E::Nvfp4,
    }
}

/// An operator as `latency-typed` takes it, with its element type; `None` for fused
/// attention (`attention-detail` prices it).
pub fn typed_op_to_wit(o: &sdk::Op) -> Option<typed::TypedOp> {
    let kind = match o.kind {
        sdk::OpKind::Cast(c) => typed::TypedKind::Cast(typed::Cast {
            elements: c.elements,
            to: element_to_wit(c.to),
            amax_pass: c.amax_pass,
        }),
        _ => typed::TypedKind::Op(op_to_wit(o)?),
    };
    Some(typed::TypedOp {
        kind,
        element: element_to_wit(o.element),
    })
}

pub fn info_from_wit(i: wit::PluginInfo) -> sdk::ModelInfo {
    sdk::ModelInfo {
        name: i.name,
        vendor: i.vendor,
        version: i.version,
        interface_version: (i.interface_version.major, i.interface_version.minor),
        deterministic: i.deterministic,
        provides: sdk::Provides {
            area: i.provides.area,
            latency: i.provides.latency,
        },
        parameters: i
            .parameters
            .into_iter()
            .map(|p| sdk::ParameterInfo {
                name: p.name,
                description: p.description,
                default: p.default,
            })
            .collect(),
        calibratable: Vec::new(),
    }
}

pub fn calibratable_from_wit(c: Vec<calibration::CalibratableParameter>) -> Vec<sdk::Calibratable> {
    c.into_iter()
        .map(|c| sdk::Calibratable {
            name: c.name,
            unit: c.unit,
            lower: c.lower,
            upper: c.upper,
            fit: c.fit,
        })
        .collect()
}

pub fn parameters_to_wit(p: &[sdk::Parameter]) -> Vec<wit::Parameter> {
    p.iter()
        .map(|p| wit::Parameter {
            name: p.name.clone(),
            value: p.value.clone(),
        })
        .collect()
}

pub fn config_to_wit(c: &sdk::AcceleratorConfig) -> wit::AcceleratorConfig {
    wit::AcceleratorConfig {
        tensor_cores: c.tensor_cores,
        vector_cores: c.vector_cores,
        width: c.width,
        depth: c.depth,
        vector_width: c.vector_width,
        buffer_bytes: c.buffer_bytes,
    }
}

pub fn core_to_wit(c: &sdk::CoreConfig) -> wit::CoreConfig {
    wit::CoreConfig {
        kind: match c.kind {
            sdk::CoreKind::Tensor => wit::CoreKind::Tensor,
            sdk::CoreKind::Vector => wit::CoreKind::Vector,
        },
        cores: c.cores,
        width: c.width,
        depth: c.depth,
        buffer_bytes: c.buffer_bytes,
    }
}

fn vector_kind_to_wit(k: sdk::VectorKind) -> wit::VectorKind {
    use sdk::VectorKind as V;
    use wit::VectorKind as W;
    match k {
        V::LayerNorm => W::LayerNorm,
        V::RmsNorm => W::RmsNorm,
        V::Add => W::Add,
        V::Mul => W::Mul,
        V::BiasAdd => W::BiasAdd,
        V::Scale => W::Scale,
        V::Gelu => W::Gelu,
        V::Relu => W::Relu,
        V::Silu => W::Silu,
        V::Tanh => W::Tanh,
        V::Dropout => W::Dropout,
        V::Softmax => W::Softmax,
        V::CrossEntropy => W::CrossEntropy,
        V::Rotary => W::Rotary,
        V::Embedding => W::Embedding,
    }
}

/// A fused attention kernel as `attention-detail` takes it; `None` for any other operator.
pub fn attention_to_wit(o: &sdk::Op) -> Option<detail::Attention> {
    let sdk::OpKind::Attention(a) = o.kind else {
        return None;
    };
    Some(detail::Attention {
        batch: a.batch,
        heads: a.heads,
        kv_heads: a.kv_heads,
        seq: a.seq,
        head_dim: a.head_dim,
        value_dim: a.value_dim,
        causal: a.causal,
        direction: direction_to_wit(o.direction),
    })
}

fn direction_to_wit(d: sdk::Direction) -> wit::Direction {
    match d {
        sdk::Direction::Forward => wit::Direction::Forward,
        sdk::Direction::Backward => wit::Direction::Backward,
    }
}

/// An operator as `latency` takes it (its element type left out: interface 1.2's
/// `typed` carries it); `None` for fused attention, which it cannot carry
/// (`attention-detail` does), and for a cast, which only `latency-typed` can.
pub fn op_to_wit(o: &sdk::Op) -> Option<wit::Op> {
    Some(wit::Op {
        kind: match o.kind {
            sdk::OpKind::Gemm(g) => wit::OpKind::Gemm(wit::Gemm {
                batch: g.batch,
                m: g.m,
                n: g.n,
                k: g.k,
            }),
            sdk::OpKind::Vector {
                kind,
                elements,
                row,
            } => wit::OpKind::Vector(wit::VectorOp {
                kind: vector_kind_to_wit(kind),
                elements,
                row,
            }),
            sdk::OpKind::AllReduce {
                bytes,
                group,
                link_bytes_per_second,
            } => wit::OpKind::AllReduce(wit::AllReduce {
                bytes,
                group,
                link_bytes_per_second,
            }),
            sdk::OpKind::Attention(_) | sdk::OpKind::Cast(_) => return None,
        },
        direction: direction_to_wit(o.direction),
        fused: o
            .fused
            .iter()
            .map(|f| wit::FusedOp {
                kind: vector_kind_to_wit(f.kind),
                elements: f.elements,
            })
            .collect(),
    })
}

/// The plugin's error as the SDK's, with its message capped at `max_bytes` (the caller
/// has already rejected longer ones as a fault; this is belt and braces).
pub fn error_from_wit(e: wit::EstimateError) -> sdk::EstimateError {
    match e {
        wit::EstimateError::OutOfDomain(m) => sdk::EstimateError::OutOfDomain(m),
        wit::EstimateError::Unsupported(m) => sdk::EstimateError::Unsupported(m),
        wit::EstimateError::Internal(m) => sdk::EstimateError::Internal(m),
    }
}

/// Length in bytes of the message an error carries.
pub fn error_message_len(e: &wit::EstimateError) -> usize {
    match e {
        wit::EstimateError::OutOfDomain(m)
        | wit::EstimateError::Unsupported(m)
        | wit::EstimateError::Internal(m) => m.len(),
    }
}
