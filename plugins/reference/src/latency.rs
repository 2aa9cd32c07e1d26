//! Latency and energy of operators on the tensor/vector-core template (the README, "The reference cost model").
//!
//! **Tensor cores** (§6.2). The reference searches tilings with Sunstone; we use a roofline
//! of the same template that keeps what decides its answer:
//! * compute with tile quantisation: a core's `width × depth` array holds a `width`-column,
//!   `depth`-deep tile of the stationary operand, so a GEMM is `⌈n/width⌉·⌈k/depth⌉` tiles
//!   per batch, spread over the cores; each tile streams its `m` rows;
//! * PE-buffer bandwidth (64 words/cycle per core): the array reads `min(depth, k)` input
//!   words per cycle of compute;
//! * global-buffer bandwidth (256 words/cycle, shared): inputs are re-read for every column
//!   tile, the stationary operand once, partial sums written and re-read for every
//!   reduction tile;
//! * DRAM bandwidth (128 words/cycle): every operand once if the working set fits the
//!   global buffer, otherwise square output tiles that fit it and re-read the inputs;
//!   outputs are written and read back once.
//!
//! The latency is the largest of these (cycles), plus the fused element-wise epilogue,
//! charged **per element** on the cores' `width` output lanes.
//!
//! **Vector cores** (§6.3): the reference's per-element cycle costs on `width · cores` lanes
//! (softmax and cross-entropy add their row overheads), bounded below by DRAM traffic.
//!
//! **Fused attention** (FlashAttention; archplace's, the reference has none): its products
//! as GEMMs at the compute and on-chip bounds, the score blocks kept in the global buffer,
//! causal masking skipping its share, the softmax per element on the output lanes, DRAM
//! carrying only Q, K, V, the output and its statistics.
//!
//! **All-reduce** (§6.4): ring, `2·(g−1)/g · bytes / link bandwidth`, in seconds — the
//! reference's ms/s mix-up is not reproduced: everything here is seconds.
//!
//! Every GEMM and vector operator reports its DRAM time (interface 1.1): the chip's cores
//! share the DRAM's 128 words/cycle, which the host holds a layer's schedule to.
//!
//! Energy is a first-order count (MACs and accesses at each level, 22 nm-like constants); it
//! is reported but drives no decision.

use archplace_plugin_sdk::{
    Attention, CoreConfig, CoreKind, Direction, EstimateError, FusedOp, Gemm, Op, OpCost, OpKind,
    VectorKind,
};

/// PE-buffer read bandwidth per core, words per cycle.
pub const PE_BUFFER_WORDS_PER_CYCLE: f64 = 64.0;
/// Global-buffer bandwidth (reads plus writes, shared by all cores), words per cycle.
pub const GLOBAL_BUFFER_WORDS_PER_CYCLE: f64 = 256.0;
/// DRAM bandwidth, words per cycle.
pub const DRAM_WORDS_PER_CYCLE: f64 = 128.0;
/// Bytes of one word (fp16 operands).
pub const WORD_BYTES: u64 = 2;

const MAC_JOULES: f64 = 2.2e-12;
const PE_BUFFER_JOULES_PER_WORD: f64 = 0.6e-12;
const GLOBAL_BUFFER_JOULES_PER_WORD: f64 = 5.0e-12;
const DRAM_JOULES_PER_WORD: f64 = 64.0e-12;
const LANE_OP_JOULES: f64 = 1.0e-12;

/// The terms of a tensor-core estimate, in cycles (exposed for tests and explanations).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmCycles {
    pub compute: f64,
    pub pe_buffer: f64,
    pub global_buffer: f64,
    pub dram: f64,
    pub macs: f64,
    pub pe_words: f64,
    pub glb_words: f64,
    pub dram_words: f64,
}

impl GemmCycles {
    pub fn total(&self) -> f64 {
        self.compute
            .max(self.pe_buffer)
            .max(self.global_buffer)
            .max(self.dram)
    }
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

/// Cycles of a GEMM on `core` (`core.cores` tensor cores of `width × depth`).
pub fn gemm_cycles(core: &CoreConfig, g: &Gemm) -> GemmCycles {
    let cores = core.cores.max(1) as u64;
    let (w, d) = (core.width.max(1) as u64, core.depth.max(1) as u64);
    let tiles = ceil_div(g.n, w) * ceil_div(g.k, d);
    let units = g.batch * tiles;
    // Rows of one tile run back to back on one core; when there are fewer tiles than
    // cores, the rows of a tile are split across the idle cores.
    let compute = if units >= cores {
        g.m * ceil_div(units, cores)
    } else {
        ceil_div(g.m, cores / units)
    } as f64;
    let pe_words = compute * g.k.min(d) as f64;
    let pe_buffer = pe_words / PE_BUFFER_WORDS_PER_CYCLE;

    let (a, b, c) = (
        (g.batch * g.m * g.k) as f64,
        (g.batch * g.k * g.n) as f64,
        (g.batch * g.m * g.n) as f64,
    );
    let col_tiles = ceil_div(g.n, w) as f64;
    let red_tiles = ceil_div(g.k, d) as f64;
    let glb_words = a * col_tiles + b + c * (2.0 * red_tiles - 1.0);
    let global_buffer = glb_words / GLOBAL_BUFFER_WORDS_PER_CYCLE;

    let glb_capacity_words = (core.buffer_bytes / WORD_BYTES) as f64;
    // Outputs are accumulated: written and read back once (Sunstone's sample 5 is bound by
    // exactly this, 2·B·N·M/128 cycles).
    let dram_words = if a + b + c <= glb_capacity_words {
        a + b + 2.0 * c
    } else {
        // Square output tiles T × T with their input panels in the buffer: T·k + k·T + T·T.
        let k = g.k as f64;
        let t = ((k * k + glb_capacity_words).sqrt() - k).max(1.0);
        let per_batch_a = (g.m * g.k) as f64;
        let per_batch_b = (g.k * g.n) as f64;
        g.batch as f64
            * (per_batch_a * (g.n as f64 / t).ceil() + per_batch_b * (g.m as f64 / t).ceil())
            + 2.0 * c
    };
    let dram = dram_words / DRAM_WORDS_PER_CYCLE;
    GemmCycles {
        compute,
        pe_buffer,
        global_buffer,
        dram,
        macs: g.macs() as f64,
        pe_words,
        glb_words,
        dram_words,
    }
}

/// Cycles per element of a vector operator (the reference's PE table, §6.1/§6.3).
pub fn cycles_per_element(kind: VectorKind, direction: Direction) -> f64 {
    use Direction::*;
    use VectorKind::*;
    match (kind, direction) {
        (LayerNorm | RmsNorm, _) => 1.0,
        (Add | Mul, Forward) => 1.0,
        (Add | Mul, Backward) => 2.0,
        (BiasAdd, _) => 1.0,
        (Scale, _) => 10.0,
        (Gelu | Relu, _) => 1.0,
        (Silu, Forward) => 12.0,
        (Silu, Backward) => 2.0,
        (Tanh, Forward) => 27.0,
        (Tanh, Backward) => 2.0,
        (Dropout, Forward) => 2.0,
        (Dropout, Backward) => 1.0,
        (Softmax, Forward) => 10.0,
        (Softmax, Backward) => 2.0,
        (CrossEntropy, Forward) => 15.0,
        (CrossEntropy, Backward) => 2.0,
        (Rotary, _) => 4.0,
        (Embedding, _) => 1.0,
    }
}

/// Words a vector operator moves to and from DRAM per output element. Forward: its inputs
/// and its output. Backward: the incoming gradient and what the forward saved, and the
/// gradients it writes — an add passes one gradient to both inputs (in 1, out 2), a
/// product reads both inputs (in 3, out 2), any other reads its saved tensor (in 2, out 1).
fn words_per_element(kind: VectorKind, direction: Direction) -> f64 {
    match (kind, direction) {
        (VectorKind::Add | VectorKind::Mul, Direction::Forward) => 3.0,
        (_, Direction::Forward) => 2.0,
        (VectorKind::Add, Direction::Backward) => 3.0,
        (VectorKind::Mul, Direction::Backward) => 5.0,
        (_, Direction::Backward) => 3.0,
    }
}

fn vector_cycles(
    lanes: u64,
    kind: VectorKind,
    elements: u64,
    row: u64,
    direction: Direction,
) -> f64 {
    let e = ceil_div(elements, lanes) as f64;
    let per = cycles_per_element(kind, direction);
    match (kind, direction) {
        // Row-wise max and sum: one pass over each row plus a fixed reduction latency.
        // Row-wise max and sum (§6.3): a reduction pass over the rows, several short rows
        // side by side when the lanes outnumber a row, plus a fixed reduction latency.
        (VectorKind::Softmax | VectorKind::CrossEntropy, Direction::Forward) => {
            let row = row.max(1);
            let rows = ceil_div(elements, row);
            let rows_side_by_side = (lanes / row).max(1);
            (ceil_div(rows, rows_side_by_side) * ceil_div(row, lanes)) as f64 + 10.0 + per * e
        }
        _ => per * e,
    }
}

fn fused_cycles(lanes: u64, fused: &[FusedOp], direction: Direction) -> f64 {
    fused
        .iter()
        .map(|f| cycles_per_element(f.kind, direction) * ceil_div(f.elements, lanes) as f64)
        .sum()
}

fn check_core(core: &CoreConfig, want: CoreKind, op: &Op) -> Result<(), EstimateError> {
    if core.kind != want {
        return Err(EstimateError::Unsupported(format!(
            "{:?} operator estimated on {:?} cores",
            op.kind, core.kind
        )));
    }
    if core.cores == 0 || core.width == 0 || core.depth == 0 {
        return Err(EstimateError::OutOfDomain(
            "a core configuration with zero cores or lanes".into(),
        ));
    }
    Ok(())
}

/// The products of a fused attention kernel as GEMMs (batch `b·h`): forward `QKᵀ` and
/// `PV`; backward `QKᵀ` again, `dP = dO·Vᵀ`, `dV = Pᵀ·dO`, `dQ = dS·K`, `dK = dSᵀ·Q`.
fn attention_gemms(a: &Attention, direction: Direction) -> Vec<Gemm> {
    let batch = a.batch * a.heads;
    let (s, d, dv) = (a.seq, a.head_dim, a.value_dim);
    let g = |m, n, k| Gemm { batch, m, n, k };
    match direction {
        Direction::Forward => vec![g(s, s, d), g(s, dv, s)],
        Direction::Backward => vec![g(s, s, d), g(s, s, dv), g(s, dv, s), g(s, d, s), g(s, d, s)],
    }
}

/// A fused attention kernel (FlashAttention) on `core`: its products at the template's
/// compute, PE-buffer and global-buffer bounds (the score blocks stay in the global
/// buffer), scaled by the fraction a causal mask leaves; the softmax per element on the
/// cores' output lanes, as a fused epilogue is; DRAM carries only Q, K, V, the output and
/// the log-sum-exp (their gradients too, backward).
fn attention_cost(core: &CoreConfig, a: &Attention, direction: Direction, clock_hz: f64) -> OpCost {
    let fraction = a.computed_fraction();
    let parts: Vec<GemmCycles> = attention_gemms(a, direction)
        .iter()
        .map(|g| gemm_cycles(core, g))
        .collect();
    let on_chip: f64 = parts
        .iter()
        .map(|c| c.compute.max(c.pe_buffer).max(c.global_buffer))
        .sum::<f64>()
        * fraction;
    // Log-sum-exp in fp32: two words per row, written forward, read backward.
    let dram_words = a.memory_elements(direction) + 2.0 * a.statistics() as f64;
    let dram = dram_words / DRAM_WORDS_PER_CYCLE;
    let lanes = core.cores as u64 * core.width as u64;
    let score_elements = (a.batch * a.heads * a.seq * a.seq) as f64 * fraction;
    let softmax =
        cycles_per_element(VectorKind::Softmax, direction) * score_elements / lanes.max(1) as f64;
    let cycles = on_chip.max(dram) + softmax;
    let joules = fraction
        * parts
            .iter()
            .map(|c| {
                c.macs * MAC_JOULES
                    + c.pe_words * core.cores as f64 * PE_BUFFER_JOULES_PER_WORD
                    + c.glb_words * GLOBAL_BUFFER_JOULES_PER_WORD
            })
            .sum::<f64>()
        + dram_words * DRAM_JOULES_PER_WORD
        + score_elements * LANE_OP_JOULES;
    OpCost::new(cycles / clock_hz, joules).with_memory_seconds(dram / clock_hz)
}

/// Seconds and joules of one operator on `core`.
pub fn op_cost(core: &CoreConfig, op: &Op, clock_hz: f64) -> Result<OpCost, EstimateError> {
    // The template's words are 16-bit (`WORD_BYTES`): it describes no 8-bit datapath.
    if op.element.is_quantised() || matches!(op.kind, OpKind::Cast(_)) {
        return Err(EstimateError::Unsupported(format!(
            "the reference template has no {} datapath (its words are {WORD_BYTES} bytes)",
            op.element.name()
        )));
    }
    match op.kind {
        OpKind::Cast(_) => Err(EstimateError::Unsupported(
            "the reference template has no quantising casts".into(),
        )),
        OpKind::Attention(a) => {
            check_core(core, CoreKind::Tensor, op)?;
            Ok(attention_cost(core, &a, op.direction, clock_hz))
        }
        OpKind::Gemm(g) => {
            check_core(core, CoreKind::Tensor, op)?;
            let c = gemm_cycles(core, &g);
            let lanes = core.cores as u64 * core.width as u64;
            let epilogue = fused_cycles(lanes, &op.fused, op.direction);
            let cycles = c.total() + epilogue;
            let joules = c.macs * MAC_JOULES
                + c.pe_words * core.cores as f64 * PE_BUFFER_JOULES_PER_WORD
                + c.glb_words * GLOBAL_BUFFER_JOULES_PER_WORD
                + c.dram_words * DRAM_JOULES_PER_WORD
                + op.fused.iter().map(|f| f.elements as f64).sum::<f64>() * LANE_OP_JOULES;
            Ok(OpCost::new(cycles / clock_hz, joules).with_memory_seconds(c.dram / clock_hz))
        }
        OpKind::Vector {
            kind,
            elements,
            row,
        } => {
            check_core(core, CoreKind::Vector, op)?;
            let lanes = core.cores as u64 * core.width as u64;
            let compute = vector_cycles(lanes, kind, elements, row, op.direction)
                + fused_cycles(lanes, &op.fused, op.direction);
            let words = elements as f64 * words_per_element(kind, op.direction);
            let cycles = compute.max(words / DRAM_WORDS_PER_CYCLE);
            let lane_ops = elements as f64 * cycles_per_element(kind, op.direction)
                + op.fused
                    .iter()
                    .map(|f| f.elements as f64 * cycles_per_element(f.kind, op.direction))
                    .sum::<f64>();
            let dram = words / DRAM_WORDS_PER_CYCLE;
            Ok(OpCost::new(
                cycles / clock_hz,
                lane_ops * LANE_OP_JOULES + words * DRAM_JOULES_PER_WORD,
            )
            .with_memory_seconds(dram / clock_hz))
        }
        OpKind::AllReduce {
            bytes,
            group,
            link_bytes_per_second,
        } => {
            if link_bytes_per_second == 0 {
                return Err(EstimateError::OutOfDomain(
                    "all-reduce over links of 0 B/s".into(),
                ));
            }
            let g = group.max(1) as f64;
            // The links, not the chip's memory, bound a collective: no memory time.
            Ok(OpCost::new(
                2.0 * (g - 1.0) / g * bytes as f64 / link_bytes_per_second as f64,
                0.0,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tc(cores: u32, w: u32, d: u32, mib: u64) -> CoreConfig {
        CoreConfig {
            kind: CoreKind::Tensor,
            cores,
            width: w,
            depth: d,
            buffer_bytes: mib << 20,
        }
    }

    /// The reference's six Sunstone sample runs: the roofline must be within 2× of
    /// the reference's cycles. GEMM (B, N, M, C) there is batch, rows, output columns,
    /// reduction, i.e. our (batch, m, n, k).
    #[test]
    fn within_two_x_of_sunstone_samples() {
        let samples = [
            (
                tc(1, 128, 128, 32),
                Gemm {
                    batch: 1,
                    m: 2048,
                    n: 4096,
                    k: 4096,
                },
                3_014_656.0,
            ),
            (
                tc(4, 64, 64, 32),
                Gemm {
                    batch: 1,
                    m: 2048,
                    n: 4096,
                    k: 4096,
                },
                6_160_384.0,
            ),
            (
                tc(1, 32, 32, 8),
                Gemm {
                    batch: 1,
                    m: 512,
                    n: 1024,
                    k: 1024,
                },
                524_288.0,
            ),
            (
                tc(16, 16, 16, 8),
                Gemm {
                    batch: 1,
                    m: 512,
                    n: 1024,
                    k: 1024,
                },
                385_024.0,
            ),
            (
                tc(1, 128, 128, 32),
                Gemm {
                    batch: 48,
                    m: 512,
                    n: 512,
                    k: 64,
                },
                196_608.0,
            ),
            (
                tc(1, 8, 8, 2),
                Gemm {
                    batch: 1,
                    m: 7,
                    n: 1024,
                    k: 1024,
                },
                114_688.0,
            ),
        ];
        let mut worst: f64 = 1.0;
        for (core, g, reference) in samples {
            let ours = gemm_cycles(&core, &g).total();
            let ratio = if ours > reference {
                ours / reference
            } else {
                reference / ours
            };
            eprintln!(
                "{core:?} {g:?}: ours {ours:.0} cycles, reference {reference:.0}, ratio {ratio:.3}"
            );
            assert!(
                ratio <= 2.0,
                "{g:?} on {core:?}: {ours} vs {reference} cycles ({ratio:.2}×)"
            );
            worst = worst.max(ratio);
        }
        eprintln!("worst ratio to the reference over the six samples: {worst:.3}×");
    }

    #[test]
    fn vector_ops_follow_the_reference_table() {
        // At one lane, LN over 33,600 elements costs 33,600 cycles (§6.3).
        let vc = CoreConfig {
            kind: CoreKind::Vector,
            cores: 1,
            width: 1,
            depth: 1,
            buffer_bytes: 2 << 20,
        };
        let op = Op {
            kind: OpKind::Vector {
                kind: VectorKind::LayerNorm,
                elements: 33_600,
                row: 1600,
            },
            direction: Direction::Forward,
            fused: vec![],
            element: archplace_plugin_sdk::ElementType::Bf16,
        };
        let c = op_cost(&vc, &op, 1.0).unwrap();
        assert_eq!(c.seconds, 33_600.0);
        let tanh = Op {
            kind: OpKind::Vector {
                kind: VectorKind::Tanh,
                elements: 134_400,
                row: 1,
            },
            direction: Direction::Forward,
            fused: vec![],
            element: archplace_plugin_sdk::ElementType::Bf16,
        };
        assert_eq!(op_cost(&vc, &tanh, 1.0).unwrap().seconds, 3_628_800.0);
    }

    #[test]
    fn all_reduce_is_a_ring_in_seconds() {
        let core = tc(1, 2, 2, 2);
        let op = Op {
            kind: OpKind::AllReduce {
                bytes: 1 << 30,
                group: 8,
                link_bytes_per_second: 4 << 30,
            },
            direction: Direction::Forward,
            fused: vec![],
            element: archplace_plugin_sdk::ElementType::Bf16,
        };
        let c = op_cost(&core, &op, 1.05e9).unwrap();
        assert!((c.seconds - 2.0 * 7.0 / 8.0 / 4.0).abs() < 1e-12);
    }

    #[test]
    fn fused_work_is_charged_per_element() {
        let core = tc(1, 16, 16, 8);
        let g = Gemm {
            batch: 1,
            m: 64,
            n: 64,
            k: 64,
        };
        let plain = Op {
            kind: OpKind::Gemm(g),
            direction: Direction::Forward,
            fused: vec![],
            element: archplace_plugin_sdk::ElementType::Bf16,
        };
        let small = Op {
            fused: vec![FusedOp {
                kind: VectorKind::Gelu,
                elements: 4096,
            }],
            ..plain.clone()
        };
        let big = Op {
            fused: vec![FusedOp {
                kind: VectorKind::Gelu,
                elements: 8192,
            }],
            ..plain.clone()
        };
        let (p, s, b) = (
            op_cost(&core, &plain, 1.0).unwrap().seconds,
            op_cost(&core, &small, 1.0).unwrap().seconds,
            op_cost(&core, &big, 1.0).unwrap().seconds,
        );
        assert!(p < s && s < b);
        assert_eq!(b - p, 2.0 * (s - p));
    }

    #[test]
    fn wrong_core_kind_is_a_fault() {
        let vc = CoreConfig {
            kind: CoreKind::Vector,
            cores: 1,
            width: 8,
            depth: 1,
            buffer_bytes: 2 << 20,
        };
        let op = Op {
            kind: OpKind::Gemm(Gemm {
                batch: 1,
                m: 1,
                n: 1,
                k: 1,
            }),
            direction: Direction::Forward,
            fused: vec![],
            element: archplace_plugin_sdk::ElementType::Bf16,
        };
        assert!(matches!(
            op_cost(&vc, &op, 1.0),
            Err(EstimateError::Unsupported(_))
        ));
    }
}
