//! Operator graphs of one layer: how they are built, differentiated and fused.
//!
//! A layer is first written as an *unfused* forward graph of [`FwdOp`]s — each GEMM, each
//! element-wise operator, each collective — with its data operands (other operators or the
//! layer's input) and the tensors it saves for the backward pass. From that:
//! * the **stashed activation bytes** are the distinct saved tensors;
//! * the **backward graph** is derived operator by operator: a weight GEMM gives an
//!   input-gradient and a weight-gradient GEMM, an activation×activation GEMM gives the
//!   gradients of both operands, element-wise operators their backward kernels, and the
//!   Megatron conjugate collectives swap (an all-reduce in forward is an identity in
//!   backward and vice versa);
//! * both graphs are **fused** with the reference's rules (`docs/reference.md` §1), except that an
//!   operator with an operand from outside the layer (a residual) is never taken for a
//!   single-input one, and fused element-wise work keeps its element count.

use crate::execution::{CrossEntropy, Fp8Library, KernelFusion};
use crate::training::{Fp8Scaling, RecomputeModule};
use archplace_plugin_sdk::{
    Attention, Cast, Direction, ElementType, FusedOp, Gemm, Op, OpKind, VectorKind,
};
use serde::Serialize;

/// Which resources an operator occupies while it runs (the layer schedule's view).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Core {
    /// Tensor cores.
    Tensor,
    /// Vector cores.
    Vector,
    /// A GEMM with a fused element-wise epilogue: a tensor core and a vector core at once.
    Fused,
    /// The network links (tensor-parallel collectives); no core is occupied.
    Link,
}

/// One operator of a (fused) layer graph.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpNode {
    pub name: String,
    pub core: Core,
    pub op: Op,
    /// A sequence-parallel all-gather or reduce-scatter: the collective that feeds a GEMM
    /// its input or takes its output, which Transformer Engine's tensor-parallel overlap
    /// (`tp_comm_overlap`) cuts into chunks pipelined with that GEMM
    /// ([`crate::operators::pipelined_exposure`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pipelined: bool,
    /// The share of the operator's forward work whose output per-operator selective
    /// checkpointing keeps ([`crate::training::Recomputation::SelectiveOp`],
    /// [`LayerBuilder::op_checkpoint`]); the rest of its work runs again in backward.
    #[serde(skip_serializing_if = "is_zero")]
    pub checkpoint_saved: f64,
    /// Selective recomputation runs it again: it belongs to one of the plan's
    /// [`crate::training::RecomputeModules`] ([`FwdOp::recompute`]; a fused node is its
    /// first operator's).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub selective: bool,
}

/// The names the model builder gives the attention core's operators (scores, softmax,
/// its dropout, the product with the values) and the fused kernel doing them: what
/// selective recomputation's `core_attn` module reruns.
pub const ATTENTION_CORE: [&str; 5] = [
    "scores",
    "softmax",
    "attention_dropout",
    "context",
    "flash_attention",
];

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl OpNode {
    /// Whether the node computes the attention core (scores, softmax, its dropout, the
    /// product with the values, or the fused kernel doing all four): what selective
    /// recomputation runs again — Megatron-LM checkpoints its core-attention module,
    /// fused or not (`recompute_modules = ["core_attn"]`, `_checkpointed_attention_forward`).
    pub fn is_attention_core(&self) -> bool {
        ATTENTION_CORE.iter().any(|p| self.name.starts_with(p))
    }

    /// The share of this forward operator's work that recomputation `r` runs again in
    /// backward: none, the whole of a selectively recomputed module's operator, what
    /// per-operator checkpointing does not keep of it, all of it.
    pub fn rerun_share(&self, r: crate::training::Recomputation) -> f64 {
        use crate::training::Recomputation;
        match r {
            Recomputation::None => 0.0,
            Recomputation::Selective => f64::from(u8::from(self.selective)),
            Recomputation::SelectiveOp => 1.0 - self.checkpoint_saved,
            Recomputation::Full => 1.0,
        }
    }

    /// Matrix-multiply FLOPs the operator runs (a fused attention kernel's, with what its
    /// causal mask skips and its backward recomputes: [`Attention::flops`]).
    pub fn matmul_flops(&self) -> f64 {
        match self.op.kind {
            OpKind::Gemm(g) => g.flops(),
            OpKind::Attention(a) => a.flops(self.op.direction),
            _ => 0.0,
        }
    }

    /// Matrix-multiply FLOPs a model-FLOPs count (MFU) charges: as run, except that fused
    /// attention counts its unmasked products, twice them backward
    /// ([`Attention::model_flops`]), as Megatron-LM's and PaLM's formulas do.
    pub fn model_flops(&self) -> f64 {
        match self.op.kind {
            OpKind::Attention(a) => a.model_flops(self.op.direction),
            _ => self.matmul_flops(),
        }
    }
}

/// What kind of work an operator does, for the step's time by operator
/// ([`crate::step::OperatorSeconds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// The attention core: scores, softmax and context, or a fused attention kernel.
    Attention,
    /// A Mixture-of-Experts router: its GEMM, softmax and top-k.
    Router,
    /// Tokens permuted to their experts and back.
    Permutation,
    /// The experts' grouped GEMMs.
    ExpertGemm,
    /// Every other GEMM.
    Gemm,
    /// Every other element-wise or row-wise operator.
    Vector,
    /// Tensor- and expert-tensor-parallel collectives.
    Collective,
    /// Quantising casts to FP8 or MXFP8 that run as kernels of their own (those fused into
    /// a norm, an activation or a GEMM's epilogue are that kernel's time), and the
    /// row-wise recipe's rescaling of its backward GEMMs' outputs (`LayerBuilder::rescaled`).
    Cast,
}

impl Work {
    pub const COUNT: usize = 8;
}

impl OpNode {
    /// What kind of work the operator does (by the name the model builder gave it; a
    /// fused operator is its first operator's kind, a backward one its forward one's).
    pub fn work(&self) -> Work {
        let n = self.name.as_str();
        if self.core == Core::Link {
            Work::Collective
        } else if matches!(self.op.kind, OpKind::Cast(_)) || n.contains(RESCALE) {
            Work::Cast
        } else if self.is_attention_core() {
            Work::Attention
        } else if n.starts_with("router") {
            Work::Router
        } else if n.starts_with("permutation") || n.starts_with("unpermutation") {
            Work::Permutation
        } else if matches!(self.op.kind, OpKind::Gemm(_)) && n.starts_with("expert_") {
            Work::ExpertGemm
        } else if matches!(self.op.kind, OpKind::Gemm(_)) {
            Work::Gemm
        } else {
            Work::Vector
        }
    }
}

/// A directed acyclic graph of operators; an edge `(a, b)` means `a` finishes before `b`
/// starts. Node order is a topological order.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct OpGraph {
    pub nodes: Vec<OpNode>,
    pub edges: Vec<(usize, usize)>,
}

impl OpGraph {
    /// The first operator whose name starts with `prefix` (a fused one's name begins with
    /// its first operator's).
    pub fn node(&self, prefix: &str) -> Option<&OpNode> {
        self.nodes.iter().find(|n| n.name.starts_with(prefix))
    }

    pub fn matmul_flops(&self) -> f64 {
        self.nodes.iter().map(OpNode::matmul_flops).sum()
    }

    /// What a model-FLOPs count charges for the graph ([`OpNode::model_flops`]).
    pub fn model_flops(&self) -> f64 {
        self.nodes.iter().map(OpNode::model_flops).sum()
    }

    pub fn count(&self, core: Core) -> usize {
        self.nodes.iter().filter(|n| n.core == core).count()
    }
}

/// A data operand of a forward operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The output of operator `i` of the same layer.
    Op(usize),
    /// The layer's input (from the previous layer, or data such as token ids).
    External,
}

/// Whether the second operand of a GEMM is a weight or another activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    Weight,
    Activation,
    /// One weight per product of the batch: the experts of a grouped GEMM, each over its
    /// own tokens (the weight gradient stays grouped).
    Experts,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FwdKind {
    Gemm {
        gemm: Gemm,
        second: Operand,
    },
    Vector {
        kind: VectorKind,
        elements: u64,
        row: u64,
    },
    /// Fused attention (FlashAttention): one kernel forward and one backward, on a
    /// tensor and a vector core; its operands are the queries and keys, then the values.
    Attention(Attention),
    /// Megatron's `g`: all-reduce in forward, identity in backward.
    AllReduceForward {
        bytes: u64,
        group: u32,
        link_bytes_per_second: u64,
    },
    /// Megatron's `f`: identity in forward, all-reduce in backward.
    AllReduceBackward {
        bytes: u64,
        group: u32,
        link_bytes_per_second: u64,
    },
    /// A collective in both passes: sequence parallelism's all-gather (forward) and
    /// reduce-scatter (backward), or the reverse. Each is costed as a ring all-reduce of
    /// half the full tensor, which moves the same bytes per device: `bytes` forward,
    /// `backward_bytes` backward (fewer forward when an FP8 recipe gathers its GEMM's
    /// input quantised, [`LayerBuilder::quantise`]).
    AllReduceBoth {
        bytes: u64,
        backward_bytes: u64,
        group: u32,
        link_bytes_per_second: u64,
    },
    /// A quantising cast in forward (an FP8 GEMM's input), identity in backward (the
    /// gradient flows to the unquantised tensor).
    CastForward(Cast),
    /// Identity in forward, a quantising cast in backward (an FP8 GEMM's output gradient,
    /// cast before its two backward GEMMs read it).
    CastBackward(Cast),
}

/// A tensor saved for the backward pass, identified by the operator that produced it (or
/// the layer input) and a part name, so that two operators saving the same tensor count
/// it once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub producer: Input,
    pub part: &'static str,
    pub bytes: u64,
}

/// A tensor kept from the forward pass for the backward pass, per micro-batch on one rank.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KeptTensor {
    /// The operator whose output it is (or the layer's input).
    pub producer: String,
    /// Which of its tensors (`out`, `mask`, …).
    pub part: &'static str,
    pub bytes: u64,
    /// Recomputed instead of kept under selective recomputation (of the plan's modules:
    /// [`LayerBuilder::selective_stash_bytes`]).
    pub recomputed: bool,
    /// The operators whose backward pass reads it.
    pub needed_by: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FwdOp {
    pub name: String,
    pub kind: FwdKind,
    pub inputs: Vec<Input>,
    pub saves: Vec<Saved>,
    /// The element type of its data when not the layer's ([`LayerBuilder::element`]): a
    /// quantised GEMM's, in both passes.
    pub element: Option<ElementType>,
    /// See [`OpNode::checkpoint_saved`].
    pub checkpoint_saved: f64,
    /// The outermost of the plan's recomputed modules it belongs to
    /// ([`crate::training::Recomputation::Selective`]), if any.
    pub recompute: Option<RecomputeModule>,
}

/// For each of `ops`, the operators reading its output: (reader, operand position).
fn readers(ops: &[FwdOp]) -> Vec<Vec<(usize, usize)>> {
    let mut readers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ops.len()];
    for (c, op) in ops.iter().enumerate() {
        for (pos, input) in op.inputs.iter().enumerate() {
            if let Input::Op(p) = *input {
                readers[p].push((c, pos));
            }
        }
    }
    readers
}

/// Which of `ops` are sequence parallelism's all-gathers whose every reader is a weight
/// GEMM that `quantise` picks, reading it as its input: those an FP8 recipe gathers
/// quantised ([`LayerBuilder::quantise`]). The logits' gather (the output layer stays in
/// 16-bit), a reduce-scatter (a GEMM's output) and the experts' gather are not.
fn quantised_gathers(ops: &[FwdOp], quantise: &impl Fn(&FwdOp) -> bool) -> Vec<bool> {
    let readers = readers(ops);
    ops.iter()
        .zip(&readers)
        .map(|(op, readers)| {
            matches!(op.kind, FwdKind::AllReduceBoth { .. })
                && !readers.is_empty()
                && readers.iter().all(|&(c, pos)| {
                    pos == 0
                        && matches!(
                            ops[c].kind,
                            FwdKind::Gemm {
                                second: Operand::Weight,
                                ..
                            }
                        )
                        && quantise(&ops[c])
                })
        })
        .collect()
}

impl FwdOp {
    /// Sequence parallelism's all-gather and reduce-scatter (one each way), as opposed to
    /// an all-reduce or the extra all-gather for the weight gradient.
    fn is_sequence_parallel_collective(&self) -> bool {
        matches!(self.kind, FwdKind::AllReduceBoth { .. })
    }
}

/// The unfused forward graph of a layer, written operator by operator.
#[derive(Debug, Clone, Default)]
pub struct LayerBuilder {
    pub ops: Vec<FwdOp>,
    /// The element type of the layer's data (bf16 unless set).
    pub element: ElementType,
    /// The FP8 recipe its quantised GEMMs' casts follow ([`LayerBuilder::quantise`]).
    pub scaling: Fp8Scaling,
    /// Fused kernels (the fusion rules join operators) or eager PyTorch's (each operator
    /// its kernels, `eager_kernels`).
    pub kernels: KernelFusion,
    /// What its quantised GEMMs save for the backward pass: FP8 copies (Transformer
    /// Engine) or their 16-bit inputs, cast again in backward (torchao).
    pub fp8_library: Fp8Library,
    /// How its loss runs, and whether its vocabulary is split over tensor-parallel ranks:
    /// the kernels of a cross-entropy operator (`loss_kernels`).
    pub cross_entropy: (CrossEntropy, bool),
}

impl LayerBuilder {
    pub fn push(
        &mut self,
        name: &str,
        kind: FwdKind,
        inputs: Vec<Input>,
        saves: Vec<Saved>,
    ) -> Input {
        self.ops.push(FwdOp {
            name: name.to_string(),
            kind,
            inputs,
            saves,
            element: None,
            checkpoint_saved: 0.0,
            recompute: None,
        });
        Input::Op(self.ops.len() - 1)
    }

    /// What computes `x` in forward: its producer, or the first before it that is not an
    /// identity forward (an FP8 output gradient's cast, Megatron's `f`).
    fn computed_by(&self, mut x: Input) -> Option<&FwdKind> {
        while let Input::Op(p) = x {
            match &self.ops[p].kind {
                FwdKind::CastBackward(_) | FwdKind::AllReduceBackward { .. } => {
                    x = *self.ops[p].inputs.first()?;
                }
                kind => return Some(kind),
            }
        }
        None
    }

    /// PyTorch's per-operator selective checkpointing of this layer, as torchtitan wraps
    /// each block ([`crate::training::Recomputation::SelectiveOp`]): marks on each
    /// operator the share of its forward work whose output is kept
    /// ([`FwdOp::checkpoint_saved`]) and returns the bytes those outputs take, kept beside
    /// the block's input. torchtitan's policy (`torchtitan/distributed/activation_checkpoint.py`
    /// until its 2025 rewrite by names, the version its paper measured) saves the outputs of
    /// the SDPA kernels, of the reduce-scatters and of `aten.mm` — of those only every
    /// other one, counted per block in the order they run: the first, third, … are kept,
    /// the second, fourth, … recomputed. A weight GEMM in the layer's element type is one
    /// `mm` per linear layer it stands for, `linears` giving their output widths (the
    /// fused QKV projection is three: `wq`, `wk`, `wv`; none for a linear layer with a
    /// bias, which runs `addmm`); a quantised one runs
    /// `_scaled_mm` under Transformer Engine — but under torchao an `mm` of its FP8 tensor
    /// subclass, which the policy sees as `aten.mm` and treats as any — and the experts'
    /// GEMMs `_grouped_mm`, neither kept nor counted, nor
    /// the attention core's batched products (`bmm`) when attention is not fused.
    pub fn op_checkpoint(
        &mut self,
        linears: impl Fn(&FwdOp) -> Vec<u64>,
        bytes_per_element: u64,
    ) -> u64 {
        let mut mm = 0u64;
        let mut kept = 0;
        for i in 0..self.ops.len() {
            let op = &self.ops[i];
            let (share, bytes) = match op.kind {
                FwdKind::Gemm {
                    gemm,
                    second: Operand::Weight,
                } if op.element.is_none() || self.fp8_library == Fp8Library::Torchao => {
                    let widths = linears(op);
                    let mut saved = 0;
                    for w in &widths {
                        mm += 1;
                        if mm % 2 == 1 {
                            saved += w;
                        }
                    }
                    let all = widths.iter().sum::<u64>().max(1);
                    (
                        saved as f64 / all as f64,
                        gemm.batch * gemm.m * saved * bytes_per_element,
                    )
                }
                // The kernel's output and its log-sum-exp, the tensors it saves of itself.
                FwdKind::Attention(_) => (
                    1.0,
                    op.saves
                        .iter()
                        .filter(|s| s.producer == Input::Op(i))
                        .map(|s| s.bytes)
                        .sum(),
                ),
                // Sequence parallelism's reduce-scatter of a GEMM's partial sums (the
                // all-gather before a GEMM is recomputed): a `t`-th of the tensor whose
                // half `bytes` is.
                FwdKind::AllReduceBoth { bytes, group, .. }
                    if op.inputs.first().is_some_and(|&x| {
                        matches!(self.computed_by(x), Some(FwdKind::Gemm { .. }))
                    }) =>
                {
                    (1.0, 2 * bytes / u64::from(group.max(1)))
                }
                _ => (0.0, 0),
            };
            self.ops[i].checkpoint_saved = share;
            kept += bytes;
        }
        kept
    }

    /// Runs the weight GEMMs `quantise` picks (by name and kind) in `to`: each one's
    /// input is cast to it first (one cast per tensor, however many such GEMMs read it),
    /// its output gradient is cast backward, and what it saves of its input for its weight
    /// gradient is kept in `to`, `bytes_per_element` the layer's element bytes. Returns
    /// the weights of those GEMMs, the parameters whose quantised copies the step keeps.
    pub fn quantise(
        &mut self,
        to: ElementType,
        scaling: Fp8Scaling,
        bytes_per_element: u64,
        quantise: impl Fn(&FwdOp) -> bool,
    ) -> u64 {
        self.scaling = scaling;
        let amax_pass = scaling.casts_read_twice();
        let old = std::mem::take(&mut self.ops);
        let gathered_quantised = if self.gathers_quantised(scaling) {
            quantised_gathers(&old, &quantise)
        } else {
            vec![false; old.len()]
        };
        // What consumers of old operator i read (its cast gradient's node for a
        // quantised GEMM), and where its own output is (for saves naming it).
        let mut out_of: Vec<Input> = Vec::with_capacity(old.len());
        let mut node_of: Vec<Input> = Vec::with_capacity(old.len());
        let mut casts: Vec<(Input, Input)> = Vec::new();
        let mut weights = 0;
        let remap = |i: Input, to: &[Input]| match i {
            Input::Op(p) => to[p],
            Input::External => Input::External,
        };
        for (index, mut op) in old.into_iter().enumerate() {
            op.inputs = op.inputs.iter().map(|&i| remap(i, &out_of)).collect();
            if gathered_quantised[index] {
                self.gather_quantised(&mut op, to, amax_pass, bytes_per_element);
                // Its output is already in `to`: the GEMMs reading it cast nothing.
                let at = Input::Op(self.ops.len());
                casts.push((at, at));
            }
            let gemm = match op.kind {
                FwdKind::Gemm {
                    gemm,
                    second: second @ (Operand::Weight | Operand::Experts),
                } if quantise(&op) => Some((gemm, second)),
                _ => None,
            };
            let cast = |elements: u64| Cast {
                elements,
                to,
                amax_pass,
            };
            if let Some((gemm, second)) = gemm {
                weights += match second {
                    Operand::Experts => gemm.batch * gemm.k * gemm.n,
                    _ => gemm.k * gemm.n,
                };
                let x = op.inputs.first().copied().unwrap_or(Input::External);
                let cast_in = match casts.iter().find(|(from, _)| *from == x) {
                    Some(&(_, c)) => c,
                    None => {
                        let c = self.push(
                            &format!("{}.cast", op.name),
                            FwdKind::CastForward(cast(gemm.batch * gemm.m * gemm.k)),
                            vec![x],
                            vec![],
                        );
                        casts.push((x, c));
                        c
                    }
                };
                if let Some(first) = op.inputs.first_mut() {
                    *first = cast_in;
                }
                // torchao saves the 16-bit input (and casts it again in backward:
                // `backward_nodes`).
                if self.fp8_library == Fp8Library::TransformerEngine {
                    for s in &mut op.saves {
                        let elements = s.bytes / bytes_per_element.max(1);
                        s.bytes = (elements as f64 * to.bytes()).ceil() as u64;
                        s.part = "quantised";
                    }
                }
                op.element = Some(to);
            }
            // Its place is known before its saves are renamed: one of them may be its own
            // output.
            let at = Input::Op(self.ops.len());
            node_of.push(at);
            for s in &mut op.saves {
                s.producer = remap(s.producer, &node_of);
            }
            let name = op.name.clone();
            self.ops.push(op);
            out_of.push(match gemm {
                Some((gemm, _)) => self.push(
                    &format!("{name}.cast_gradient"),
                    FwdKind::CastBackward(cast(gemm.batch * gemm.m * gemm.n)),
                    vec![at],
                    vec![],
                ),
                None => at,
            });
        }
        weights
    }

    /// Sequence parallelism's all-gather `op` (an [`FwdKind::AllReduceBoth`], its inputs
    /// already in the new list) of an input that only quantised GEMMs read, made as
    /// Transformer Engine makes it under an FP8 recipe: the rank's shard is cast to `to`
    /// first and gathered in `to` (the reduce-scatter of its gradient backward stays in
    /// the layer's type); the backward pass's extra all-gather of the same shard for the
    /// weight gradient (an [`FwdKind::AllReduceBackward`] right before it) gathers the
    /// quantised shard too.
    fn gather_quantised(
        &mut self,
        op: &mut FwdOp,
        to: ElementType,
        amax_pass: bool,
        bytes_per_element: u64,
    ) {
        let FwdKind::AllReduceBoth {
            bytes,
            backward_bytes,
            group,
            link_bytes_per_second,
        } = op.kind
        else {
            return;
        };
        // `bytes` is half the gathered tensor in the layer's type.
        let elements = 2 * bytes / bytes_per_element.max(1);
        let quantised = |elements: u64| (elements as f64 * to.bytes() / 2.0).ceil() as u64;
        let x = op.inputs.first().copied().unwrap_or(Input::External);
        if let Input::Op(j) = x
            && let FwdKind::AllReduceBackward {
                bytes: again,
                group,
                link_bytes_per_second,
            } = self.ops[j].kind
        {
            self.ops[j].kind = FwdKind::AllReduceBackward {
                bytes: quantised(2 * again / bytes_per_element.max(1)),
                group,
                link_bytes_per_second,
            };
        }
        let cast = self.push(
            &format!("{}.cast", op.name),
            FwdKind::CastForward(Cast {
                elements: elements.div_ceil(u64::from(group.max(1))),
                to,
                amax_pass,
            }),
            vec![x],
            vec![],
        );
        if let Some(first) = op.inputs.first_mut() {
            *first = cast;
        }
        op.kind = FwdKind::AllReduceBoth {
            bytes: quantised(elements),
            backward_bytes,
            group,
            link_bytes_per_second,
        };
    }

    /// Records that operator `op` saves (part of) its own output for the backward pass.
    pub fn save_output(&mut self, op: Input, part: &'static str, bytes: u64) {
        if let Input::Op(i) = op {
            self.ops[i].saves.push(Saved {
                producer: op,
                part,
                bytes,
            });
        }
    }

    /// Bytes of the distinct tensors saved for the backward pass.
    pub fn stash_bytes(&self) -> u64 {
        self.stash_bytes_where(|_, _| true)
    }

    /// Bytes of the distinct saved tensors selective recomputation keeps, the operators'
    /// [`FwdOp::recompute`] marked: a module checkpointed as Megatron-LM does it keeps its
    /// input and drops what its operators save of each other's outputs (a tensor an
    /// operator outside it keeps too, its output, stays); one checkpointed without its
    /// output ([`RecomputeModule::drops_output`]) drops its outputs wherever they are kept.
    pub fn selective_stash_bytes(&self) -> u64 {
        self.stash_bytes_where(|saver, s| !self.recomputed(saver, s))
    }

    /// Whether selective recomputation drops tensor `s` that operator `saver` keeps
    /// ([`LayerBuilder::selective_stash_bytes`]).
    fn recomputed(&self, saver: &FwdOp, s: &Saved) -> bool {
        let made_in = match s.producer {
            Input::Op(p) => self.ops.get(p).and_then(|o| o.recompute),
            Input::External => None,
        };
        match (made_in, saver.recompute) {
            (Some(m), _) if m.drops_output() => true,
            (Some(m), Some(k)) => m == k,
            _ => false,
        }
    }

    /// The distinct tensors the forward pass keeps for the backward pass, in the order
    /// the operators save them: what produced each, which operators' backward needs it.
    pub fn kept_tensors(&self) -> Vec<KeptTensor> {
        let mut out: Vec<(Input, KeptTensor)> = Vec::new();
        for op in &self.ops {
            for s in &op.saves {
                if let Some((_, k)) = out
                    .iter_mut()
                    .find(|(p, k)| *p == s.producer && k.part == s.part)
                {
                    k.needed_by.push(op.name.clone());
                    k.recomputed &= self.recomputed(op, s);
                    continue;
                }
                let producer = match s.producer {
                    Input::Op(i) => self.ops.get(i).map_or("?", |o| o.name.as_str()),
                    Input::External => "the layer's input",
                };
                out.push((
                    s.producer,
                    KeptTensor {
                        producer: producer.to_string(),
                        part: s.part,
                        bytes: s.bytes,
                        recomputed: self.recomputed(op, s),
                        needed_by: vec![op.name.clone()],
                    },
                ));
            }
        }
        out.into_iter().map(|(_, k)| k).collect()
    }

    fn stash_bytes_where(&self, keep: impl Fn(&FwdOp, &Saved) -> bool) -> u64 {
        let mut seen: Vec<(Input, &'static str)> = Vec::new();
        let mut total = 0;
        let saves = self
            .ops
            .iter()
            .flat_map(|o| o.saves.iter().map(move |s| (o, s)));
        for (_, s) in saves.filter(|(o, s)| keep(o, s)) {
            if !seen.contains(&(s.producer, s.part)) {
                seen.push((s.producer, s.part));
                total += s.bytes;
            }
        }
        total
    }

    /// The forward graph: its operators joined by the fusion rules, or as eager PyTorch
    /// runs them ([`KernelFusion`]).
    pub fn forward(&self) -> OpGraph {
        let mut g = RawGraph::default();
        // The node that gives each operator's output (the last of its eager kernels).
        let mut output_of = Vec::with_capacity(self.ops.len());
        for op in &self.ops {
            let (core, kind) = match op.kind {
                FwdKind::Gemm { gemm, .. } => (Some(Core::Tensor), Some(OpKind::Gemm(gemm))),
                FwdKind::Vector {
                    kind,
                    elements,
                    row,
                } => (
                    Some(Core::Vector),
                    Some(OpKind::Vector {
                        kind,
                        elements,
                        row,
                    }),
                ),
                FwdKind::AllReduceForward {
                    bytes,
                    group,
                    link_bytes_per_second,
                }
                | FwdKind::AllReduceBoth {
                    bytes,
                    group,
                    link_bytes_per_second,
                    ..
                } => (
                    Some(Core::Link),
                    Some(OpKind::AllReduce {
                        bytes,
                        group,
                        link_bytes_per_second,
                    }),
                ),
                FwdKind::Attention(a) => (Some(Core::Fused), Some(OpKind::Attention(a))),
                FwdKind::CastForward(c) => (Some(Core::Vector), Some(OpKind::Cast(c))),
                FwdKind::AllReduceBackward { .. } | FwdKind::CastBackward(_) => (None, None),
            };
            let element = op.element.unwrap_or(self.element);
            let loss = is_loss(kind);
            let eager = match (self.kernels, kind) {
                _ if loss => loss_kernels(self.cross_entropy).0,
                (KernelFusion::Eager, Some(OpKind::Vector { kind, .. })) => {
                    eager_kernels(kind, element)
                }
                _ => &[],
            };
            let made = match kind {
                Some(OpKind::Vector { elements, row, .. }) if !eager.is_empty() => g.eager_chain(
                    eager.iter(),
                    (&op.name, ""),
                    (elements, row, element),
                    Direction::Forward,
                ),
                _ => vec![g.add(&op.name, core, kind, Direction::Forward, element)],
            };
            for &id in &made {
                // The loss's PyTorch operations run as they are, whatever else fuses.
                g.nodes[id].own_kernel |= loss && !eager.is_empty();
                g.nodes[id].pipelined = op.is_sequence_parallel_collective();
                g.nodes[id].checkpoint_saved = op.checkpoint_saved;
                g.nodes[id].selective = op.recompute.is_some();
            }
            let (first, last) = (made[0], made[made.len() - 1]);
            for input in &op.inputs {
                match *input {
                    Input::Op(p) => g.edge(output_of[p], first),
                    Input::External => g.nodes[first].external += 1,
                }
            }
            output_of.push(last);
        }
        g.finish(self.scaling, self.kernels)
    }

    /// The backward graph, fused or eager as the forward one.
    pub fn backward(&self) -> OpGraph {
        let n = self.ops.len();
        let mut g = RawGraph::default();
        // consumers[i] = (consumer, operand position) of operator i's output.
        let consumers = readers(&self.ops);
        // grad_of[c][pos] = the backward node that produces the gradient of operand `pos`
        // of operator c; filled in reverse topological order.
        let mut grad_of: Vec<Vec<Option<usize>>> = self
            .ops
            .iter()
            .map(|o| vec![None; o.inputs.len()])
            .collect();
        for i in (0..n).rev() {
            let op = &self.ops[i];
            let incoming: Vec<usize> = consumers[i]
                .iter()
                .filter_map(|&(c, pos)| grad_of[c][pos])
                .collect();
            // The layer's output (no consumer inside the layer) gets its gradient from the
            // next layer.
            let external = usize::from(consumers[i].is_empty());
            let element = op.element.unwrap_or(self.element);
            let (made, grads) = backward_nodes(
                &mut g,
                op,
                element,
                (self.kernels, self.recasts(), self.cross_entropy),
            );
            let grads = self.rescaled(&mut g, op, &made, grads);
            for &m in &made {
                g.nodes[m].pipelined = op.is_sequence_parallel_collective();
            }
            grad_of[i] = grads;
            for &m in &made {
                for &src in &incoming {
                    g.edge(src, m);
                }
                g.nodes[m].external += external;
            }
        }
        g.finish(self.scaling, self.kernels)
    }
}

/// The name ending of the row-wise recipe's rescaling kernels ([`LayerBuilder::rescaled`]).
const RESCALE: &str = ".rescale";

impl LayerBuilder {
    /// Whether sequence parallelism's all-gathers of a quantised GEMM's input move the
    /// quantised shard ([`Self::gather_quantised`]): Transformer Engine's do under every
    /// recipe, torchao's under its tensor-wise one (torchtitan's `Float8ColwiseParallel`
    /// and `PrepareFloat8ModuleInput`), but not under its row-wise one — torchtitan applies
    /// its float8 tensor-parallel styles only to tensor-wise scaling ("for rowwise recipes,
    /// we use regular TP and all-gather happens in high precision",
    /// `torchtitan/models/llama3/parallelize_llama.py`, June 2025), so the gather moves the
    /// 16-bit tensor and every rank casts all of it after.
    fn gathers_quantised(&self, scaling: Fp8Scaling) -> bool {
        !(self.fp8_library == Fp8Library::Torchao && scaling == Fp8Scaling::Rowwise)
    }

    /// Whether the backward pass casts each quantised GEMM's saved 16-bit input again:
    /// torchao's tensor-wise recipe does (its row-wise recipe's forward cast already
    /// writes both copies, [`Fp8Scaling::Rowwise`]); Transformer Engine saved the FP8 one.
    fn recasts(&self) -> bool {
        self.fp8_library == Fp8Library::Torchao && self.scaling != Fp8Scaling::Rowwise
    }

    /// Under the row-wise FP8 recipe, the rescaling a quantised weight GEMM's two backward
    /// products take after them; `grads` as [`backward_nodes`] made them, with the input
    /// gradient now the rescaled one. torchao runs the backward GEMMs with exact (fp32)
    /// accumulation, and its row-wise CUTLASS kernel is so slow then that it calls
    /// cuBLAS's per-tensor kernel with unit scales and multiplies the output by the
    /// operands' row and column scales afterwards (`torchao/float8/float8_ops.py`,
    /// `addmm_float8_unwrapped`, since pytorch/ao#1325): under `torch.compile` a kernel
    /// of its own per GEMM (pytorch/ao#2184), reading and writing the 16-bit output. The
    /// forward GEMM accumulates fast and scales in the kernel: nothing added.
    fn rescaled(
        &self,
        g: &mut RawGraph,
        op: &FwdOp,
        made: &[usize],
        mut grads: Vec<Option<usize>>,
    ) -> Vec<Option<usize>> {
        let FwdKind::Gemm {
            gemm,
            second: Operand::Weight,
        } = op.kind
        else {
            return grads;
        };
        if self.scaling != Fp8Scaling::Rowwise || op.element.is_none_or(|e| e == self.element) {
            return grads;
        }
        let [d_input, d_weight] = made else {
            return grads;
        };
        let rescale = |g: &mut RawGraph, of: usize, elements: u64| {
            let name = format!("{}{RESCALE}", g.nodes[of].name);
            let kind = OpKind::Vector {
                kind: VectorKind::Scale,
                elements,
                row: 1,
            };
            let node = g.add(
                &name,
                Some(Core::Vector),
                Some(kind),
                Direction::Backward,
                self.element,
            );
            g.nodes[node].own_kernel = true;
            g.edge(of, node);
            node
        };
        let input = rescale(g, *d_input, gemm.batch * gemm.m * gemm.k);
        rescale(g, *d_weight, gemm.k * gemm.n);
        for grad in &mut grads {
            if *grad == Some(*d_input) {
                *grad = Some(input);
            }
        }
        grads
    }
}

/// A loss of separate operations ([`loss_kernels`]): its own backward kernels, in the
/// order they run, added to `g` as [`backward_nodes`] gives them; `None` for any other
/// operator or a fused loss.
fn loss_backward(
    g: &mut RawGraph,
    op: &FwdOp,
    element: ElementType,
    loss: (CrossEntropy, bool),
) -> Option<(Vec<usize>, Vec<Option<usize>>)> {
    let &FwdKind::Vector {
        kind: VectorKind::CrossEntropy,
        elements,
        row,
    } = &op.kind
    else {
        return None;
    };
    let backward = loss_kernels(loss).1;
    if backward.is_empty() {
        return None;
    }
    let made = g.eager_chain(
        backward.iter(),
        (&op.name, ".grad"),
        (elements, row, element),
        Direction::Backward,
    );
    for &m in &made {
        g.nodes[m].own_kernel = true;
    }
    let last = made[made.len() - 1];
    Some((vec![made[0]], vec![Some(last); op.inputs.len()]))
}

/// The backward nodes of forward operator `op` (its data of type `element`), added to `g`:
/// the nodes made, and for each of its operands the node that produces its gradient.
fn backward_nodes(
    g: &mut RawGraph,
    op: &FwdOp,
    element: ElementType,
    (kernels, recast, loss): (KernelFusion, bool, (CrossEntropy, bool)),
) -> (Vec<usize>, Vec<Option<usize>>) {
    if let Some(made) = loss_backward(g, op, element, loss) {
        return made;
    }
    // Eager PyTorch's autograd runs each kernel's backward, the last kernel's first: a
    // chain whose first node takes the incoming gradient and whose last gives the input's.
    if let (
        KernelFusion::Eager,
        &FwdKind::Vector {
            kind,
            elements,
            row,
        },
    ) = (kernels, &op.kind)
    {
        let eager = eager_kernels(kind, element);
        if !eager.is_empty() {
            let made = g.eager_chain(
                eager.iter().rev(),
                (&op.name, ".grad"),
                (elements, row, element),
                Direction::Backward,
            );
            let last = made[made.len() - 1];
            return (vec![made[0]], vec![Some(last); op.inputs.len()]);
        }
    }
    // Every operator but a GEMM has one backward node, which gives all its operands'
    // gradients.
    let one = |g: &mut RawGraph, core: Option<Core>, kind: Option<OpKind>| {
        let node = g.add(
            &format!("{}.grad", op.name),
            core,
            kind,
            Direction::Backward,
            element,
        );
        (vec![node], vec![Some(node); op.inputs.len()])
    };
    match op.kind {
        FwdKind::Gemm { gemm, second } => {
            let dx = Gemm {
                batch: gemm.batch,
                m: gemm.m,
                n: gemm.k,
                k: gemm.n,
            };
            let d_input = g.add(
                &format!("{}.grad_input", op.name),
                Some(Core::Tensor),
                Some(OpKind::Gemm(dx)),
                Direction::Backward,
                element,
            );
            let d_second = match second {
                Operand::Weight => Gemm {
                    batch: 1,
                    m: gemm.k,
                    n: gemm.n,
                    k: gemm.batch * gemm.m,
                },
                Operand::Activation | Operand::Experts => Gemm {
                    batch: gemm.batch,
                    m: gemm.k,
                    n: gemm.n,
                    k: gemm.m,
                },
            };
            let name = match second {
                Operand::Weight | Operand::Experts => format!("{}.grad_weight", op.name),
                Operand::Activation => format!("{}.grad_input2", op.name),
            };
            let d2 = g.add(
                &name,
                Some(Core::Tensor),
                Some(OpKind::Gemm(d_second)),
                Direction::Backward,
                element,
            );
            // The first operand's gradient is the input gradient; a second operand's (an
            // activation × activation GEMM's) the other one.
            let grads = (0..op.inputs.len())
                .map(|pos| Some(if pos == 0 { d_input } else { d2 }))
                .collect();
            (vec![d_input, d2], grads)
        }
        FwdKind::Vector {
            kind,
            elements,
            row,
        } => one(
            g,
            Some(Core::Vector),
            Some(OpKind::Vector {
                kind,
                elements,
                row,
            }),
        ),
        FwdKind::Attention(a) => one(g, Some(Core::Fused), Some(OpKind::Attention(a))),
        FwdKind::CastBackward(c) => one(g, Some(Core::Vector), Some(OpKind::Cast(c))),
        // torchao casts the saved 16-bit input again for the weight gradient: the same
        // cast, in the backward pass ([`LayerBuilder::recasts`]).
        FwdKind::CastForward(c) if recast => one(g, Some(Core::Vector), Some(OpKind::Cast(c))),
        // Identities backward: contracted away.
        FwdKind::CastForward(_) | FwdKind::AllReduceForward { .. } => one(g, None, None),
        FwdKind::AllReduceBackward {
            bytes,
            group,
            link_bytes_per_second,
        }
        | FwdKind::AllReduceBoth {
            backward_bytes: bytes,
            group,
            link_bytes_per_second,
            ..
        } => one(
            g,
            Some(Core::Link),
            Some(OpKind::AllReduce {
                bytes,
                group,
                link_bytes_per_second,
            }),
        ),
    }
}

/// How much of an element-wise operator's data one of its eager kernels reads and writes.
#[derive(Debug, Clone, Copy)]
enum Share {
    /// Every element, in the kernel's type.
    All,
    /// Half of them: a reduction along the rows reads every element and writes one per
    /// row.
    Half,
    /// A cast between the 16-bit data and fp32: reads 2 bytes and writes 4 (or the
    /// reverse), 6 bytes an element, as 1.5 elements of 16-bit data read and written.
    Cast,
    /// One per row (a row's statistic: its mean plus epsilon, its reciprocal square root).
    Rows,
    /// Every element, in rows as the operator's (a row-wise kernel the plugin makes read
    /// rows too long for the chip's buffer twice: log-softmax).
    AllRows,
    /// `num / den` of the elements: a kernel whose traffic is that share of what the
    /// plugin charges an operator of every element (a backward one reads and writes each
    /// element twice: one that reads and writes it once is half).
    Of(u64, u64),
}

/// One kernel of an element-wise operator as eager PyTorch runs it: the name it adds to
/// the operator's, what it computes, on fp32 data or the layer's, and how much of it.
#[derive(Debug, Clone, Copy)]
struct EagerKernel {
    suffix: &'static str,
    kind: VectorKind,
    fp32: bool,
    share: Share,
}

impl EagerKernel {
    const fn new(suffix: &'static str, kind: VectorKind, fp32: bool, share: Share) -> Self {
        EagerKernel {
            suffix,
            kind,
            fp32,
            share,
        }
    }

    /// The kernel of an operator of `elements` in rows of `row`, on data of `element`:
    /// what it runs and on which type. A reduction keeps the operator's row (the plugin
    /// reads rows too long for the chip's buffer twice); element-wise kernels have none.
    fn op(&self, elements: u64, row: u64, element: ElementType) -> (OpKind, ElementType) {
        let (elements, row) = match self.share {
            Share::All => (elements, 1),
            Share::Half => (elements.div_ceil(2), row),
            Share::Cast => (elements + elements / 2, 1),
            Share::Rows => (elements / row.max(1), 1),
            Share::AllRows => (elements, row),
            Share::Of(num, den) => ((elements * num).div_ceil(den.max(1)), 1),
        };
        let element = if self.fp32 {
            ElementType::Fp32
        } else {
            element
        };
        (
            OpKind::Vector {
                kind: self.kind,
                elements,
                row,
            },
            element,
        )
    }
}

/// The cast of 16-bit data to fp32 (`.float()`) that eager decompositions begin with.
const TO_FP32: EagerKernel = EagerKernel::new("float", VectorKind::Scale, false, Share::Cast);

/// Whether `kind` is the loss's cross-entropy operator.
fn is_loss(kind: Option<OpKind>) -> bool {
    matches!(
        kind,
        Some(OpKind::Vector {
            kind: VectorKind::CrossEntropy,
            ..
        })
    )
}

/// The kernels of the loss over `tokens × vocabulary` logits, forward and backward, as
/// `loss` runs it (its vocabulary split over tensor-parallel ranks or whole): none for a
/// fused loss (one kernel each way, the operator itself). Each moves, in bytes a logit:
///
/// * Megatron-Core's unfused loss (`megatron/core/tensor_parallel/cross_entropy.py`):
///   forward `.float()` (2 read, 4 written), the row maxima (4), in place the subtraction
///   (4, 4) and the exponential (4, 4), the row sums (4) and the division (4, 4); backward,
///   in place, the product with the loss's gradient (4, 4), then the cast to 16 bits for
///   the output layer (4, 2) — 56 in all (the maxima and sums read long rows twice).
/// * PyTorch's `F.cross_entropy(logits.float())`: forward the cast (2, 4) and
///   log-softmax (its row read twice, 4 written); backward the loss's dense gradient (4
///   written, the targets scattered into it), log-softmax's backward (4 and 4 read, 4
///   written) and the cast back (4, 2) — 40.
/// * The same under DTensor's loss parallelism (the vocabulary split): forward the cast,
///   the row maxima, the subtraction, the exponential, the row sums and the logarithm's
///   subtraction as separate operations; backward `(zeros_like(x) + exp(x)) * grad`
///   (`torch/distributed/tensor/parallel/loss.py`) — the zeros (4 written), the
///   exponential (4, 4), the sum (8, 4), the product (4, 4) — and the cast back (4, 2) —
///   some 80.
///
/// The plugin charges an element-wise operator reading and writing each element (twice
/// backward), so a kernel's share of the logits ([`Share`]) gives its traffic.
fn loss_kernels(
    (loss, split): (CrossEntropy, bool),
) -> (&'static [EagerKernel], &'static [EagerKernel]) {
    use Share::*;
    use VectorKind as V;
    const CAST_BACK: EagerKernel = EagerKernel::new("type_as", V::Scale, false, Of(3, 4));
    const UNFUSED: [EagerKernel; 6] = [
        TO_FP32,
        EagerKernel::new("max", V::Add, true, Half),
        EagerKernel::new("sub", V::Add, true, All),
        EagerKernel::new("exp", V::Scale, true, All),
        EagerKernel::new("sum", V::Add, true, Half),
        EagerKernel::new("div", V::Mul, true, All),
    ];
    const UNFUSED_BACKWARD: [EagerKernel; 2] =
        [EagerKernel::new("mul", V::Mul, true, Of(1, 2)), CAST_BACK];
    const EAGER: [EagerKernel; 2] = [
        TO_FP32,
        EagerKernel::new("log_softmax", V::Softmax, true, AllRows),
    ];
    const EAGER_BACKWARD: [EagerKernel; 3] = [
        EagerKernel::new("nll_loss", V::Scale, true, Of(1, 4)),
        EagerKernel::new("log_softmax", V::Softmax, true, Of(3, 4)),
        CAST_BACK,
    ];
    const PARALLEL: [EagerKernel; 7] = [
        TO_FP32,
        EagerKernel::new("max", V::Add, true, Half),
        EagerKernel::new("sub", V::Add, true, All),
        EagerKernel::new("exp", V::Scale, true, All),
        EagerKernel::new("sum", V::Add, true, Half),
        EagerKernel::new("log", V::Scale, true, Rows),
        EagerKernel::new("sub_log", V::Add, true, All),
    ];
    const PARALLEL_BACKWARD: [EagerKernel; 5] = [
        EagerKernel::new("zeros", V::Scale, true, Of(1, 4)),
        EagerKernel::new("exp", V::Scale, true, Of(1, 2)),
        EagerKernel::new("add", V::Add, true, Of(3, 4)),
        EagerKernel::new("mul", V::Mul, true, Of(1, 2)),
        CAST_BACK,
    ];
    match (loss, split) {
        (CrossEntropy::Fused, _) => (&[], &[]),
        (CrossEntropy::Unfused, _) => (&UNFUSED, &UNFUSED_BACKWARD),
        (CrossEntropy::Eager, false) => (&EAGER, &EAGER_BACKWARD),
        (CrossEntropy::Eager, true) => (&PARALLEL, &PARALLEL_BACKWARD),
    }
}

/// The kernels eager PyTorch runs for a vector operator of `kind` on 16-bit data of
/// `element`, forward; backward, autograd runs each one's gradient, in reverse (the
/// plugin charges a kernel's backward twice its forward's traffic). None — the operator
/// is its own one kernel — where PyTorch has a native kernel for it (LayerNorm, GELU,
/// SiLU, softmax, dropout, additions and products) or where the data is fp32 already.
///
/// The decompositions are those of the Llama implementations that train in eager mode:
/// RMSNorm as `(x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) +
/// eps)).type_as(x) * weight` (Meta's `llama/model.py`, Hugging Face's `LlamaRMSNorm`,
/// torchtitan's `RMSNorm`, fms's `LayerNormParameterized`); the rotary embedding as
/// `view_as_complex(x.float()) * freqs_cis` cast back with `type_as` (Meta's and
/// torchtitan's `apply_rotary_emb`). The loss's kernels are `[training] cross_entropy`'s
/// ([`loss_kernels`]), not this setting's.
fn eager_kernels(kind: VectorKind, element: ElementType) -> &'static [EagerKernel] {
    use Share::*;
    use VectorKind as V;
    const RMS_NORM: [EagerKernel; 8] = [
        TO_FP32,
        EagerKernel::new("pow", V::Mul, true, All),
        EagerKernel::new("mean", V::Add, true, Half),
        EagerKernel::new("add_eps", V::Add, true, Rows),
        EagerKernel::new("rsqrt", V::Scale, true, Rows),
        EagerKernel::new("normalize", V::Mul, true, All),
        EagerKernel::new("type_as", V::Scale, false, Cast),
        EagerKernel::new("weight", V::Mul, false, All),
    ];
    const ROTARY: [EagerKernel; 3] = [
        TO_FP32,
        EagerKernel::new("complex_mul", V::Mul, true, All),
        EagerKernel::new("type_as", V::Scale, false, Cast),
    ];
    match kind {
        _ if element.bytes() != 2.0 => &[],
        V::RmsNorm => &RMS_NORM,
        V::Rotary => &ROTARY,
        _ => &[],
    }
}

/// Fusion class of an operator (the reference's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Tensor,
    Injective,
    Activation,
    Norm,
    Dropout,
    /// A quantising cast with delayed scaling (or to MXFP8): written by the kernel before
    /// it where that kernel is a norm, an activation or an element-wise operator, as
    /// Transformer Engine's normalization and activation kernels write FP8 directly
    /// (`transformer_engine/pytorch/csrc/extensions/normalization.cpp` and
    /// `activation.cpp`: `Impl::FULLY_FUSED`) — never by a GEMM, whose cuBLAS output is
    /// 16-bit, and for MXFP8 not by a norm (`Impl::UNFUSED` unless cuDNN's norm is asked
    /// for).
    Cast,
    Other,
}

fn class_of(kind: &OpKind) -> Class {
    match kind {
        // With current scaling the cast needs the whole tensor's maximum before it writes:
        // it cannot be the epilogue of the kernel that makes the tensor.
        OpKind::Cast(c) if c.amax_pass => Class::Other,
        OpKind::Cast(_) => Class::Cast,
        OpKind::Gemm(_) => Class::Tensor,
        OpKind::Vector { kind, .. } => vector_class(*kind),
        OpKind::AllReduce { .. } | OpKind::Attention(_) => Class::Other,
    }
}

/// The fusion class of a vector operator (also of one fused into a GEMM's epilogue).
fn vector_class(kind: VectorKind) -> Class {
    match kind {
        VectorKind::Add
        | VectorKind::Mul
        | VectorKind::BiasAdd
        | VectorKind::Scale
        | VectorKind::Rotary => Class::Injective,
        VectorKind::Gelu | VectorKind::Relu | VectorKind::Silu | VectorKind::Tanh => {
            Class::Activation
        }
        VectorKind::LayerNorm | VectorKind::RmsNorm => Class::Norm,
        VectorKind::Dropout => Class::Dropout,
        VectorKind::Softmax | VectorKind::CrossEntropy | VectorKind::Embedding => Class::Other,
    }
}

/// Rule A (a GEMM absorbs a following activation, injective, norm or dropout), rule B
/// (an injective operator absorbs a following injective operator or dropout) and the
/// quantising casts' (see [`Class::Cast`]): a cast fuses only under a recipe whose casts
/// do ([`Fp8Scaling::casts_fuse`]).
fn fusable(u: &OpKind, v: &OpKind, scaling: Fp8Scaling) -> bool {
    let (cu, cv) = (class_of(u), class_of(v));
    if cv == Class::Cast && !scaling.casts_fuse() {
        return false;
    }
    match cu {
        Class::Tensor => matches!(
            cv,
            Class::Activation | Class::Injective | Class::Norm | Class::Dropout
        ),
        Class::Injective => matches!(cv, Class::Injective | Class::Dropout | Class::Cast),
        Class::Activation => cv == Class::Cast,
        Class::Norm => {
            cv == Class::Cast && !matches!(v, OpKind::Cast(c) if c.to == ElementType::Mxfp8)
        }
        _ => false,
    }
}

/// Whether the kernel of `producer` takes its output's absolute maximum as it writes it, so
/// that a current-scaling cast of that output reads it once, not twice: Transformer
/// Engine's normalization and activation kernels do (`Impl::FUSED_NORM_AMAX_FP8`,
/// `Impl::FUSED_ACTIVATION_AMAX_FP8`), as do the element-wise ones it writes (the gated
/// activations, the activations' gradients with their bias gradients) — also where this
/// graph runs the activation, the gated product or their gradients in a GEMM's epilogue:
/// Transformer Engine runs them as a kernel of its own. A GEMM's cuBLAS output, a bias
/// added in its epilogue included, does not.
fn takes_amax(producer: &Op) -> bool {
    match class_of(&producer.kind) {
        // The activation, or the gated activation's product (`dswiglu` backward).
        Class::Tensor => producer
            .fused
            .iter()
            .any(|f| f.kind == VectorKind::Mul || vector_class(f.kind) == Class::Activation),
        class => matches!(class, Class::Norm | Class::Activation | Class::Injective),
    }
}

#[derive(Debug, Clone)]
struct RawNode {
    name: String,
    core: Option<Core>,
    op: Option<Op>,
    /// Operands that come from outside the layer.
    external: usize,
    alive: bool,
    /// See [`OpNode::pipelined`].
    pipelined: bool,
    /// See [`OpNode::checkpoint_saved`]: a fused node keeps its first operator's (a GEMM's
    /// epilogue is saved with it).
    checkpoint_saved: f64,
    /// See [`OpNode::selective`]: a fused node keeps its first operator's.
    selective: bool,
    /// Never its producer's epilogue (the row-wise recipe's rescaling after a cuBLAS
    /// GEMM, [`LayerBuilder::rescaled`]); it may absorb what follows it.
    own_kernel: bool,
}

/// A graph under construction; `None` ops are identities to be contracted.
#[derive(Debug, Clone, Default)]
struct RawGraph {
    nodes: Vec<RawNode>,
    succ: Vec<Vec<usize>>,
    pred: Vec<Vec<usize>>,
}

impl RawGraph {
    fn add(
        &mut self,
        name: &str,
        core: Option<Core>,
        kind: Option<OpKind>,
        direction: Direction,
        element: ElementType,
    ) -> usize {
        self.nodes.push(RawNode {
            name: name.to_string(),
            core,
            op: kind.map(|kind| Op {
                kind,
                direction,
                fused: Vec::new(),
                element,
            }),
            external: 0,
            alive: true,
            pipelined: false,
            checkpoint_saved: 0.0,
            selective: false,
            own_kernel: false,
        });
        self.succ.push(Vec::new());
        self.pred.push(Vec::new());
        self.nodes.len() - 1
    }

    /// Adds a data edge; a repeated edge is a second operand from the same producer.
    fn edge(&mut self, a: usize, b: usize) {
        self.succ[a].push(b);
        self.pred[b].push(a);
    }

    fn operands(&self, v: usize) -> usize {
        self.pred[v].len() + self.nodes[v].external
    }

    fn distinct(list: &[usize]) -> Vec<usize> {
        let mut d = list.to_vec();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// Replaces every identity node by edges from its producers to its consumers.
    fn contract_identities(&mut self) {
        for n in 0..self.nodes.len() {
            if self.nodes[n].op.is_some() || !self.nodes[n].alive {
                continue;
            }
            let preds = std::mem::take(&mut self.pred[n]);
            let succs = std::mem::take(&mut self.succ[n]);
            for &s in &succs {
                self.pred[s].retain(|&p| p != n);
                self.nodes[s].external += self.nodes[n].external;
            }
            for &p in &preds {
                self.succ[p].retain(|&x| x != n);
            }
            for &p in &preds {
                for &s in &succs {
                    self.edge(p, s);
                }
            }
            self.nodes[n].alive = false;
        }
    }

    /// Kahn's algorithm, lowest index first (deterministic).
    fn topological(&self) -> Vec<usize> {
        let alive: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].alive)
            .collect();
        let mut indeg: Vec<usize> = (0..self.nodes.len())
            .map(|i| Self::distinct(&self.pred[i]).len())
            .collect();
        let mut ready: std::collections::BTreeSet<usize> =
            alive.iter().copied().filter(|&i| indeg[i] == 0).collect();
        let mut order = Vec::with_capacity(alive.len());
        while let Some(&i) = ready.iter().next() {
            ready.remove(&i);
            order.push(i);
            for s in Self::distinct(&self.succ[i]) {
                indeg[s] -= 1;
                if indeg[s] == 0 {
                    ready.insert(s);
                }
            }
        }
        order
    }

    /// Applies the fusion rules ([`fusable`]) until nothing changes.
    fn fuse(&mut self, scaling: Fp8Scaling) {
        'restart: loop {
            for u in self.topological() {
                let succs = Self::distinct(&self.succ[u]);
                if succs.len() != 1 || self.succ[u].len() != 1 {
                    continue;
                }
                let v = succs[0];
                if self.operands(v) != 1 || self.nodes[v].own_kernel {
                    continue;
                }
                let (Some(uop), Some(vop)) = (&self.nodes[u].op, &self.nodes[v].op) else {
                    continue;
                };
                if !fusable(&uop.kind, &vop.kind, scaling) {
                    continue;
                }
                // A fused cast is charged as the element-wise scaling it does.
                let (kind, elements) = match vop.kind {
                    OpKind::Vector { kind, elements, .. } => (kind, elements),
                    OpKind::Cast(c) => (VectorKind::Scale, c.elements),
                    _ => continue,
                };
                let mut absorbed = vec![FusedOp { kind, elements }];
                absorbed.extend(vop.fused.iter().copied());
                let vname = self.nodes[v].name.clone();
                let node = &mut self.nodes[u];
                if let Some(op) = node.op.as_mut() {
                    op.fused.extend(absorbed);
                }
                // "fc1" + "fc1.bias" → "fc1+bias"; "fc2.grad_input" + "act.grad" → "fc2.grad_input+act.grad".
                let base = node.name.split(['+', '.']).next().unwrap_or("").to_string();
                let short = vname.strip_prefix(&format!("{base}.")).unwrap_or(&vname);
                node.name = format!("{}+{}", node.name, short);
                if node.core == Some(Core::Tensor) {
                    node.core = Some(Core::Fused);
                }
                // u takes over v's consumers.
                let vsucc = std::mem::take(&mut self.succ[v]);
                self.succ[u].clear();
                for s in vsucc {
                    for p in self.pred[s].iter_mut() {
                        if *p == v {
                            *p = u;
                        }
                    }
                    self.succ[u].push(s);
                }
                self.pred[v].clear();
                self.nodes[v].alive = false;
                continue 'restart;
            }
            break;
        }
    }

    /// A current-scaling cast whose one producer takes the maximum as it writes
    /// ([`takes_amax`]) reads its input once: its own pass for the maximum goes.
    fn amax_in_producers(&mut self) {
        for v in 0..self.nodes.len() {
            let Some(OpKind::Cast(c)) = self.nodes[v].op.as_ref().map(|o| o.kind) else {
                continue;
            };
            if !c.amax_pass || !self.nodes[v].alive || self.operands(v) != 1 {
                continue;
            }
            let Some(&u) = self.pred[v].first() else {
                continue;
            };
            if self.nodes[u].op.as_ref().is_some_and(takes_amax)
                && let Some(op) = self.nodes[v].op.as_mut()
            {
                op.kind = OpKind::Cast(Cast {
                    amax_pass: false,
                    ..c
                });
            }
        }
    }

    /// Adds an operator named `name` as eager PyTorch's `kernels` ([`eager_kernels`], in
    /// the order given: reversed backward), a chain of vector nodes named
    /// `name.suffix` plus `ending`, each the next one's predecessor, on the operator's
    /// `elements` in rows of `row` of `element`. Returns the nodes, first to last.
    fn eager_chain<'k>(
        &mut self,
        kernels: impl Iterator<Item = &'k EagerKernel>,
        (name, ending): (&str, &str),
        (elements, row, element): (u64, u64, ElementType),
        direction: Direction,
    ) -> Vec<usize> {
        let made: Vec<usize> = kernels
            .map(|k| {
                let (kind, element) = k.op(elements, row, element);
                let name = format!("{name}.{}{ending}", k.suffix);
                self.add(&name, Some(Core::Vector), Some(kind), direction, element)
            })
            .collect();
        for pair in made.windows(2) {
            self.edge(pair[0], pair[1]);
        }
        made
    }

    fn finish(mut self, scaling: Fp8Scaling, kernels: KernelFusion) -> OpGraph {
        self.contract_identities();
        // Eager PyTorch fuses nothing: every operator is its own kernel.
        if kernels == KernelFusion::Fused {
            self.fuse(scaling);
        }
        if scaling == Fp8Scaling::Current {
            self.amax_in_producers();
        }
        let order = self.topological();
        let mut index = vec![usize::MAX; self.nodes.len()];
        for (k, &i) in order.iter().enumerate() {
            index[i] = k;
        }
        let mut edges = Vec::new();
        for &i in &order {
            for s in Self::distinct(&self.succ[i]) {
                edges.push((index[i], index[s]));
            }
        }
        edges.sort_unstable();
        let nodes = order
            .iter()
            .filter_map(|&i| {
                let n = &self.nodes[i];
                Some(OpNode {
                    name: n.name.clone(),
                    core: n.core?,
                    op: n.op.clone()?,
                    pipelined: n.pipelined,
                    checkpoint_saved: n.checkpoint_saved,
                    selective: n.selective,
                })
            })
            .collect();
        OpGraph { nodes, edges }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(kind: VectorKind) -> FwdKind {
        FwdKind::Vector {
            kind,
            elements: 10,
            row: 1,
        }
    }
    fn gemm() -> FwdKind {
        FwdKind::Gemm {
            gemm: Gemm {
                batch: 1,
                m: 4,
                n: 8,
                k: 2,
            },
            second: Operand::Weight,
        }
    }

    #[test]
    fn gemm_bias_gelu_fuses_but_residual_add_does_not() {
        let mut b = LayerBuilder::default();
        let fc = b.push("fc", gemm(), vec![Input::External], vec![]);
        let bias = b.push("bias", vector(VectorKind::BiasAdd), vec![fc], vec![]);
        let act = b.push("gelu", vector(VectorKind::Gelu), vec![bias], vec![]);
        b.push(
            "residual",
            vector(VectorKind::Add),
            vec![act, Input::External],
            vec![],
        );
        let f = b.forward();
        assert_eq!(f.nodes.len(), 2, "{f:#?}");
        assert_eq!(f.nodes[0].core, Core::Fused);
        assert_eq!(f.nodes[0].op.fused.len(), 2);
        assert_eq!(
            f.nodes[0].op.fused[1],
            FusedOp {
                kind: VectorKind::Gelu,
                elements: 10
            }
        );
        assert_eq!(f.nodes[1].core, Core::Vector);
        assert_eq!(f.edges, vec![(0, 1)]);
    }

    #[test]
    fn backward_has_input_and_weight_gradients() {
        let mut b = LayerBuilder::default();
        let x = b.push(
            "x",
            vector(VectorKind::Softmax),
            vec![Input::External],
            vec![],
        );
        b.push("fc", gemm(), vec![x], vec![]);
        let g = b.backward();
        let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["fc.grad_input", "fc.grad_weight", "x.grad"]);
        // dX: m × k output from an m × n gradient; dW: k × n from reducing over m.
        assert_eq!(
            g.nodes[0].op.kind,
            OpKind::Gemm(Gemm {
                batch: 1,
                m: 4,
                n: 2,
                k: 8
            })
        );
        assert_eq!(
            g.nodes[1].op.kind,
            OpKind::Gemm(Gemm {
                batch: 1,
                m: 2,
                n: 8,
                k: 4
            })
        );
        assert_eq!(g.edges, vec![(0, 2)]);
        assert_eq!(g.matmul_flops(), 2.0 * b.forward().matmul_flops());

        // A norm's backward is fused into the input-gradient GEMM that feeds it (rule A).
        let mut b = LayerBuilder::default();
        let x = b.push(
            "x",
            vector(VectorKind::LayerNorm),
            vec![Input::External],
            vec![],
        );
        b.push("fc", gemm(), vec![x], vec![]);
        let names: Vec<String> = b.backward().nodes.iter().map(|n| n.name.clone()).collect();
        assert_eq!(names, ["fc.grad_input+x.grad", "fc.grad_weight"]);
    }

    #[test]
    fn conjugate_collectives_swap_between_passes() {
        let link = |_: ()| (8, 2, 1);
        let (bytes, group, bw) = link(());
        let mut b = LayerBuilder::default();
        let f = b.push(
            "f",
            FwdKind::AllReduceBackward {
                bytes,
                group,
                link_bytes_per_second: bw,
            },
            vec![Input::External],
            vec![],
        );
        let mm = b.push("mm", gemm(), vec![f], vec![]);
        b.push(
            "g",
            FwdKind::AllReduceForward {
                bytes,
                group,
                link_bytes_per_second: bw,
            },
            vec![mm],
            vec![],
        );
        let fwd = b.forward();
        assert_eq!(fwd.count(Core::Link), 1);
        assert_eq!(fwd.nodes.last().unwrap().name, "g");
        let bwd = b.backward();
        assert_eq!(bwd.count(Core::Link), 1);
        assert_eq!(bwd.nodes.last().unwrap().name, "f.grad");
    }

    /// Current scaling: a cast after a GEMM whose epilogue ran an activation reads its input
    /// once (Transformer Engine's activation kernel takes the maximum), after a GEMM whose
    /// epilogue only added a bias twice (cuBLAS writes no maximum), and the layer's first
    /// cast, of an input from outside it, twice.
    #[test]
    fn current_scaling_casts_read_once_only_after_a_kernel_that_took_the_maximum() {
        let weight = || FwdKind::Gemm {
            gemm: Gemm {
                batch: 1,
                m: 4,
                n: 8,
                k: 8,
            },
            second: Operand::Weight,
        };
        let casts = |between: VectorKind| {
            let mut b = LayerBuilder::default();
            let first = b.push("first", weight(), vec![Input::External], vec![]);
            let mid = b.push("mid", vector(between), vec![first], vec![]);
            b.push("second", weight(), vec![mid], vec![]);
            b.quantise(ElementType::Fp8, Fp8Scaling::Current, 2, |_| true);
            b.forward()
                .nodes
                .iter()
                .filter_map(|n| match n.op.kind {
                    OpKind::Cast(c) => Some((n.name.clone(), c.amax_pass)),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            casts(VectorKind::Gelu),
            [
                ("first.cast".to_string(), true),
                ("second.cast".to_string(), false)
            ]
        );
        assert_eq!(
            casts(VectorKind::BiasAdd),
            [
                ("first.cast".to_string(), true),
                ("second.cast".to_string(), true)
            ]
        );
    }

    /// A gated MLP quantised: the gate and up projections read one cast of their shared
    /// input, the down projection its own; each of the three casts its output gradient
    /// backward, before its two backward GEMMs, which run in the type too; the input each
    /// keeps for its weight gradient is kept once, quantised; the weights are counted.
    #[test]
    fn quantising_casts_each_input_once_and_each_gradient_before_its_gemms() {
        let mut b = LayerBuilder::default();
        let norm = b.push(
            "norm",
            FwdKind::Vector {
                kind: VectorKind::RmsNorm,
                elements: 8,
                row: 2,
            },
            vec![Input::External],
            vec![],
        );
        let weight = |n: u64, k: u64| FwdKind::Gemm {
            gemm: Gemm {
                batch: 1,
                m: 4,
                n,
                k,
            },
            second: Operand::Weight,
        };
        let keep = |x: Input, bytes: u64| Saved {
            producer: x,
            part: "out",
            bytes,
        };
        let gate = b.push("gate", weight(6, 2), vec![norm], vec![keep(norm, 16)]);
        let up = b.push("up", weight(6, 2), vec![norm], vec![keep(norm, 16)]);
        let act = b.push(
            "act",
            vector(VectorKind::Silu),
            vec![gate],
            vec![keep(gate, 48)],
        );
        let mul = b.push("mul", vector(VectorKind::Mul), vec![act, up], vec![]);
        b.push("down", weight(2, 6), vec![mul], vec![keep(mul, 48)]);
        let weights = b.quantise(ElementType::Fp8, Fp8Scaling::Current, 2, |_| true);
        assert_eq!(weights, 2 * 6 * 2 + 6 * 2);
        let kinds: Vec<(&str, &str)> = b
            .ops
            .iter()
            .map(|o| {
                let k = match o.kind {
                    FwdKind::CastForward(_) => "cast",
                    FwdKind::CastBackward(_) => "cast gradient",
                    FwdKind::Gemm { .. } => "gemm",
                    _ => "vector",
                };
                (o.name.as_str(), k)
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("norm", "vector"),
                ("gate.cast", "cast"),
                ("gate", "gemm"),
                ("gate.cast_gradient", "cast gradient"),
                ("up", "gemm"),
                ("up.cast_gradient", "cast gradient"),
                ("act", "vector"),
                ("mul", "vector"),
                ("down.cast", "cast"),
                ("down", "gemm"),
                ("down.cast_gradient", "cast gradient"),
            ]
        );
        // The up projection reads the gate's cast; the activation reads the gate's output
        // through its (forward-identity) gradient cast, and keeps the GEMM's own output.
        assert_eq!(b.ops[4].inputs, [Input::Op(1)]);
        assert_eq!(b.ops[6].inputs, [Input::Op(3)]);
        assert_eq!(b.ops[6].saves[0].producer, Input::Op(2));
        // Kept: the normed input once and the product, each at 1 byte per element; the
        // gate's output in bf16.
        assert_eq!(b.stash_bytes(), 8 + 24 + 48);
        let f = b.forward();
        fn fp8(g: &OpGraph) -> Vec<&str> {
            g.nodes
                .iter()
                .filter(|n| n.op.element == ElementType::Fp8)
                .map(|n| n.name.as_str())
                .collect()
        }
        assert_eq!(fp8(&f), ["gate+act", "up", "down"]);
        // Current scaling: the casts stand alone (never an epilogue), and each reads its
        // input once: the norm and the product's kernel took the maximum as they wrote it.
        assert_eq!(
            f.nodes
                .iter()
                .filter_map(|n| match n.op.kind {
                    OpKind::Cast(c) => Some((c.elements, c.amax_pass)),
                    _ => None,
                })
                .collect::<Vec<_>>(),
            [(4 * 2, false), (4 * 6, false)]
        );
        let g = b.backward();
        let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        // A node's name lists what is fused into it (`down.grad_input+mul.grad`).
        let at = |n: &str| {
            names
                .iter()
                .position(|x| x.split('+').next() == Some(n))
                .unwrap_or_else(|| panic!("{n} not in {names:?}"))
        };
        for gemm in ["gate", "up", "down"] {
            let cast = at(&format!("{gemm}.cast_gradient.grad"));
            assert!(cast < at(&format!("{gemm}.grad_input")), "{names:?}");
            assert!(cast < at(&format!("{gemm}.grad_weight")), "{names:?}");
        }
        assert_eq!(fp8(&g).len(), 6, "{names:?}");
    }

    #[test]
    fn stash_counts_shared_tensors_once() {
        let mut b = LayerBuilder::default();
        let save = |bytes| Saved {
            producer: Input::External,
            part: "x",
            bytes,
        };
        b.push("a", gemm(), vec![Input::External], vec![save(100)]);
        b.push("b", gemm(), vec![Input::External], vec![save(100)]);
        assert_eq!(b.stash_bytes(), 100);
    }
}
