//! The contract between archplace and a cost model.
//!
//! A cost model answers two questions about a candidate accelerator:
//! how large is it ([`AreaModel`], µm² of silicon) and how long does an operator take on
//! some of its cores ([`LatencyModel`], seconds and joules). The search engine depends only
//! on these traits, so the reference model, a vendor's model and a test double are
//! interchangeable. Everything here is plain data: integers where the quantity is a count
//! (so records can be hashed and memoised exactly), SI units everywhere, the unit in the
//! field name.
//!
//! The next step of the project exports the same records through a WIT interface so that
//! vendors can ship their models as sandboxed WebAssembly components; these Rust types are
//! the native form of that interface.

use serde::{Deserialize, Serialize};

pub mod units;

/// Version of the cost-model interface described by this crate (major, minor).
/// Minor versions only add; a host supports every minor of its major.
pub const INTERFACE_VERSION: (u16, u16) = (1, 0);

/// One candidate accelerator: a number of tensor cores (each a `width × depth` MAC array),
/// a number of vector cores (each `vector_width` lanes) and one on-chip global buffer
/// shared by all cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AcceleratorConfig {
    pub tensor_cores: u32,
    pub vector_cores: u32,
    /// Columns of each tensor core's MAC array.
    pub width: u32,
    /// Rows of each tensor core's MAC array.
    pub depth: u32,
    /// Lanes of each vector core.
    pub vector_width: u32,
    /// On-chip global buffer.
    pub buffer_bytes: u64,
}

impl AcceleratorConfig {
    /// The tensor-core part, using `cores` of the tensor cores.
    pub fn tensor_core(&self, cores: u32) -> CoreConfig {
        CoreConfig {
            kind: CoreKind::Tensor,
            cores,
            width: self.width,
            depth: self.depth,
            buffer_bytes: self.buffer_bytes,
        }
    }

    /// The vector-core part, using `cores` of the vector cores.
    pub fn vector_core(&self, cores: u32) -> CoreConfig {
        CoreConfig {
            kind: CoreKind::Vector,
            cores,
            width: self.vector_width,
            depth: 1,
            buffer_bytes: self.buffer_bytes,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoreKind {
    Tensor,
    Vector,
}

/// The cores an operator runs on: `cores` cores of one kind (one core, or all cores of the
/// type for intra-operator parallelism), each `width × depth` (vector cores: `depth = 1`),
/// sharing a global buffer of `buffer_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CoreConfig {
    pub kind: CoreKind,
    pub cores: u32,
    pub width: u32,
    pub depth: u32,
    pub buffer_bytes: u64,
}

/// Forward or backward pass. Element-wise operators cost differently in each direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Forward,
    Backward,
}

/// Element-wise and reduction operators that run on vector lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VectorKind {
    LayerNorm,
    RmsNorm,
    /// Element-wise sum of two activations (residual connections).
    Add,
    /// Element-wise product of two activations (gated MLP).
    Mul,
    /// Broadcast add of a bias vector.
    BiasAdd,
    /// Multiplication by a scalar.
    Scale,
    Gelu,
    Relu,
    Silu,
    Tanh,
    Dropout,
    /// Row-wise softmax (with scale and mask fused, as in fused attention kernels);
    /// `row` of the operator gives the row length.
    Softmax,
    /// Row-wise log-softmax plus negative log-likelihood; `row` is the row length.
    CrossEntropy,
    /// Rotary position embedding applied to queries or keys.
    Rotary,
    /// Table lookup (forward) or scatter-add of gradients (backward).
    Embedding,
}

impl VectorKind {
    pub const ALL: [VectorKind; 15] = [
        VectorKind::LayerNorm,
        VectorKind::RmsNorm,
        VectorKind::Add,
        VectorKind::Mul,
        VectorKind::BiasAdd,
        VectorKind::Scale,
        VectorKind::Gelu,
        VectorKind::Relu,
        VectorKind::Silu,
        VectorKind::Tanh,
        VectorKind::Dropout,
        VectorKind::Softmax,
        VectorKind::CrossEntropy,
        VectorKind::Rotary,
        VectorKind::Embedding,
    ];

    pub fn name(self) -> &'static str {
        match self {
            VectorKind::LayerNorm => "layer_norm",
            VectorKind::RmsNorm => "rms_norm",
            VectorKind::Add => "add",
            VectorKind::Mul => "mul",
            VectorKind::BiasAdd => "bias_add",
            VectorKind::Scale => "scale",
            VectorKind::Gelu => "gelu",
            VectorKind::Relu => "relu",
            VectorKind::Silu => "silu",
            VectorKind::Tanh => "tanh",
            VectorKind::Dropout => "dropout",
            VectorKind::Softmax => "softmax",
            VectorKind::CrossEntropy => "cross_entropy",
            VectorKind::Rotary => "rotary",
            VectorKind::Embedding => "embedding",
        }
    }
}

/// A (batched) matrix multiply: `batch` independent products of an `m × k` and a `k × n`
/// matrix. FLOPs = `2 · batch · m · n · k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Gemm {
    pub batch: u64,
    pub m: u64,
    pub n: u64,
    pub k: u64,
}

impl Gemm {
    pub fn macs(&self) -> u64 {
        self.batch * self.m * self.n * self.k
    }
    pub fn flops(&self) -> f64 {
        2.0 * self.macs() as f64
    }
}

/// Element-wise work fused into an operator (e.g. bias and GELU after a GEMM): charged per
/// element, never as a constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FusedOp {
    pub kind: VectorKind,
    pub elements: u64,
}

/// What an operator computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum OpKind {
    /// Runs on tensor cores.
    Gemm(Gemm),
    /// Runs on vector cores: `elements` output elements; `row` is the length of the
    /// reduced dimension for row-wise operators (softmax, norms, cross-entropy), else 1.
    Vector {
        kind: VectorKind,
        elements: u64,
        row: u64,
    },
    /// Ring all-reduce of `bytes` over `group` devices on links of
    /// `link_bytes_per_second` each (tensor parallelism).
    AllReduce {
        bytes: u64,
        group: u32,
        link_bytes_per_second: u64,
    },
}

/// One operator as a cost model sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Op {
    pub kind: OpKind,
    pub direction: Direction,
    /// Element-wise operators fused into this one, in order.
    pub fused: Vec<FusedOp>,
}

/// Cost of one operator on one core configuration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpCost {
    pub seconds: f64,
    pub joules: f64,
}

/// Why a cost model could not give an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum EstimateError {
    /// The configuration is outside what the model describes: that candidate is infeasible,
    /// the search goes on.
    #[error("configuration outside the model's domain: {0}")]
    OutOfDomain(String),
    /// The model does not know this operator: a fault of the model.
    #[error("unsupported operator: {0}")]
    Unsupported(String),
    /// Anything else that went wrong inside the model: a fault of the model.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Which questions a cost model answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provides {
    pub area: bool,
    pub latency: bool,
}

/// A parameter that a spec may set for a cost model, with its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParameterInfo {
    pub name: String,
    pub description: String,
    /// Default value, in the same human form a spec uses (e.g. `"1.05 GHz"`).
    pub default: String,
}

/// What a cost model says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub vendor: String,
    pub version: String,
    pub interface_version: (u16, u16),
    /// Same inputs always give the same outputs (lets the host memoise across searches).
    pub deterministic: bool,
    pub provides: Provides,
    pub parameters: Vec<ParameterInfo>,
}

/// Silicon area of accelerator candidates.
pub trait AreaModel: Send + Sync {
    fn info(&self) -> ModelInfo;
    /// Area in µm² of each configuration, in order. A configuration outside the model's
    /// domain gets `Err(OutOfDomain)`; a fault of the model fails the whole call.
    fn area_um2(
        &self,
        configs: &[AcceleratorConfig],
    ) -> Result<Vec<Result<f64, EstimateError>>, EstimateError>;
}

/// Latency and energy of operators.
pub trait LatencyModel: Send + Sync {
    fn info(&self) -> ModelInfo;
    /// Cost of each operator on `core` (its `cores` field says how many cores the operator
    /// is spread over), in order.
    fn latency(&self, core: &CoreConfig, ops: &[Op]) -> Result<Vec<OpCost>, EstimateError>;
}
