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
pub use self::exports::archplace::cost_model::{detail, model};
use wasmtime::component::InstancePre;
use wasmtime::{AsContextMut, Store};

/// The name of the `detail` interface (added in 1.1) in a component's exports.
fn detail_export() -> String {
    format!(
        "{}/detail@{}.{}.0",
        sdk::WIT_PACKAGE,
        sdk::INTERFACE_VERSION.0,
        sdk::INTERFACE_VERSION.1
    )
}

/// A component ready to instantiate, with the exports of the interface version it was
/// built for: `model` always, `detail` from 1.1 on. (The world's generated `CostModelPre`
/// would demand every export of the newest minor version, refusing older plugins.)
pub struct PluginPre<T: 'static> {
    pre: InstancePre<T>,
    model: model::GuestIndices,
    detail: Option<detail::GuestIndices>,
}

impl<T: 'static> Clone for PluginPre<T> {
    fn clone(&self) -> Self {
        PluginPre {
            pre: self.pre.clone(),
            model: self.model.clone(),
            detail: self.detail.clone(),
        }
    }
}

impl<T: 'static> PluginPre<T> {
    /// Whether the plugin exports interface 1.1's `detail` (memory times, fused attention).
    pub fn has_detail(&self) -> bool {
        self.detail.is_some()
    }

    /// Finds the exports; `detail` is looked for only when `with_detail` (the plugin
    /// says it implements 1.1 or later, which has it), and must then be there.
    pub fn new(pre: InstancePre<T>, with_detail: bool) -> wasmtime::Result<Self> {
        let model = model::GuestIndices::new(&pre)?;
        let detail = if with_detail {
            if pre
                .component()
                .get_export_index(None, detail_export())
                .is_none()
            {
                return Err(wasmtime::format_err!(
                    "it implements interface 1.1 or later but does not export `{}`",
                    detail_export()
                ));
            }
            Some(detail::GuestIndices::new(&pre)?)
        } else {
            None
        };
        Ok(PluginPre { pre, model, detail })
    }

    pub fn instantiate(&self, store: &mut Store<T>) -> wasmtime::Result<Plugin> {
        let instance = self.pre.instantiate(store.as_context_mut())?;
        let model = self.model.load(store.as_context_mut(), &instance)?;
        let detail = match &self.detail {
            Some(t) => Some(t.load(store.as_context_mut(), &instance)?),
            None => None,
        };
        Ok(Plugin { model, detail })
    }
}

/// One instance's exports.
pub struct Plugin {
    pub model: model::Guest,
    /// Interface 1.1's operator details; `None` for a plugin of interface 1.0.
    pub detail: Option<detail::Guest>,
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
    }
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

/// An operator as `latency` takes it; `None` for fused attention, which it cannot carry
/// (`attention-detail` does).
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
            sdk::OpKind::Attention(_) => return None,
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
