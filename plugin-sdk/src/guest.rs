//! Conversions between the WIT records of the guest bindings and this crate's types, used
//! by [`export_plugin!`](crate::export_plugin). Only built for WebAssembly.

use crate::{
    AcceleratorConfig, Cast, CoreConfig, CoreKind, Direction, ElementType, EstimateError, FusedOp,
    Gemm, ModelInfo, Op, OpCost, OpKind, Parameter, ParameterError, VectorKind,
};

/// The generated WIT types, under short names for the macro.
pub mod wit {
    pub use crate::bindings::archplace::cost_model::types::*;
}

/// The records of the `detail` interface (added in 1.1).
pub mod detail {
    pub use crate::bindings::exports::archplace::cost_model::detail::*;
}

/// The records of the `typed` interface (added in 1.2).
pub mod typed {
    pub use crate::bindings::exports::archplace::cost_model::typed::*;
}

/// The records of the `calibration` interface (added in 1.3).
pub mod calibration {
    pub use crate::bindings::exports::archplace::cost_model::calibration::*;
}

/// What `calibratable` answers: the model's declarations.
pub fn calibratable_to_wit(i: &ModelInfo) -> Vec<calibration::CalibratableParameter> {
    i.calibratable
        .iter()
        .map(|c| calibration::CalibratableParameter {
            name: c.name.clone(),
            unit: c.unit.clone(),
            lower: c.lower,
            upper: c.upper,
            fit: c.fit,
        })
        .collect()
}

pub fn values_to_wit(values: Vec<(String, f64)>) -> Vec<calibration::ParameterValue> {
    values
        .into_iter()
        .map(|(name, value)| calibration::ParameterValue { name, value })
        .collect()
}

pub fn info_to_wit(i: &ModelInfo) -> wit::PluginInfo {
    wit::PluginInfo {
        name: i.name.clone(),
        vendor: i.vendor.clone(),
        version: i.version.clone(),
        interface_version: wit::InterfaceVersion {
            major: i.interface_version.0,
            minor: i.interface_version.1,
        },
        deterministic: i.deterministic,
        provides: wit::Provides {
            area: i.provides.area,
            latency: i.provides.latency,
        },
        parameters: i
            .parameters
            .iter()
            .map(|p| wit::ParameterInfo {
                name: p.name.clone(),
                description: p.description.clone(),
                default: p.default.clone(),
            })
            .collect(),
    }
}

pub fn parameters_from_wit(p: Vec<wit::Parameter>) -> Vec<Parameter> {
    p.into_iter()
        .map(|p| Parameter {
            name: p.name,
            value: p.value,
        })
        .collect()
}

pub fn parameter_errors_to_wit(e: Vec<ParameterError>) -> Vec<wit::ParameterError> {
    e.into_iter()
        .map(|e| wit::ParameterError {
            name: e.name,
            message: e.message,
        })
        .collect()
}

pub fn describe_parameter_errors(e: &[ParameterError]) -> String {
    let parts: Vec<String> = e.iter().map(|e| e.to_string()).collect();
    format!("default parameters rejected: {}", parts.join("; "))
}

pub fn configs_from_wit(c: &[wit::AcceleratorConfig]) -> Vec<AcceleratorConfig> {
    c.iter()
        .map(|c| AcceleratorConfig {
            tensor_cores: c.tensor_cores,
            vector_cores: c.vector_cores,
            width: c.width,
            depth: c.depth,
            vector_width: c.vector_width,
            buffer_bytes: c.buffer_bytes,
        })
        .collect()
}

pub fn core_from_wit(c: &wit::CoreConfig) -> CoreConfig {
    CoreConfig {
        kind: match c.kind {
            wit::CoreKind::Tensor => CoreKind::Tensor,
            wit::CoreKind::Vector => CoreKind::Vector,
        },
        cores: c.cores,
        width: c.width,
        depth: c.depth,
        buffer_bytes: c.buffer_bytes,
    }
}

fn vector_kind(k: wit::VectorKind) -> VectorKind {
    use wit::VectorKind as W;
    match k {
        W::LayerNorm => VectorKind::LayerNorm,
        W::RmsNorm => VectorKind::RmsNorm,
        W::Add => VectorKind::Add,
        W::Mul => VectorKind::Mul,
        W::BiasAdd => VectorKind::BiasAdd,
        W::Scale => VectorKind::Scale,
        W::Gelu => VectorKind::Gelu,
        W::Relu => VectorKind::Relu,
        W::Silu => VectorKind::Silu,
        W::Tanh => VectorKind::Tanh,
        W::Dropout => VectorKind::Dropout,
        W::Softmax => VectorKind::Softmax,
        W::CrossEntropy => VectorKind::CrossEntropy,
        W::Rotary => VectorKind::Rotary,
        W::Embedding => VectorKind::Embedding,
    }
}

pub fn ops_from_wit(ops: &[wit::Op]) -> Vec<Op> {
    ops.iter().map(op_from_wit).collect()
}

fn element_from_wit(e: typed::ElementType) -> ElementType {
    use typed::ElementType as W;
    match e {
        W::Fp32 => ElementType::Fp32,
        W::Bf16 => ElementType::Bf16,
        W::Fp16 => ElementType::Fp16,
        W::Fp8 => ElementType::Fp8,
        W::Mxfp8 => ElementType::Mxfp8,
        W::Nvfp4 => ElementType::Nvfp4,
    }
}

pub fn element_types_to_wit(types: &[ElementType]) -> Vec<typed::ElementType> {
    use typed::ElementType as W;
    types
        .iter()
        .map(|e| match e {
            ElementType::Fp32 => W::Fp32,
            ElementType::Bf16 => W::Bf16,
            ElementType::Fp16 => W::Fp16,
            ElementType::Fp8 => W::Fp8,
            ElementType::Mxfp8 => W::Mxfp8,
            ElementType::Nvfp4 => W::Nvfp4,
        })
        .collect()
}

/// The operators of `latency-typed`, each with its element type; a cast as
/// [`OpKind::Cast`], forward.
pub fn typed_ops_from_wit(ops: &[typed::TypedOp]) -> Vec<Op> {
    ops.iter()
        .map(|t| {
            let op = match &t.kind {
                typed::TypedKind::Op(o) => op_from_wit(o),
                typed::TypedKind::Cast(c) => Op::new(
                    OpKind::Cast(Cast {
                        elements: c.elements,
                        to: element_from_wit(c.to),
                        amax_pass: c.amax_pass,
                    }),
                    Direction::Forward,
                ),
            };
            op.with_element(element_from_wit(t.element))
        })
        .collect()
}

fn op_from_wit(o: &wit::Op) -> Op {
    Op {
        kind: match o.kind {
            wit::OpKind::Gemm(g) => OpKind::Gemm(Gemm {
                batch: g.batch,
                m: g.m,
                n: g.n,
                k: g.k,
            }),
            wit::OpKind::Vector(v) => OpKind::Vector {
                kind: vector_kind(v.kind),
                elements: v.elements,
                row: v.row,
            },
            wit::OpKind::AllReduce(a) => OpKind::AllReduce {
                bytes: a.bytes,
                group: a.group,
                link_bytes_per_second: a.link_bytes_per_second,
            },
        },
        direction: direction_from_wit(o.direction),
        fused: o
            .fused
            .iter()
            .map(|f| FusedOp {
                kind: vector_kind(f.kind),
                elements: f.elements,
            })
            .collect(),
        element: ElementType::Bf16,
    }
}

fn error_to_wit(e: EstimateError) -> wit::EstimateError {
    match e {
        EstimateError::OutOfDomain(m) => wit::EstimateError::OutOfDomain(m),
        EstimateError::Unsupported(m) => wit::EstimateError::Unsupported(m),
        EstimateError::Internal(m) => wit::EstimateError::Internal(m),
    }
}

pub fn areas_to_wit(
    r: Result<Vec<Result<f64, EstimateError>>, EstimateError>,
) -> Result<Vec<Result<f64, wit::EstimateError>>, wit::EstimateError> {
    r.map(|v| v.into_iter().map(|a| a.map_err(error_to_wit)).collect())
        .map_err(error_to_wit)
}

pub fn costs_to_wit(
    r: Result<Vec<OpCost>, EstimateError>,
) -> Result<Vec<wit::OpCost>, wit::EstimateError> {
    r.map(|v| {
        v.into_iter()
            .map(|c| wit::OpCost {
                seconds: c.seconds,
                joules: c.joules,
            })
            .collect()
    })
    .map_err(error_to_wit)
}

fn direction_from_wit(d: wit::Direction) -> Direction {
    match d {
        wit::Direction::Forward => Direction::Forward,
        wit::Direction::Backward => Direction::Backward,
    }
}

/// The fused attention kernels of `attention-detail`, as operators.
pub fn attention_from_wit(ops: &[detail::Attention]) -> Vec<Op> {
    ops.iter()
        .map(|a| Op {
            kind: crate::OpKind::Attention(crate::Attention {
                batch: a.batch,
                heads: a.heads,
                kv_heads: a.kv_heads,
                seq: a.seq,
                head_dim: a.head_dim,
                value_dim: a.value_dim,
                causal: a.causal,
            }),
            direction: direction_from_wit(a.direction),
            fused: Vec::new(),
            element: ElementType::Bf16,
        })
        .collect()
}

pub fn details_to_wit(
    r: Result<Vec<OpCost>, EstimateError>,
) -> Result<Vec<detail::OpDetail>, wit::EstimateError> {
    r.map(|v| {
        v.into_iter()
            .map(|c| detail::OpDetail {
                seconds: c.seconds,
                joules: c.joules,
                memory_seconds: c.memory_seconds,
            })
            .collect()
    })
    .map_err(error_to_wit)
}

/// Sends a line to the host's log (capped in size and rate by the host).
pub fn log(level: crate::LogLevel, message: &str) {
    use crate::bindings::archplace::cost_model::host::{Level, log};
    let level = match level {
        crate::LogLevel::Error => Level::Error,
        crate::LogLevel::Warn => Level::Warn,
        crate::LogLevel::Info => Level::Info,
        crate::LogLevel::Debug => Level::Debug,
    };
    log(level, message);
}
