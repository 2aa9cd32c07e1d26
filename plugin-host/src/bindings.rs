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

pub fn op_to_wit(o: &sdk::Op) -> wit::Op {
    wit::Op {
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
        },
        direction: match o.direction {
            sdk::Direction::Forward => wit::Direction::Forward,
            sdk::Direction::Backward => wit::Direction::Backward,
        },
        fused: o
            .fused
            .iter()
            .map(|f| wit::FusedOp {
                kind: vector_kind_to_wit(f.kind),
                elements: f.elements,
            })
            .collect(),
    }
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
