//! Pipeline schedules: the order in which each pipeline device runs its micro-batches'
//! forward and backward passes, and what follows from it — how the model's blocks are laid
//! out over the devices' chunks, the activations a device holds, the bubble, and the
//! timeline of one step.
//!
//! Adding a schedule is one variant of [`PipelineSchedule`] with its facts below (chunks,
//! layout, requirements, activations in flight, how its devices pick their next pass) and
//! its report line; the step model, the spec's keys and the timeline read them from here
//! (ARCHITECTURE.md, "Adding a pipeline schedule").
//!
//! The schedules, each as its paper or framework defines it:
//! * `1f1b` — PipeDream-Flush / Megatron-LM's one-forward-one-backward (Narayanan et al.
//!   2021): device `k` runs `p − k − 1` warm-up forwards, then alternates; bubble
//!   `(p − 1)(F + B)`, device `k` holding `p − k` micro-batches' activations.
//! * `interleaved` — Megatron-LM's interleaved 1F1B with `v` chunks per device, device `k`
//!   holding model stages `k, k + p, …` (Narayanan et al. 2021, §2.2.2): bubble
//!   `(p − 1)(F + B)/v`; the first device holds `p (1 + (p − 1)/(p v))` micro-batches'
//!   activations (Korthikanti et al. 2022, §4.2.3). Uneven stages are split into chunks as
//!   evenly as possible (Megatron-Core's `--decoder-first/last-pipeline-num-layers` and its
//!   pipeline layouts).
//! * `zero-bubble` — ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1):
//!   the backward pass split into the input gradient `B` and the weight gradient `W`, the
//!   `W`s deferred into the bubble, at 1F1B's activation memory: bubble
//!   `(p − 1)(F + B − W)`.
//! * `zbv` — ZB-V (Qi et al. 2024, §6; "Pipeline Parallelism with Controllable Memory",
//!   NeurIPS 2024): two chunks per device in a V (device `k` holds model stages `k` and
//!   `2p − 1 − k`), the split backward, 1F1B's peak activation memory on every device.
//! * `dualpipe` — DeepSeek-V3's DualPipe (DeepSeek-AI 2024, §3.2.1, and its open-source
//!   schedule): micro-batches fed from both ends, device `k` holding stage `k` of one
//!   direction and stage `p − 1 − k` of the other (two copies of the parameters), a
//!   forward and a backward chunk of different micro-batches overlapped so that each hides
//!   the other's all-to-all and point-to-point transfers: bubble
//!   `(p/2 − 1)(F&B + B − 3W)`, `p + 1` micro-batches' activations.
//! * `dualpipev` — DualPipeV ("cut-in-half", Sea AI Lab 2025, in DeepSeek's DualPipe
//!   repository): DualPipe's order on a V of `2p` stages over `p` devices, one copy of the
//!   parameters: bubble `(2p/2 − 1)(F&B + B − 3W)` in chunk times, `2p + 1` chunks'
//!   activations.
//!
//! The timing is a simulation ([`simulate`]): each device runs its passes in the
//! schedule's order (or, for the zero-bubble schedules, picks the next ready pass by their
//! rule), each pass starting when the device is free and its inputs are done. Every
//! device's pass of a kind takes the same time (the slowest device's: the pipeline runs at
//! its pace, as the closed forms assume); the tests hold the simulation to each paper's
//! formula.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a pipeline runs its micro-batches (see the module documentation).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum PipelineSchedule {
    /// One forward, one backward (Megatron-LM, PipeDream-Flush).
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// Interleaved 1F1B, `interleaving` chunks per device.
    #[serde(rename = "interleaved")]
    Interleaved,
    /// ZB-H1: the backward split into input and weight gradients, 1F1B's memory.
    #[serde(rename = "zero-bubble")]
    ZeroBubble,
    /// ZB-V: two chunks per device in a V, the backward split.
    #[serde(rename = "zbv")]
    Zbv,
    /// DeepSeek's DualPipe: bidirectional, forward and backward chunks overlapped.
    #[serde(rename = "dualpipe")]
    DualPipe,
    /// DualPipeV: DualPipe cut in half, on a V.
    #[serde(rename = "dualpipev")]
    DualPipeV,
}

/// Why a schedule cannot run a plan, with the numbers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
pub enum ScheduleError {
    #[error(
        "pipeline_schedule = \"{schedule}\" runs {chunks} model chunk(s) per device; interleaving = {interleaving} needs pipeline_schedule = \"interleaved\""
    )]
    Chunks {
        schedule: &'static str,
        chunks: u64,
        interleaving: u64,
    },
    #[error(
        "pipeline_schedule = \"interleaved\" needs at least 2 model chunks per device (interleaving = {interleaving})"
    )]
    InterleavedChunks { interleaving: u64 },
    #[error(
        "pipeline_schedule = \"{schedule}\" needs an even number of pipeline stages, at least 2 (pipeline_parallel = {pipeline})"
    )]
    EvenStages {
        schedule: &'static str,
        pipeline: u64,
    },
    #[error(
        "pipeline_schedule = \"{schedule}\" needs at least {needed} micro-batches per replica{even} ({micro_batches} with pipeline_parallel = {pipeline})"
    )]
    MicroBatches {
        schedule: &'static str,
        micro_batches: u64,
        needed: u64,
        even: &'static str,
        pipeline: u64,
    },
}

impl PipelineSchedule {
    /// Every schedule, in the order the documentation lists them.
    pub const ALL: [PipelineSchedule; 6] = [
        PipelineSchedule::OneFOneB,
        PipelineSchedule::Interleaved,
        PipelineSchedule::ZeroBubble,
        PipelineSchedule::Zbv,
        PipelineSchedule::DualPipe,
        PipelineSchedule::DualPipeV,
    ];

    /// The spec's name.
    pub fn name(self) -> &'static str {
        match self {
            PipelineSchedule::OneFOneB => "1f1b",
            PipelineSchedule::Interleaved => "interleaved",
            PipelineSchedule::ZeroBubble => "zero-bubble",
            PipelineSchedule::Zbv => "zbv",
            PipelineSchedule::DualPipe => "dualpipe",
            PipelineSchedule::DualPipeV => "dualpipev",
        }
    }

    /// The schedule by its spec name.
    pub fn from_name(name: &str) -> Option<PipelineSchedule> {
        PipelineSchedule::ALL.into_iter().find(|s| s.name() == name)
    }

    /// What a report says of the schedule (its source).
    pub fn describe(self) -> &'static str {
        match self {
            PipelineSchedule::OneFOneB => "1F1B",
            PipelineSchedule::Interleaved => "interleaved 1F1B",
            PipelineSchedule::ZeroBubble => "zero-bubble ZB-H1 (Qi et al. 2024)",
            PipelineSchedule::Zbv => "zero-bubble ZB-V (Qi et al. 2024)",
            PipelineSchedule::DualPipe => "DualPipe (DeepSeek-V3)",
            PipelineSchedule::DualPipeV => "DualPipeV (cut-in-half DualPipe)",
        }
    }

    /// Whether this is the default schedule (plain 1F1B), which plans leave unsaid.
    pub fn is_default(&self) -> bool {
        *self == PipelineSchedule::OneFOneB
    }

    /// The schedule a plan without one runs: interleaved with more than one chunk per
    /// device, else 1F1B (as before schedules had a name).
    pub fn implied(interleaving: u64) -> PipelineSchedule {
        if interleaving > 1 {
            PipelineSchedule::Interleaved
        } else {
            PipelineSchedule::OneFOneB
        }
    }

    /// Model chunks per device: `interleaving` for the interleaved schedule, 2 for the
    /// V-shaped ones and DualPipe (one stage of each direction), else 1.
    pub fn chunks(self, interleaving: u64) -> u64 {
        match self {
            PipelineSchedule::Interleaved => interleaving.max(1),
            PipelineSchedule::Zbv | PipelineSchedule::DualPipe | PipelineSchedule::DualPipeV => 2,
            PipelineSchedule::OneFOneB | PipelineSchedule::ZeroBubble => 1,
        }
    }

    /// Chunks of a device each micro-batch passes through: all of them, but for DualPipe,
    /// whose micro-batches each run in one direction and so visit one of a device's two
    /// stages.
    pub fn chunks_visited(self, interleaving: u64) -> u64 {
        match self {
            PipelineSchedule::DualPipe => 1,
            _ => self.chunks(interleaving),
        }
    }

    /// The share of a device's chunks each micro-batch passes through
    /// ([`chunks_visited`](Self::chunks_visited) of [`chunks`](Self::chunks)): what a
    /// device runs per micro-batch of the blocks it holds (1, but ½ for DualPipe).
    pub fn visited_share(self, interleaving: u64) -> f64 {
        self.chunks_visited(interleaving) as f64 / self.chunks(interleaving).max(1) as f64
    }

    /// Whether the weight gradient runs as a pass of its own (the zero-bubble family and
    /// DualPipe, which defer some weight gradients into the bubble).
    pub fn splits_backward(self) -> bool {
        matches!(
            self,
            PipelineSchedule::ZeroBubble
                | PipelineSchedule::Zbv
                | PipelineSchedule::DualPipe
                | PipelineSchedule::DualPipeV
        )
    }

    /// Whether a forward and a backward chunk run overlapped, hiding each other's
    /// all-to-all and point-to-point transfers (DualPipe and DualPipeV).
    pub fn overlaps_chunks(self) -> bool {
        matches!(
            self,
            PipelineSchedule::DualPipe | PipelineSchedule::DualPipeV
        )
    }

    /// Model stages of a pipeline of `p` devices: `p · chunks`, but DualPipe's `p` stages
    /// (each held twice, once per direction).
    pub fn model_stages(self, p: u64, interleaving: u64) -> u64 {
        match self {
            PipelineSchedule::DualPipe => p,
            _ => p * self.chunks(interleaving),
        }
    }

    /// The model stage of device `k`'s chunk `j` (of `p` devices).
    pub fn stage_of(self, k: u64, j: u64, p: u64) -> u64 {
        match self {
            PipelineSchedule::OneFOneB | PipelineSchedule::ZeroBubble => k,
            PipelineSchedule::Interleaved => j * p + k,
            PipelineSchedule::Zbv | PipelineSchedule::DualPipeV => {
                if j == 0 {
                    k
                } else {
                    2 * p - 1 - k
                }
            }
            PipelineSchedule::DualPipe => {
                if j == 0 {
                    k
                } else {
                    p - 1 - k
                }
            }
        }
    }

    /// Every rule the schedule sets on a plan of `p` devices, `interleaving` chunks and `m`
    /// micro-batches per replica.
    pub fn problems(self, p: u64, interleaving: u64, m: u64) -> Vec<ScheduleError> {
        let mut found = Vec::new();
        let name = self.name();
        match self {
            PipelineSchedule::Interleaved if interleaving < 2 => {
                found.push(ScheduleError::InterleavedChunks { interleaving });
            }
            PipelineSchedule::Interleaved => {}
            // The V-shaped schedules have two chunks by construction; 2 may be said.
            PipelineSchedule::Zbv | PipelineSchedule::DualPipeV if interleaving > 2 => {
                found.push(ScheduleError::Chunks {
                    schedule: name,
                    chunks: 2,
                    interleaving,
                });
            }
            PipelineSchedule::Zbv | PipelineSchedule::DualPipeV => {}
            _ if interleaving > 1 => found.push(ScheduleError::Chunks {
                schedule: name,
                chunks: self.chunks(1),
                interleaving,
            }),
            _ => {}
        }
        if self == PipelineSchedule::DualPipe && (p < 2 || !p.is_multiple_of(2)) {
            found.push(ScheduleError::EvenStages {
                schedule: name,
                pipeline: p,
            });
        }
        // DualPipe's and DualPipeV's orders need 2p micro-batches (DeepSeek's
        // implementation asserts it); DualPipe's split evenly over the two directions.
        if self.overlaps_chunks() {
            let even = self == PipelineSchedule::DualPipe;
            if m < 2 * p || (even && !m.is_multiple_of(2)) {
                found.push(ScheduleError::MicroBatches {
                    schedule: name,
                    micro_batches: m,
                    needed: 2 * p,
                    even: if even { ", an even number" } else { "" },
                    pipeline: p,
                });
            }
        }
        found
    }

    /// The least the bubble can be, in units of the slowest device's time per micro-batch,
    /// whatever the chip: 1F1B's `p − 1` and the interleaved `(p − 1)/v` (their bubble is
    /// exactly that, with every transfer exposed); 0 for the others, whose bubble depends
    /// on how a pass splits into forward, input and weight gradient (what a proven
    /// search's bound may assume, `search::bound`).
    pub fn bubble_floor(self, p: u64, interleaving: u64) -> f64 {
        match self {
            PipelineSchedule::OneFOneB => p.saturating_sub(1) as f64,
            PipelineSchedule::Interleaved => {
                p.saturating_sub(1) as f64 / interleaving.max(1) as f64
            }
            _ => 0.0,
        }
    }

    /// The bubble in micro-batch slots per pipeline stage beyond the first (loads of the
    /// slowest stage), for passes of these times per micro-batch of a device: what the
    /// placement program charges a pipeline of `s` stages, `m + (s − 1)·b`, when it
    /// proposes stage boundaries for this schedule. 1 for 1F1B, `1/v` interleaved
    /// (exactly); for the others the simulation's bubble on 8 stages and 32 micro-batches
    /// over its 7 stages beyond the first (their bubble grows with the stages as 1F1B's
    /// does: the papers' `(p − 1)(…)` and `(PP/2 − 1)(…)`).
    pub fn bubble_per_stage(self, interleaving: u64, per_micro_batch: Slots) -> f64 {
        match self {
            PipelineSchedule::OneFOneB => return 1.0,
            PipelineSchedule::Interleaved => return 1.0 / interleaving.max(1) as f64,
            _ => {}
        }
        let Slots {
            forward,
            backward_input,
            weight,
            overlapped,
        } = per_micro_batch;
        let whole = forward + backward_input + weight;
        if whole <= 0.0 || !whole.is_finite() {
            return 1.0;
        }
        let steady = if self.overlaps_chunks() {
            overlapped.min(whole)
        } else {
            whole
        };
        let chunks = self.chunks_visited(interleaving) as f64;
        let slots = Slots {
            forward: forward / chunks,
            backward_input: backward_input / chunks,
            weight: weight / chunks,
            overlapped: steady / chunks,
        };
        let (p, m) = (8, 32);
        let makespan = simulated_makespan(self, p, interleaving, m, slots);
        ((makespan - m as f64 * steady) / ((p - 1) as f64 * steady)).clamp(0.0, 1.0)
    }

    /// Micro-batches whose activations device `k` of `p` holds at its peak, in units of
    /// one micro-batch's activations of the device's chunks (for DualPipe, of one of its
    /// two stages: their mean), with `v` chunks and `m` micro-batches per replica — as each
    /// schedule's source states it (the tests hold the simulation under it).
    pub fn in_flight(self, k: u64, p: u64, v: u64, m: u64) -> f64 {
        let one_f_one_b = (p - k.min(p)).min(m) as f64;
        match self {
            PipelineSchedule::OneFOneB | PipelineSchedule::ZeroBubble => one_f_one_b,
            PipelineSchedule::Interleaved if k == 0 && v > 1 => {
                one_f_one_b * (1.0 + (p - 1) as f64 / (p * v) as f64)
            }
            PipelineSchedule::Interleaved => one_f_one_b,
            // ZB-V: 1F1B's peak, p micro-batches of a device's layers, on every device.
            PipelineSchedule::Zbv => p.min(m) as f64,
            // DualPipe: PP + 1 stage-sized activations.
            PipelineSchedule::DualPipe => (p + 1) as f64,
            // DualPipeV: 2p + 1 chunks, each half of a device's layers.
            PipelineSchedule::DualPipeV => (2 * p + 1) as f64 / 2.0,
        }
    }
}

/// A model stage's blocks: the first one's index in the model and how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelStage {
    pub first_block: u64,
    pub blocks: u64,
}

/// How a schedule lays a model's blocks over the devices: the model stages in the model's
/// order (the embedding before the first, the head after the last) and each device's
/// chunks as indices into them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub stages: Vec<ModelStage>,
    pub devices: Vec<Vec<usize>>,
}

/// `n` blocks split into `parts` chunks as evenly as possible, the larger ones first.
pub fn split_evenly(n: u64, parts: u64) -> Vec<u64> {
    let parts = parts.max(1);
    (0..parts)
        .map(|j| n / parts + u64::from(j < n % parts))
        .collect()
}

impl Layout {
    /// The layout of `per_device` blocks (device `k` holding `per_device[k]`, over its
    /// chunks as evenly as possible) under `schedule` with `interleaving` chunks.
    pub fn of(schedule: PipelineSchedule, interleaving: u64, per_device: &[u64]) -> Layout {
        let p = per_device.len() as u64;
        let chunks = schedule.chunks(interleaving);
        let count = schedule.model_stages(p, interleaving) as usize;
        let mut sizes = vec![0u64; count];
        let mut devices = vec![Vec::with_capacity(chunks as usize); p as usize];
        for (k, &n) in per_device.iter().enumerate() {
            let parts = if schedule == PipelineSchedule::DualPipe {
                // Each direction's stage k holds device k's blocks.
                vec![n]
            } else {
                split_evenly(n, chunks)
            };
            for j in 0..chunks {
                let s = schedule.stage_of(k as u64, j, p) as usize;
                if let Some(&size) = parts.get(j as usize) {
                    sizes[s] = size;
                }
                devices[k].push(s);
            }
        }
        let mut first = 0;
        let stages = sizes
            .into_iter()
            .map(|blocks| {
                let s = ModelStage {
                    first_block: first,
                    blocks,
                };
                first += blocks;
                s
            })
            .collect();
        Layout { stages, devices }
    }
}

/// One micro-batch's pass through one chunk, the timeline's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    Forward,
    /// The whole backward pass (input and weight gradients).
    Backward,
    /// The input gradient only; its weight gradient follows as a pass of its own.
    BackwardInput,
    WeightGradient,
    /// A forward and a whole backward chunk of two micro-batches, overlapped.
    ForwardBackward,
}

/// The time of each pass of one chunk and micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Slots {
    pub forward: f64,
    /// The input gradient (with recomputation); the whole backward is this plus `weight`.
    pub backward_input: f64,
    pub weight: f64,
    /// A forward and a whole backward chunk overlapped (DualPipe's `F&B`).
    pub overlapped: f64,
}

/// One pass as the simulation placed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placed {
    pub device: u32,
    pub pass: Pass,
    /// The micro-batch (DualPipe's second direction numbered after the first's).
    pub micro_batch: u32,
    /// The model stage it runs.
    pub stage: u32,
    /// With [`Pass::ForwardBackward`], the backward's micro-batch and stage.
    pub paired: Option<(u32, u32)>,
    pub start: f64,
    pub end: f64,
}

/// A simulated pipeline: every pass placed, when the last ends, and each device's peak of
/// chunks' activations held.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulated {
    pub makespan: f64,
    pub passes: Vec<Placed>,
    pub peak_chunks_in_flight: Vec<u32>,
}

/// A micro-batch's pass point: direction (DualPipe's second feeds from the last device),
/// stage within the direction, micro-batch within the direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unit {
    dir: usize,
    stage: usize,
    mb: usize,
}

/// What a device runs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    F(Unit),
    /// A backward; `true`: the input gradient only, its weight gradient queued.
    B(Unit, bool),
    /// The oldest queued weight gradient.
    W,
    Fb(Unit, Unit),
}

/// Simulates `m` micro-batches per replica through `p` devices with `interleaving` chunks
/// under `schedule`, each pass taking `slots`. The caller checks
/// [`PipelineSchedule::problems`] first; a plan that breaks them is simulated as far as it
/// goes (its makespan is then meaningless).
pub fn simulate(
    schedule: PipelineSchedule,
    p: u64,
    interleaving: u64,
    m: u64,
    slots: Slots,
) -> Simulated {
    let sim = Sim::new(
        schedule,
        p as usize,
        interleaving as usize,
        m as usize,
        slots,
    );
    sim.run()
}

/// [`simulate`]'s makespan alone: the step model's need, without keeping every pass (a
/// pipeline of thousands of micro-batches places hundreds of thousands).
pub fn simulated_makespan(
    schedule: PipelineSchedule,
    p: u64,
    interleaving: u64,
    m: u64,
    slots: Slots,
) -> f64 {
    let mut sim = Sim::new(
        schedule,
        p as usize,
        interleaving as usize,
        m as usize,
        slots,
    );
    sim.record = false;
    sim.run().makespan
}

/// The simulation's state.
struct Sim {
    schedule: PipelineSchedule,
    p: usize,
    chunks: usize,
    /// Micro-batches per direction.
    per_dir: usize,
    /// Stages per direction.
    stages: usize,
    slots: Slots,
    /// End times, by direction, stage and micro-batch (NaN: not run yet).
    forward_end: Vec<Vec<Vec<f64>>>,
    backward_end: Vec<Vec<Vec<f64>>>,
    /// Per device: its order (static schedules) and how far it got.
    orders: Vec<Vec<Action>>,
    next: Vec<usize>,
    free_at: Vec<f64>,
    /// Per device: weight gradients queued (their units), chunks' activations held, peak.
    queued: Vec<std::collections::VecDeque<Unit>>,
    held: Vec<u32>,
    peak: Vec<u32>,
    /// Greedy schedules: per device and chunk, the next micro-batch to run forward and
    /// backward.
    next_f: Vec<Vec<usize>>,
    next_b: Vec<Vec<usize>>,
    passes: Vec<Placed>,
    /// Whether `passes` keeps every pass (else only `makespan` is kept).
    record: bool,
    makespan: f64,
}

impl Sim {
    fn new(schedule: PipelineSchedule, p: usize, v: usize, m: usize, slots: Slots) -> Sim {
        let chunks = schedule.chunks(v as u64) as usize;
        let (dirs, per_dir, stages) = match schedule {
            PipelineSchedule::DualPipe => (2, m / 2, p),
            _ => (1, m, p * chunks),
        };
        let ends = vec![vec![vec![f64::NAN; per_dir]; stages]; dirs];
        let mut sim = Sim {
            schedule,
            p,
            chunks,
            per_dir,
            stages,
            slots,
            forward_end: ends.clone(),
            backward_end: ends,
            orders: vec![Vec::new(); p],
            next: vec![0; p],
            free_at: vec![0.0; p],
            queued: vec![Default::default(); p],
            held: vec![0; p],
            peak: vec![0; p],
            next_f: vec![vec![0; chunks]; p],
            next_b: vec![vec![0; chunks]; p],
            passes: Vec::new(),
            record: true,
            makespan: 0.0,
        };
        for k in 0..p {
            sim.orders[k] = match schedule {
                PipelineSchedule::OneFOneB => one_f_one_b(k, p, m),
                PipelineSchedule::Interleaved => interleaved(k, p, chunks, m),
                PipelineSchedule::DualPipe => dual_pipe(k, p, per_dir),
                PipelineSchedule::DualPipeV => dual_pipe_v(k, p, m),
                PipelineSchedule::ZeroBubble | PipelineSchedule::Zbv => Vec::new(),
            };
        }
        sim
    }

    /// When `action`'s inputs are ready (infinity: an input has not been placed yet).
    fn ready(&self, action: Action) -> f64 {
        let f_ready = |u: Unit| {
            if u.stage == 0 {
                0.0
            } else {
                nan_inf(self.forward_end[u.dir][u.stage - 1][u.mb])
            }
        };
        let b_ready = |u: Unit| {
            let own = nan_inf(self.forward_end[u.dir][u.stage][u.mb]);
            if u.stage + 1 == self.stages {
                own
            } else {
                own.max(nan_inf(self.backward_end[u.dir][u.stage + 1][u.mb]))
            }
        };
        match action {
            Action::F(u) => f_ready(u),
            Action::B(u, _) => b_ready(u),
            Action::W => 0.0,
            Action::Fb(f, b) => f_ready(f).max(b_ready(b)),
        }
    }

    /// What greedy device `k` could run next: per chunk, its next input gradient and, while
    /// the activations held leave room, its next forward.
    fn greedy_candidates(&self, k: usize) -> impl Iterator<Item = Action> + '_ {
        (0..self.chunks).flat_map(move |j| {
            let stage = self.schedule.stage_of(k as u64, j as u64, self.p as u64) as usize;
            let unit = |mb| Unit { dir: 0, stage, mb };
            let (b, f) = (self.next_b[k][j], self.next_f[k][j]);
            let backward = (b < self.per_dir).then(|| Action::B(unit(b), true));
            let room = self.held[k] + self.reserve(j) <= self.cap(k);
            let forward = (f < self.per_dir && room).then(|| Action::F(unit(f)));
            backward.into_iter().chain(forward)
        })
    }

    /// The greedy choice of device `k` at time `t` (zero-bubble schedules): a ready input
    /// gradient first (the deepest stage), then a forward while the activations held stay
    /// under the schedule's memory (the oldest micro-batch, then the deepest stage), then a
    /// queued weight gradient. At equal pass times this reaches ZB-H1's published bubble
    /// (the tests); with unequal ones it stays below 1F1B's but may exceed the handcrafted
    /// ZB-H1's `(p − 1)(F + B − W)`.
    /// `None` when nothing is ready by `t`.
    fn greedy_choice(&self, k: usize, t: f64) -> Option<Action> {
        let mut best_b: Option<Unit> = None;
        let mut best_f: Option<Unit> = None;
        for a in self.greedy_candidates(k).filter(|&a| self.ready(a) <= t) {
            match a {
                Action::B(u, _) if best_b.is_none_or(|x| x.stage < u.stage) => best_b = Some(u),
                Action::F(u)
                    if best_f.is_none_or(|x| {
                        (u.mb, std::cmp::Reverse(u.stage)) < (x.mb, std::cmp::Reverse(x.stage))
                    }) =>
                {
                    best_f = Some(u)
                }
                _ => {}
            }
        }
        if let Some(u) = best_b {
            return Some(Action::B(u, true));
        }
        if let Some(u) = best_f {
            return Some(Action::F(u));
        }
        (!self.queued[k].is_empty()).then_some(Action::W)
    }

    /// The earliest time a greedy device could start anything (infinity: nothing is
    /// placeable yet).
    fn greedy_time(&self, k: usize) -> f64 {
        if !self.queued[k].is_empty() {
            return self.free_at[k];
        }
        self.greedy_candidates(k)
            .map(|a| self.ready(a))
            .fold(f64::INFINITY, f64::min)
            .max(self.free_at[k])
    }

    /// The chunks' activations a greedy device may hold: 1F1B's (`p − k` micro-batches)
    /// for ZB-H1; `p` micro-batches of the device's layers, `2p` half-sized chunks, for
    /// ZB-V.
    fn cap(&self, k: usize) -> u32 {
        match self.schedule {
            PipelineSchedule::ZeroBubble => (self.p - k) as u32,
            _ => 2 * self.p as u32,
        }
    }

    /// The activations a forward on chunk `j` commits the device to: in a V, a micro-batch
    /// entering the first chunk comes back through the second, so it reserves both (a
    /// device that filled its memory with first-chunk forwards could run nothing).
    fn reserve(&self, j: usize) -> u32 {
        (self.chunks - j) as u32
    }

    fn is_greedy(&self) -> bool {
        matches!(
            self.schedule,
            PipelineSchedule::ZeroBubble | PipelineSchedule::Zbv
        )
    }

    /// When device `k` can start its next pass (infinity: nothing placeable yet).
    fn decision_time(&self, k: usize) -> f64 {
        if self.is_greedy() {
            self.greedy_time(k)
        } else {
            match self.orders[k].get(self.next[k]) {
                Some(&a) => self.ready(a).max(self.free_at[k]),
                None => f64::INFINITY,
            }
        }
    }

    /// The device running stage `stage` of direction `dir`.
    fn device_of(&self, dir: usize, stage: usize) -> usize {
        let p = self.p;
        match self.schedule {
            PipelineSchedule::DualPipe if dir == 1 => p - 1 - stage,
            PipelineSchedule::Interleaved => stage % p,
            PipelineSchedule::Zbv | PipelineSchedule::DualPipeV if stage >= p => 2 * p - 1 - stage,
            _ => stage,
        }
    }

    fn run(mut self) -> Simulated {
        // Each device's decision time, kept current: a placement changes only its own
        // device's and those holding the stages next to the units it ran.
        let mut decision = Tournament::new(self.p);
        for k in 0..self.p {
            decision.set(k, self.decision_time(k));
        }
        loop {
            // The device that decides first: the earliest time any device can start its
            // next pass (ties: the lowest device). Passes placed later start no earlier, so
            // nothing can become ready before it.
            let (t, k) = decision.min();
            if !t.is_finite() {
                break;
            }
            let action = if self.is_greedy() {
                match self.greedy_choice(k, t) {
                    Some(a) => a,
                    None => break,
                }
            } else {
                self.next[k] += 1;
                self.orders[k][self.next[k] - 1]
            };
            self.place(k, t, action);
            let units = match action {
                Action::F(u) | Action::B(u, _) => [Some(u), None],
                Action::Fb(f, b) => [Some(f), Some(b)],
                Action::W => [None, None],
            };
            decision.set(k, self.decision_time(k));
            for u in units.into_iter().flatten() {
                let next = (u.stage + 1 < self.stages).then(|| self.device_of(u.dir, u.stage + 1));
                let previous = (u.stage > 0).then(|| self.device_of(u.dir, u.stage - 1));
                for d in [next, previous].into_iter().flatten() {
                    decision.set(d, self.decision_time(d));
                }
            }
        }
        Simulated {
            makespan: self.makespan,
            passes: self.passes,
            peak_chunks_in_flight: self.peak,
        }
    }

    /// The global micro-batch number of `u` and its model stage.
    fn ids(&self, u: Unit) -> (u32, u32) {
        ((u.dir * self.per_dir + u.mb) as u32, u.stage as u32)
    }

    fn place(&mut self, k: usize, start: f64, action: Action) {
        let s = self.slots;
        let (pass, duration, units) = match action {
            Action::F(u) => (Pass::Forward, s.forward, (Some(u), None)),
            Action::B(u, true) => (Pass::BackwardInput, s.backward_input, (None, Some(u))),
            Action::B(u, false) => (Pass::Backward, s.backward_input + s.weight, (None, Some(u))),
            Action::W => (Pass::WeightGradient, s.weight, (None, None)),
            Action::Fb(f, b) => (Pass::ForwardBackward, s.overlapped, (Some(f), Some(b))),
        };
        let end = start + duration;
        self.free_at[k] = end;
        let (mut first, mut paired) = (None, None);
        if let Some(u) = units.0 {
            self.forward_end[u.dir][u.stage][u.mb] = end;
            self.held[k] += 1;
            self.peak[k] = self.peak[k].max(self.held[k]);
            first = Some(self.ids(u));
            if self.is_greedy() {
                let j = self.chunk_of(k, u.stage);
                self.next_f[k][j] += 1;
            }
        }
        if let Some(u) = units.1 {
            self.backward_end[u.dir][u.stage][u.mb] = end;
            let ids = self.ids(u);
            if first.is_some() {
                paired = Some(ids);
            } else {
                first = Some(ids);
            }
            if action == Action::B(u, true) {
                self.queued[k].push_back(u);
            }
            self.held[k] = self.held[k].saturating_sub(1);
            if self.is_greedy() {
                let j = self.chunk_of(k, u.stage);
                self.next_b[k][j] += 1;
            }
        }
        if action == Action::W
            && let Some(u) = self.queued[k].pop_front()
        {
            first = Some(self.ids(u));
        }
        self.makespan = self.makespan.max(end);
        if !self.record {
            return;
        }
        let (micro_batch, stage) = first.unwrap_or((0, 0));
        self.passes.push(Placed {
            device: k as u32,
            pass,
            micro_batch,
            stage,
            paired,
            start,
            end,
        });
    }

    /// Which of device `k`'s chunks runs `stage`.
    fn chunk_of(&self, k: usize, stage: usize) -> usize {
        (0..self.chunks)
            .find(|&j| self.schedule.stage_of(k as u64, j as u64, self.p as u64) as usize == stage)
            .unwrap_or(0)
    }
}

/// The devices' decision times in a tournament tree: the earliest (ties: the lowest
/// device) in constant time, a device's change in `log p` steps — the simulation asks for
/// the earliest once per pass.
struct Tournament {
    leaves: usize,
    /// Node `i`'s winner (time, device); leaves from `leaves`, the root at 1.
    nodes: Vec<(f64, usize)>,
}

impl Tournament {
    fn new(n: usize) -> Tournament {
        let leaves = n.next_power_of_two().max(1);
        Tournament {
            leaves,
            nodes: vec![(f64::INFINITY, usize::MAX); 2 * leaves],
        }
    }

    fn set(&mut self, k: usize, t: f64) {
        let mut i = self.leaves + k;
        self.nodes[i] = (t, k);
        while i > 1 {
            i /= 2;
            let (a, b) = (self.nodes[2 * i], self.nodes[2 * i + 1]);
            // The earlier; equal times to the lower device (the left one).
            self.nodes[i] = if b.0 < a.0 { b } else { a };
        }
    }

    fn min(&self) -> (f64, usize) {
        self.nodes[1]
    }
}

fn nan_inf(t: f64) -> f64 {
    if t.is_nan() { f64::INFINITY } else { t }
}

/// 1F1B's order on device `k` of `p`: `p − k − 1` warm-up forwards, then one forward and
/// one backward, then the remaining backwards.
fn one_f_one_b(k: usize, p: usize, m: usize) -> Vec<Action> {
    let unit = |mb| Unit {
        dir: 0,
        stage: k,
        mb,
    };
    let warm = (p - k - 1).min(m);
    let mut order: Vec<Action> = (0..warm).map(|i| Action::F(unit(i))).collect();
    for i in 0..m - warm {
        order.push(Action::F(unit(warm + i)));
        order.push(Action::B(unit(i), false));
    }
    order.extend((m - warm..m).map(|i| Action::B(unit(i), false)));
    order
}

/// Megatron-LM's interleaved order on device `k` of `p` with `v` chunks: micro-batches in
/// groups of `p` through each chunk in turn, `2(p − k − 1) + (v − 1)p` warm-up forwards,
/// then one forward and one backward (chunks in reverse), then the remaining backwards.
fn interleaved(k: usize, p: usize, v: usize, m: usize) -> Vec<Action> {
    let total = m * v;
    let unit = |i: usize, backward: bool| {
        let group = (i % (p * v)) / p;
        let chunk = if backward { v - 1 - group } else { group };
        Unit {
            dir: 0,
            stage: chunk * p + k,
            mb: (i / (p * v)) * p + i % p,
        }
    };
    let warm = (2 * (p - k - 1) + (v - 1) * p).min(total);
    let mut order: Vec<Action> = (0..warm).map(|i| Action::F(unit(i, false))).collect();
    for i in 0..total - warm {
        order.push(Action::F(unit(warm + i, false)));
        order.push(Action::B(unit(i, true), false));
    }
    order.extend((total - warm..total).map(|i| Action::B(unit(i, true), false)));
    order
}

/// The order builder of DualPipe and DualPipeV: a device's two chunks (phase 0 and 1, each
/// a direction and stage), the micro-batches each has run forward and backward.
struct Phases {
    units: [(usize, usize); 2],
    f: [usize; 2],
    b: [usize; 2],
    order: Vec<Action>,
}

/// Phase `x`'s next micro-batch by `count` (its forwards' or its backwards'), counted.
fn next_unit(units: [(usize, usize); 2], count: &mut [usize; 2], x: usize) -> Unit {
    let (dir, stage) = units[x];
    count[x] += 1;
    Unit {
        dir,
        stage,
        mb: count[x] - 1,
    }
}

impl Phases {
    fn f(&mut self, x: usize) -> Unit {
        next_unit(self.units, &mut self.f, x)
    }

    fn b(&mut self, x: usize) -> Unit {
        next_unit(self.units, &mut self.b, x)
    }

    fn forward(&mut self, x: usize) {
        let u = self.f(x);
        self.order.push(Action::F(u));
    }

    fn backward(&mut self, x: usize, split: bool) {
        let u = self.b(x);
        self.order.push(Action::B(u, split));
    }

    fn overlapped(&mut self, forward: usize, backward: usize) {
        let f = self.f(forward);
        let b = self.b(backward);
        self.order.push(Action::Fb(f, b));
    }

    /// DeepSeek's eight steps for a device at position `rank` of `ranks` (DualPipe: the
    /// half rank of half the ranks; DualPipeV: the rank of all), `chunks` micro-batches per
    /// phase, `last` the device whose first main step runs its two chunks apart.
    fn eight_steps(&mut self, rank: usize, ranks: usize, chunks: usize, last: bool) {
        let lead = ranks - rank - 1;
        for _ in 0..2 * lead {
            self.forward(0);
        }
        for _ in 0..rank + 1 {
            self.forward(0);
            self.forward(1);
        }
        for _ in 0..lead {
            self.backward(1, true);
            self.order.push(Action::W);
            self.forward(1);
        }
        for i in 0..(chunks + rank + 1).saturating_sub(2 * ranks) {
            if i == 0 && last {
                self.forward(0);
                self.backward(1, false);
            } else {
                self.overlapped(0, 1);
            }
            self.overlapped(1, 0);
        }
        for _ in 0..lead {
            self.backward(1, false);
            self.overlapped(1, 0);
        }
        let tail = rank + 1;
        let mut split = false;
        for i in 0..tail {
            if i == tail / 2 && !rank.is_multiple_of(2) {
                split = true;
            }
            self.backward(1, split);
            if i == tail / 2 && rank.is_multiple_of(2) {
                split = true;
            }
            self.backward(0, split);
        }
        for _ in 0..lead {
            self.order.push(Action::W);
            self.backward(0, true);
        }
        for _ in 0..tail {
            self.order.push(Action::W);
        }
    }
}

/// DualPipe's order on device `k` of `p` with `per_dir` micro-batches from each end
/// (DeepSeek's open-source schedule): phase 0 is the direction in which the device is
/// among the first half of the stages.
fn dual_pipe(k: usize, p: usize, per_dir: usize) -> Vec<Action> {
    let half = k.min(p - 1 - k);
    let units = if k < p / 2 {
        [(0, k), (1, p - 1 - k)]
    } else {
        [(1, p - 1 - k), (0, k)]
    };
    let mut ph = Phases {
        units,
        f: [0; 2],
        b: [0; 2],
        order: Vec::new(),
    };
    // DualPipe's counts are DualPipeV's on half the ranks with twice the chunks per phase.
    ph.eight_steps(half, p / 2, per_dir, half + 1 == p / 2);
    ph.order
}

/// DualPipeV's order on device `k` of `p` (2p stages in a V) with `m` micro-batches.
fn dual_pipe_v(k: usize, p: usize, m: usize) -> Vec<Action> {
    let mut ph = Phases {
        units: [(0, k), (0, 2 * p - 1 - k)],
        f: [0; 2],
        b: [0; 2],
        order: Vec::new(),
    };
    ph.eight_steps(k, p, m, k + 1 == p);
    ph.order
}

#[cfg(test)]
mod tests;
