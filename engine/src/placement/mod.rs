//! Device placement: pipeline stages, tensor- and data-parallel degrees (the reference's
//! dynamic program, `docs/reference.md` §1.5).
//!
//! The Piper-style dynamic program of the reference, over the layer graph of a model for
//! each tensor-parallel width `t`. It works on sets of layers closed under successors;
//! because a transformer's layer graph is a chain (possibly with skip edges from the
//! embedding, such as attention masks), those sets are exactly its suffixes and a stage is
//! a contiguous range of layers. That, and the facts that a stage uses 1 or `t` devices and
//! that a pipeline of `s` stages needs at least `s` devices, make the program
//! `O(n² · min(n, devices))` steps per width (times the front sizes) instead of the
//! reference's `O(downsets² · devices · stages)`.
//!
//! Invariants: memory is linear in `n` for a given number of devices — the ranges are
//! computed a row at a time (`stages.rs`), never tabulated `(n + 1)²`; and the program's size
//! is known before it runs ([`ProgramSize`]): one beyond [`MAX_PROGRAM_STEPS`] is refused,
//! by the spec's validator with the numbers and here as a typed error.
//!
//! Semantics, as the reference:
//! * a stage's load is its forward plus backward time, with the communication of edges
//!   that cross the stage boundary (`bytes / bandwidth`); with recomputation every stage
//!   but the last runs its forward twice;
//! * 1F1B memory ([`MemoryRule::Reference`]; archplace's own search uses Megatron-LM's
//!   [`MemoryRule::Megatron`]): a stage `s` stages from the end holds `2P + opt + A + (s − 1)·stash`,
//!   where the stash is the stage's activations, or with recomputation only the inputs that
//!   enter it;
//! * time per batch = bottleneck load × (micro-batches per replica + stages − 1) + the
//!   data-parallel gradient all-reduce `4·(d − 1)·P / (bandwidth · d)`.
//!
//! Two things are chosen by the caller ([`Resync`]): the reference charges the all-reduce
//! for the *first* stage's parameters; archplace's own search charges it for the stage with
//! the *most* parameters, because every stage all-reduces its own gradients at the same
//! time and the slowest one bounds the step.

use serde::Serialize;

mod stages;
use stages::{Range, Stages};

/// One layer of the chain, in pipeline order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layer {
    /// The caller's identifier of the layer.
    pub id: i64,
    pub parameter_bytes: f64,
    pub activation_bytes: f64,
    /// What the layer holds beside its activations while its passes run (the loss's
    /// logits and gradients: [`crate::model::Layer::workspace_bytes`]); a stage needs the
    /// largest of its layers' and of [`MegatronMemory::transient_bytes`] on top of what it
    /// keeps, as they never run at once.
    pub workspace_bytes: f64,
    pub forward: f64,
    pub backward: f64,
    pub tensor_parallel: bool,
}

/// An edge between layers `from < to` (indices into the chain) carrying `bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub bytes: f64,
}

/// The layers of a model at one tensor-parallel width.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Chain {
    pub width: u64,
    pub layers: Vec<Layer>,
    /// Every edge; consecutive layers must be connected.
    pub edges: Vec<Edge>,
}

impl Chain {
    /// Whether some layers are tensor-parallel and some are not (stages are then 1 or
    /// `width` devices wide, and the program counts the wide ones).
    pub fn mixed(&self) -> bool {
        self.layers.iter().any(|l| l.tensor_parallel)
            && self.layers.iter().any(|l| !l.tensor_parallel)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Resync {
    /// The reference: the first stage's parameters.
    FirstStage,
    /// archplace: the largest stage's parameters.
    LargestStage,
}

/// Everything the program needs besides the chains.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Settings {
    pub memory_bytes: f64,
    pub devices: u64,
    /// Link bandwidth, bytes per unit of time.
    pub bandwidth: f64,
    /// Micro-batches in one global batch.
    pub micro_batches: u64,
    pub recompute: bool,
    /// How a stage's memory and its data-parallel gradient synchronisation are counted.
    pub memory: MemoryRule,
    pub resync: Resync,
    /// Which plans a framework can run: what the program may return.
    pub runnable: Runnable,
    /// The bubble's micro-batch slots per pipeline stage beyond the first, in loads of the
    /// slowest stage: 1 for 1F1B (the reference's `m + s − 1`), less for the schedules
    /// that fill it ([`crate::pipeline::PipelineSchedule::bubble_per_stage`]).
    pub bubble_per_stage: f64,
}

/// Constraints that make a plan one a framework (Megatron-LM) can run. The reference's
/// program has neither: it may leave devices idle and give replicas unequal shares of
/// the batch (`⌈m / d⌉` micro-batches each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Runnable {
    /// Stages × their devices × replicas use every device.
    pub all_devices: bool,
    /// The micro-batches split evenly over the replicas.
    pub even_batches: bool,
}

impl Runnable {
    /// Whether `d` replicas may run under these constraints, `devices` devices in all and
    /// `micro_batches` per global batch.
    pub fn allows_degree(&self, d: u64, devices: u64, micro_batches: u64) -> bool {
        d > 0
            && (!self.all_devices || devices.is_multiple_of(d))
            && (!self.even_batches || micro_batches.is_multiple_of(d))
    }

    /// Whether a plan using `used` devices of `devices` may run.
    pub fn allows_devices(&self, used: u64, devices: u64) -> bool {
        !self.all_devices || used == devices
    }
}

/// How a stage's memory and its gradient synchronisation are counted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum MemoryRule {
    /// The reference: `2P + optimizer_copies·P` of state, the stage's activations, and
    /// `(s − 1)` stashes (its activations, or with recomputation the inputs entering it);
    /// the gradient all-reduce moves `4·(d − 1)/d·P`.
    Reference {
        /// Optimizer state as a multiple of the parameters (SGD 0, Adam 1).
        optimizer_copies: f64,
    },
    /// Megatron-LM: bytes of state per byte of parameters from the precision and the
    /// optimizer, the optimizer's part sharded over the data-parallel group with the
    /// distributed optimizer; a stage `s` stages from the end keeps `s` micro-batches of the
    /// activations its layers keep (given in the chain for the recomputation chosen, whose
    /// time the chain's backward includes), plus what recomputation rematerialises.
    Megatron(MegatronMemory),
}

/// The Megatron-LM memory and gradient-synchronisation rule, per byte of parameters (the
/// chain counts parameters in bytes of the activation element size).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MegatronMemory {
    /// Weights and gradient buffer, never sharded.
    pub replicated_per_parameter_byte: f64,
    /// Master weights, optimizer gradient copy and moments.
    pub optimizer_per_parameter_byte: f64,
    /// The distributed optimizer shards the optimizer's part over the data-parallel group.
    pub distributed: bool,
    /// Activations rematerialised while one block's backward pass runs, in bytes.
    pub transient_bytes: f64,
    /// Bytes each device sends per parameter byte in units of a ring pass
    /// `(d − 1)/d · bytes / bandwidth`: twice the gradient bytes for an all-reduce; the
    /// gradient plus the weight bytes for the distributed optimizer's reduce-scatter and
    /// all-gather.
    pub sync_per_parameter_byte: f64,
}

impl MemoryRule {
    /// State bytes per parameter byte with `shards` data-parallel replicas.
    fn state_per_parameter_byte(&self, shards: u64) -> f64 {
        match *self {
            MemoryRule::Reference { optimizer_copies } => 2.0 + optimizer_copies,
            MemoryRule::Megatron(m) => {
                let opt = if m.distributed {
                    m.optimizer_per_parameter_byte / shards.max(1) as f64
                } else {
                    m.optimizer_per_parameter_byte
                };
                m.replicated_per_parameter_byte + opt
            }
        }
    }

    /// Whether memory depends on the data-parallel degree.
    fn sharded(&self) -> bool {
        matches!(self, MemoryRule::Megatron(m) if m.distributed)
    }
}

/// A fixed strategy: `pipeline` stages of `ceil(layers / pipeline)` transformer layers
/// (the reference's rule), `tensor`-wide, `data` replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Fixed {
    pub pipeline: u64,
    pub tensor: u64,
    pub data: u64,
    pub transformer_layers: u64,
}

/// One pipeline stage of a plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StagePlan {
    /// Chain indices `[start, end)`.
    pub start: usize,
    pub end: usize,
    pub devices: u64,
    /// The stage's load per micro-batch (forward + backward, with recomputation if any).
    pub load: f64,
    pub parameter_bytes: f64,
    /// Peak memory of one device of the stage under 1F1B.
    pub memory_bytes: f64,
}

/// A placement and its time per batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub tensor_parallel: u64,
    pub data_parallel: u64,
    /// Model chunks per device (Megatron-LM's interleaved 1F1B); 1: plain 1F1B.
    pub interleaving: u64,
    pub stages: Vec<StagePlan>,
    pub time_per_batch: f64,
    /// The data-parallel all-reduce part of `time_per_batch`.
    pub resync_time: f64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlacementError {
    #[error(
        "width {width}: the layer graph is not a chain (layer {at} is not fed by the layer before it); branching layer graphs are not supported"
    )]
    NotAChain { width: u64, at: i64 },
    #[error("width {width}: edge {from} → {to} does not go forward along the chain")]
    BackwardEdge { width: u64, from: usize, to: usize },
    #[error("width {width}: the chain is empty")]
    Empty { width: u64 },
    #[error("{0}")]
    Invalid(String),
    #[error(
        "width {width}: placing {layers} layers over {devices} devices takes {steps:.1e} steps of the placement program, above its limit of {max:.1e}",
        steps = *steps as f64,
        max = MAX_PROGRAM_STEPS as f64
    )]
    TooLarge {
        width: u64,
        layers: usize,
        devices: u64,
        steps: u128,
    },
}

/// The most steps one placement program may take (about 5 s on one core of a 2024 laptop,
/// measured by the `placement/steps` benchmark): a longer chain or more devices than this
/// allows is refused by the spec's validator, and here, before any memory is allocated.
pub const MAX_PROGRAM_STEPS: u128 = 1_000_000_000;

/// The size of the placement program for a chain of `layers` over `devices`, known before
/// it runs. Its steps are the ranges it visits — every `[i, j)` once per number of stages
/// (and per count of wide stages when widths are mixed); its memory is one front per suffix,
/// number of stages and count, plus one row of ranges — linear in the layers for a given
/// number of devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProgramSize {
    pub steps: u128,
    /// The program's tables with one entry per front (more when the objective trades load
    /// against parameters).
    pub bytes: u128,
}

impl ProgramSize {
    pub fn of(layers: usize, devices: u64, mixed: bool) -> ProgramSize {
        let n = layers as u128;
        let bound = u128::from(devices).min(n);
        let qn = if mixed { bound + 1 } else { 1 };
        let mut steps = 0u128;
        for rest in 1..=n {
            steps += rest * (1 + rest.min(bound) * qn);
        }
        let cells = (n + 1) * (bound + 1) * qn;
        // A front's span and one entry, twice over while the flat list grows; one row of
        // fronts being built; one row of ranges.
        let entry = std::mem::size_of::<Entry>() as u128;
        let front = std::mem::size_of::<(usize, usize)>() as u128 + 2 * entry;
        let building = (std::mem::size_of::<Vec<Entry>>() as u128 + entry) * (bound + 1) * qn;
        let row = (std::mem::size_of::<stages::Range>() + 3 * std::mem::size_of::<f64>()) as u128;
        ProgramSize {
            steps,
            bytes: cells * front + building + n * row,
        }
    }

    /// Whether the program may run.
    pub fn fits(&self) -> bool {
        self.steps <= MAX_PROGRAM_STEPS
    }
}

/// The longest chain whose program fits over `devices` (0 if none does).
pub fn max_layers(devices: u64, mixed: bool) -> usize {
    let (mut lo, mut hi) = (0usize, 1usize);
    while ProgramSize::of(hi, devices, mixed).fits() {
        lo = hi;
        hi *= 2;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ProgramSize::of(mid, devices, mixed).fits() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Why a fixed strategy cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize)]
pub enum FixedError {
    #[error("tensor-parallel width {0} is not among the layer graphs")]
    NoSuchWidth(u64),
    #[error(
        "{pipeline} stages × {tensor} × {data} replicas need {needed} devices; there are {devices}"
    )]
    TooManyDevices {
        pipeline: u64,
        tensor: u64,
        data: u64,
        needed: u64,
        devices: u64,
    },
    #[error(
        "data-parallel degree {data} must be between 1 and min(devices, micro-batches) = {max}"
    )]
    BadData { data: u64, max: u64 },
    #[error(
        "stage {stage} does not fit in memory ({needed_bytes:.0} bytes needed, {memory_bytes:.0} available)"
    )]
    OutOfMemory {
        stage: usize,
        needed_bytes: f64,
        memory_bytes: f64,
    },
    #[error("{0} pipeline stages for a model of that many layers")]
    BadPipeline(u64),
}

/// A non-dominated way to place a suffix: its bottleneck load, the parameters of its
/// largest stage (0 when the objective ignores them), the end of its first stage and the
/// entry of the rest in the next state's front.
#[derive(Debug, Clone, Copy)]
struct Entry {
    load: f64,
    pmax: f64,
    next: u32,
    child: u32,
}

/// Keeps `e` in `front` unless dominated; drops what it dominates.
fn insert(front: &mut Vec<Entry>, e: Entry) {
    if front.iter().any(|f| f.load <= e.load && f.pmax <= e.pmax) {
        return;
    }
    front.retain(|f| !(e.load <= f.load && e.pmax <= f.pmax));
    front.push(e);
}

/// The dynamic program over suffixes for one chain.
#[derive(Clone)]
struct Program<'s, 'a> {
    st: &'s Stages<'a>,
    /// Stages are at most this many (the reference's bound: min(devices, layers)).
    bound: usize,
    qn: usize,
    /// spans[(i, s, q)]: where in `entries` the front of suffix i in s stages, q of them
    /// `t` devices wide (q only counted when widths are mixed), is. One flat list rather
    /// than a vector per front: a large program has millions of small fronts, whose
    /// allocations cost more than the program's arithmetic.
    spans: Vec<(usize, usize)>,
    entries: Vec<Entry>,
    /// The fronts of the row being built, per (s, q); reused from row to row.
    scratch: Vec<Vec<Entry>>,
}

impl<'s, 'a> Program<'s, 'a> {
    fn idx(&self, i: usize, s: usize, q: usize) -> usize {
        (i * (self.bound + 1) + s) * self.qn + q
    }

    /// The front at `idx`.
    fn front(&self, idx: usize) -> &[Entry] {
        let (start, len) = self.spans[idx];
        &self.entries[start..start + len]
    }

    fn wide(&self, r: &Range) -> usize {
        usize::from(self.st.mixed && r.devices == self.st.width && self.st.width > 1)
    }

    /// Devices of `s` stages of which `q` are wide; `u64::MAX` if impossible.
    fn devices_of(&self, s: usize, q: usize, uniform: u64) -> u64 {
        match (self.st.mixed, q <= s) {
            (true, true) => (s - q) as u64 + q as u64 * self.st.width,
            (true, false) => u64::MAX,
            (false, _) => s as u64 * uniform,
        }
    }

    fn new(st: &'s Stages<'a>, settings: &Settings) -> Program<'s, 'a> {
        let n = st.n;
        let bound = (settings.devices as usize).min(n);
        let qn = if st.mixed { bound + 1 } else { 1 };
        let size = (n + 1) * (bound + 1) * qn;
        let mut p = Program {
            st,
            bound,
            qn,
            spans: vec![(0, 0); size],
            entries: vec![Entry {
                load: 0.0,
                pmax: 0.0,
                next: n as u32,
                child: 0,
            }],
            scratch: vec![Vec::new(); (bound + 1) * qn],
        };
        let zero = p.idx(n, 0, 0);
        p.spans[zero] = (0, 1);
        p
    }

    /// The programs of the memory sizes in `memory_bytes`, run side by side, and which of
    /// them serves each size. A range's load, parameters and memory do not depend on the
    /// memory size, only the stages it fits with do: each row of ranges is computed once
    /// for all sizes, and sizes whose rows fit the same ranges in the same stages (memory
    /// that does not bind, above all) share one program until their rows differ. `st`
    /// must be built with the largest of the sizes (its rows stop where nothing fits).
    fn run_each(
        st: &'s Stages<'a>,
        settings: &Settings,
        memory_bytes: &[f64],
    ) -> (Vec<Program<'s, 'a>>, Vec<usize>) {
        let sizes = memory_bytes.len();
        let mut programs = vec![Program::new(st, settings)];
        let mut owner = vec![0usize; sizes];
        let mut row = Vec::with_capacity(st.n);
        let mut fits: Vec<Vec<u64>> = vec![Vec::with_capacity(st.n); sizes];
        for i in (0..st.n).rev() {
            st.fitting_row(i, &mut row);
            // Stages beyond this bound are never asked of a range of this row.
            let most = programs[0].bound.min(st.n - i) as u64;
            for (f, &memory) in fits.iter_mut().zip(memory_bytes) {
                f.clear();
                f.extend(
                    row.iter()
                        .map(|r| r.stages_within(memory, settings.devices).min(most)),
                );
            }
            // A size follows the first size before it that shared its program and has the
            // same row; one that shared it with a different row gets a copy of its own.
            let mut next = owner.clone();
            for k in 0..sizes {
                if let Some(l) = (0..k).find(|&l| owner[l] == owner[k] && fits[l] == fits[k]) {
                    next[k] = next[l];
                } else if (0..k).any(|l| owner[l] == owner[k]) {
                    programs.push(programs[owner[k]].clone());
                    next[k] = programs.len() - 1;
                }
            }
            owner = next;
            for (p, program) in programs.iter_mut().enumerate() {
                if let Some(k) = owner.iter().position(|&o| o == p) {
                    program.extend(i, &row, &fits[k], settings);
                }
            }
        }
        (programs, owner)
    }

    /// The fronts of suffix `i`, from its row of ranges that fit somewhere and the stages
    /// each fits with (`fits`, non-increasing along the row).
    fn extend(&mut self, i: usize, row: &[Range], fits: &[u64], settings: &Settings) {
        let n = self.st.n;
        let track_params = settings.resync == Resync::LargestStage;
        for s in 1..=self.bound.min(n - i) {
            // The ranges that fit `s` stages from the end are a prefix of the row; a last
            // stage (s = 1) must end the chain, any other must not.
            let fitting = fits.iter().take_while(|&&m| m >= s as u64).count();
            let ends = match s {
                1 if fitting == n - i => n - i - 1..n - i,
                1 => 0..0,
                _ => 0..fitting.min(n - i - 1),
            };
            for x in ends {
                let (j, r) = (i + 1 + x, &row[x]);
                let load = r.load(s as u64, settings.recompute);
                let params = if track_params { r.params } else { 0.0 };
                let wide = self.wide(r);
                for q in wide..self.qn {
                    let (start, len) = self.spans[self.idx(j, s - 1, q - wide)];
                    let at = &mut self.scratch[s * self.qn + q];
                    for (c, rest) in self.entries[start..start + len].iter().enumerate() {
                        let e = Entry {
                            load: rest.load.max(load),
                            pmax: rest.pmax.max(params),
                            next: j as u32,
                            child: c as u32,
                        };
                        insert(at, e);
                    }
                }
            }
        }
        // The row is done: its fronts join the flat list.
        for s in 1..=self.bound.min(n - i) {
            for q in 0..self.qn {
                let idx = self.idx(i, s, q);
                let front = &mut self.scratch[s * self.qn + q];
                self.spans[idx] = (self.entries.len(), front.len());
                self.entries.append(front);
            }
        }
    }

    /// Stages of suffix `i` in `s` stages with `q` wide ones, following front entry `e`.
    fn stages(
        &self,
        mut i: usize,
        mut s: usize,
        mut q: usize,
        mut e: usize,
        settings: &Settings,
    ) -> Vec<StagePlan> {
        let mut out = Vec::new();
        while s > 0 {
            let entry = self.front(self.idx(i, s, q))[e];
            let j = entry.next as usize;
            let r = self.st.range(i, j);
            out.push(StagePlan {
                start: i,
                end: j,
                devices: r.devices,
                load: r.load(s as u64, settings.recompute),
                parameter_bytes: r.params,
                memory_bytes: r.memory(s as u64),
            });
            q -= self.wide(&r);
            i = j;
            s -= 1;
            e = entry.child as usize;
        }
        out
    }
}

fn resync_time(settings: &Settings, d: u64, params: f64) -> f64 {
    let factor = match settings.memory {
        MemoryRule::Reference { .. } => 4.0,
        MemoryRule::Megatron(m) => m.sync_per_parameter_byte,
    };
    factor * (d - 1) as f64 * params / (settings.bandwidth * d as f64)
}

/// The data-parallel degrees `1..=max_d` in groups that share one memory bound: all of
/// them, or with the distributed optimizer `[2^k, 2^(k+1))`, each bounded (safely) by the
/// memory at its smallest degree `2^k`.
fn shard_levels(settings: &Settings, max_d: u64) -> Vec<(u64, u64)> {
    if !settings.memory.sharded() {
        return vec![(1, max_d)];
    }
    let mut levels = Vec::new();
    let mut lo = 1;
    while lo <= max_d {
        levels.push((lo, (2 * lo - 1).min(max_d)));
        lo *= 2;
    }
    levels
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// The best plan for one chain at each memory size of `memory_bytes` (`settings`' own size
/// is not used), `None` where nothing fits.
fn best_for_chain(
    chain: &Chain,
    settings: &Settings,
    memory_bytes: &[f64],
) -> Result<Vec<Option<Plan>>, PlacementError> {
    let size = ProgramSize::of(chain.layers.len(), settings.devices, chain.mixed());
    if !size.fits() {
        return Err(PlacementError::TooLarge {
            width: chain.width,
            layers: chain.layers.len(),
            devices: settings.devices,
            steps: size.steps,
        });
    }
    let largest = Settings {
        memory_bytes: memory_bytes
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max),
        ..settings.clone()
    };
    let max_d = settings.devices.min(settings.micro_batches);
    let mut best: Vec<Option<Plan>> = vec![None; memory_bytes.len()];
    for (lo, hi) in shard_levels(settings, max_d) {
        let st = Stages::new(chain, &largest, lo)?;
        let (programs, owner) = Program::run_each(&st, &largest, memory_bytes);
        let mut first_row = Vec::with_capacity(st.n);
        st.fitting_row(0, &mut first_row);
        let bound = programs[0].bound as u64;
        // Sizes with the same program and the same first row have the same plan.
        let mut found: Vec<(usize, Vec<u64>, Option<Plan>)> = Vec::new();
        for ((&memory, &p), best) in memory_bytes.iter().zip(&owner).zip(&mut best) {
            let fits: Vec<u64> = first_row
                .iter()
                .map(|r| r.stages_within(memory, settings.devices).min(bound))
                .collect();
            let plan = match found.iter().find(|(q, f, _)| *q == p && *f == fits) {
                Some((_, _, plan)) => plan.clone(),
                None => {
                    let first_stage = FirstRow {
                        ranges: &first_row,
                        fits: &fits,
                    };
                    let program = &programs[p];
                    let plan = best_in_level(chain, &largest, &st, program, first_stage, lo..=hi);
                    found.push((p, fits, plan.clone()));
                    plan
                }
            };
            if let Some(plan) = plan
                && best
                    .as_ref()
                    .is_none_or(|b| plan.time_per_batch < b.time_per_batch)
            {
                *best = Some(plan);
            }
        }
    }
    Ok(best)
}

/// The first stage's choices in one memory size: the fitting row of suffix 0 (`ranges`)
/// and the stages each of its ranges fits with in that size (`fits`).
#[derive(Clone, Copy)]
struct FirstRow<'a> {
    ranges: &'a [Range],
    fits: &'a [u64],
}

/// The best plan with a data-parallel degree in `degrees`, from the program `p` of one
/// memory size, whose first stage is one of `first_stage`'s ranges.
fn best_in_level(
    chain: &Chain,
    settings: &Settings,
    st: &Stages<'_>,
    p: &Program<'_, '_>,
    first_stage: FirstRow<'_>,
    degrees: std::ops::RangeInclusive<u64>,
) -> Option<Plan> {
    let (lo, hi) = (*degrees.start(), *degrees.end());
    let FirstRow {
        ranges: first_row,
        fits,
    } = first_stage;
    let n = st.n;
    let uniform = if chain.layers.iter().all(|l| l.tensor_parallel) {
        st.width
    } else {
        1
    };
    // (time per batch, d, end of the first stage, stages, q of the rest, front entry)
    let mut best: Option<(f64, u64, usize, usize, usize, usize)> = None;
    // Of the degrees with the same micro-batches per replica ⌈m / d⌉, the smallest is the
    // fastest: the pipeline's time is the same, the all-reduce's `(d − 1)/d` grows with d,
    // and fewer replicas leave more devices to the stages. ⌈m / d⌉ takes about 2√m values:
    // with 4,096 micro-batches over 1,024 devices, 124 degrees instead of 1,024.
    // With a runnable plan's constraints every allowed degree is tried: the smallest of a
    // group may not be allowed.
    let run = settings.runnable;
    let constrained = run != Runnable::default();
    let degrees = (lo..=hi).filter(|&d| {
        if constrained {
            return run.allows_degree(d, settings.devices, settings.micro_batches);
        }
        d == lo || ceil_div(settings.micro_batches, d - 1) != ceil_div(settings.micro_batches, d)
    });
    for d in degrees {
        let cap = settings.devices / d;
        let m = ceil_div(settings.micro_batches, d);
        for ((j, r), &max_s) in (1..=n).zip(first_row).zip(fits) {
            let a = r.devices;
            if a > cap {
                continue;
            }
            let smax = (max_s as usize).min(p.bound).min(cap as usize);
            for s in 1..=smax {
                if (j == n) != (s == 1) {
                    continue;
                }
                let first = r.load(s as u64, settings.recompute);
                for q in 0..p.qn {
                    let rest = p.devices_of(s - 1, q, uniform);
                    if rest > cap - a || !run.allows_devices((a + rest) * d, settings.devices) {
                        continue;
                    }
                    for (e, rest) in p.front(p.idx(j, s - 1, q)).iter().enumerate() {
                        let slots = m as f64 + (s - 1) as f64 * settings.bubble_per_stage;
                        let pipeline = rest.load.max(first) * slots;
                        let params = match settings.resync {
                            Resync::FirstStage => r.params,
                            Resync::LargestStage => rest.pmax.max(r.params),
                        };
                        let tpb = pipeline + resync_time(settings, d, params);
                        if best.is_none_or(|b| tpb < b.0) {
                            best = Some((tpb, d, j, s, q, e));
                        }
                    }
                }
            }
        }
    }
    let (_, d, j, s, q, e) = best?;
    let r = first_row[j - 1];
    let mut stages = vec![StagePlan {
        start: 0,
        end: j,
        devices: r.devices,
        load: r.load(s as u64, settings.recompute),
        parameter_bytes: r.params,
        memory_bytes: r.memory(s as u64),
    }];
    stages.extend(p.stages(j, s - 1, q, e, settings));
    // Report the memory at the chosen degree (the level bounded it at its smallest).
    let count = stages.len() as u64;
    for (idx, stage) in stages.iter_mut().enumerate() {
        let from_end = count - idx as u64;
        let r = st.range(stage.start, stage.end);
        stage.memory_bytes = st.memory_with(&r, from_end, d, &settings.memory);
    }
    Some(evaluate(settings, st.width, d, stages))
}

/// Time per batch of a plan (the reference's `getTimePerBatchForResult`).
fn evaluate(settings: &Settings, width: u64, d: u64, stages: Vec<StagePlan>) -> Plan {
    let m = ceil_div(settings.micro_batches, d);
    let s = stages.len() as u64;
    let bottleneck = stages.iter().map(|x| x.load).fold(0.0, f64::max);
    let params = match settings.resync {
        Resync::FirstStage => stages.first().map_or(0.0, |x| x.parameter_bytes),
        Resync::LargestStage => stages.iter().map(|x| x.parameter_bytes).fold(0.0, f64::max),
    };
    let resync = resync_time(settings, d, params);
    Plan {
        tensor_parallel: width,
        data_parallel: d,
        interleaving: 1,
        stages,
        time_per_batch: bottleneck * (m as f64 + (s - 1) as f64 * settings.bubble_per_stage)
            + resync,
        resync_time: resync,
    }
}

/// The best interleaved plan over all widths (ties: the narrowest), or `None` when none
/// fits: Megatron-LM's interleaved 1F1B with `interleaving` model chunks per device.
///
/// The schedule needs equal chunks, so the program's free stage boundaries do not apply:
/// the `blocks` transformer blocks (chain positions `1..=blocks`, after the embedding) are
/// split evenly over `p × interleaving` chunks, device `k` holding every `p`-th chunk, the
/// embedding on the first device and what follows the blocks on the last — every `p`
/// with `p × interleaving` dividing `blocks`, every data-parallel degree. Per micro-batch a
/// device runs its layers once forward and once backward, as contiguous stages do, plus
/// `interleaving − 1` more activation and gradient transfers across its extra chunk
/// boundaries. The bubble is `(p − 1)/interleaving` loads (Narayanan et al. 2021, §2.2.2)
/// and with more than one chunk the first device keeps `p + (p − 1)/interleaving`
/// micro-batches of activations in flight (Korthikanti et al. 2022, §4.2.3), device `k`
/// otherwise `p − k`, as plain 1F1B. Megatron-LM's
/// memory rule only: `None` with the reference's.
pub fn best_interleaved(
    chains: &[Chain],
    settings: &Settings,
    interleaving: u64,
    blocks: usize,
) -> Result<Option<Plan>, PlacementError> {
    let MemoryRule::Megatron(_) = settings.memory else {
        return Ok(None);
    };
    let v = interleaving.max(1);
    let mut best: Option<Plan> = None;
    for chain in chains {
        let n = chain.layers.len();
        if blocks == 0 || blocks + 1 > n {
            continue;
        }
        let st = Stages::new(chain, settings, 1)?;
        // The transfer across one chunk boundary: a block's output, each way.
        let boundary = chain
            .edges
            .iter()
            .find(|e| e.from == 1 && e.to == 2)
            .map_or(0.0, |e| 2.0 * e.bytes / settings.bandwidth);
        let max_d = settings.devices.min(settings.micro_batches);
        for p in 2..=blocks as u64 {
            if !(blocks as u64).is_multiple_of(p * v) {
                continue;
            }
            let per = blocks / p as usize;
            let bounds: Vec<(usize, usize)> = (0..p as usize)
                .map(|k| {
                    let start = if k == 0 { 0 } else { 1 + k * per };
                    let end = if k + 1 == p as usize {
                        n
                    } else {
                        1 + (k + 1) * per
                    };
                    (start, end)
                })
                .collect();
            let ranges: Vec<Range> = bounds.iter().map(|&(i, j)| st.range(i, j)).collect();
            let width = ranges.iter().map(|r| r.devices).max().unwrap_or(1);
            for d in 1..=max_d {
                let used = p.saturating_mul(width).saturating_mul(d);
                if used > settings.devices {
                    break;
                }
                let run = settings.runnable;
                if !run.allows_degree(d, settings.devices, settings.micro_batches)
                    || !run.allows_devices(used, settings.devices)
                {
                    continue;
                }
                let m = ceil_div(settings.micro_batches, d);
                let mut stages = Vec::with_capacity(bounds.len());
                for (k, (&(i, j), r)) in bounds.iter().zip(&ranges).enumerate() {
                    let from_end = p - k as u64;
                    let in_flight = if k == 0 && v > 1 {
                        p as f64 + (p - 1) as f64 / v as f64
                    } else {
                        from_end as f64
                    }
                    .min(m as f64);
                    let memory = st.memory_with(r, 1, d, &settings.memory)
                        + (in_flight - 1.0).max(0.0) * r.stash;
                    if memory > settings.memory_bytes {
                        stages.clear();
                        break;
                    }
                    stages.push(StagePlan {
                        start: i,
                        end: j,
                        devices: r.devices,
                        load: r.load(from_end, settings.recompute) + (v - 1) as f64 * boundary,
                        parameter_bytes: r.params,
                        memory_bytes: memory,
                    });
                }
                if stages.is_empty() {
                    continue;
                }
                let bottleneck = stages.iter().map(|x| x.load).fold(0.0, f64::max);
                let params = match settings.resync {
                    Resync::FirstStage => stages[0].parameter_bytes,
                    Resync::LargestStage => {
                        stages.iter().map(|x| x.parameter_bytes).fold(0.0, f64::max)
                    }
                };
                let resync = resync_time(settings, d, params);
                let plan = Plan {
                    tensor_parallel: chain.width,
                    data_parallel: d,
                    interleaving: v,
                    stages,
                    time_per_batch: bottleneck * (m as f64 + (p - 1) as f64 / v as f64) + resync,
                    resync_time: resync,
                };
                if best
                    .as_ref()
                    .is_none_or(|b| plan.time_per_batch < b.time_per_batch)
                {
                    best = Some(plan);
                }
            }
        }
    }
    Ok(best)
}

/// The best plan over all widths (ties: the narrowest), or `None` when nothing fits.
pub fn best_plan(chains: &[Chain], settings: &Settings) -> Result<Option<Plan>, PlacementError> {
    Ok(best_plans(chains, settings, &[settings.memory_bytes])?
        .pop()
        .flatten())
}

/// [`best_plan`] at each memory size of `memory_bytes` (what `settings` says of memory
/// otherwise applies to all; its own size is not used): the same plans as one call per
/// size, for less work — the sizes share each range's load and memory (see
/// `Program::run_each`).
pub fn best_plans(
    chains: &[Chain],
    settings: &Settings,
    memory_bytes: &[f64],
) -> Result<Vec<Option<Plan>>, PlacementError> {
    let mut best: Vec<Option<Plan>> = vec![None; memory_bytes.len()];
    for chain in chains {
        for (plan, best) in best_for_chain(chain, settings, memory_bytes)?
            .into_iter()
            .zip(&mut best)
        {
            if let Some(plan) = plan
                && best
                    .as_ref()
                    .is_none_or(|b| plan.time_per_batch < b.time_per_batch)
            {
                *best = Some(plan);
            }
        }
    }
    Ok(best)
}

/// Evaluates a fixed strategy (the reference's baseline, `docs/reference.md` §1.7). Stage `k` holds the layers whose position
/// `i < transformer_layers` in the chain has `⌊i / ⌈L/p⌉⌋ = k`; the layers after them join
/// the last stage. Empty stages are dropped.
pub fn evaluate_fixed(
    chains: &[Chain],
    settings: &Settings,
    fixed: &Fixed,
) -> Result<Plan, FixedError> {
    let chain = chains
        .iter()
        .find(|c| c.width == fixed.tensor)
        .ok_or(FixedError::NoSuchWidth(fixed.tensor))?;
    let n = chain.layers.len();
    let p = fixed.pipeline;
    if p == 0 || fixed.transformer_layers == 0 {
        return Err(FixedError::BadPipeline(p));
    }
    let max_d = settings.devices.min(settings.micro_batches);
    if fixed.data == 0 || fixed.data > max_d {
        return Err(FixedError::BadData {
            data: fixed.data,
            max: max_d,
        });
    }
    let needed = p.saturating_mul(fixed.tensor).saturating_mul(fixed.data);
    if needed > settings.devices {
        return Err(FixedError::TooManyDevices {
            pipeline: p,
            tensor: fixed.tensor,
            data: fixed.data,
            needed,
            devices: settings.devices,
        });
    }
    let per = fixed.transformer_layers.div_ceil(p) as usize;
    let mut bounds: Vec<(usize, usize)> = Vec::new();
    for k in 0..p as usize {
        let start = (k * per).min(n);
        let end = if k + 1 == p as usize {
            n
        } else {
            ((k + 1) * per)
                .min(n)
                .min(fixed.transformer_layers as usize)
        };
        if start < end {
            bounds.push((start, end));
        }
    }
    let st = Stages::new(chain, settings, fixed.data)
        .map_err(|_| FixedError::NoSuchWidth(fixed.tensor))?;
    let count = bounds.len() as u64;
    let mut stages = Vec::new();
    for (idx, &(i, j)) in bounds.iter().enumerate() {
        let s = count - idx as u64;
        let r = st.range(i, j);
        if s > r.max_s {
            return Err(FixedError::OutOfMemory {
                stage: idx,
                needed_bytes: r.memory(s),
                memory_bytes: settings.memory_bytes,
            });
        }
        stages.push(StagePlan {
            start: i,
            end: j,
            devices: fixed.tensor,
            load: r.load(s, settings.recompute),
            parameter_bytes: r.params,
            memory_bytes: r.memory(s),
        });
    }
    Ok(evaluate(settings, fixed.tensor, fixed.data, stages))
}

/// Every placement, tried one by one: the reference for tests of the program.
pub fn best_plan_exact(
    chains: &[Chain],
    settings: &Settings,
) -> Result<Option<Plan>, PlacementError> {
    let mut best: Option<Plan> = None;
    let max_d = settings.devices.min(settings.micro_batches);
    // Memory that depends on the degree is checked at each degree exactly.
    let levels: Vec<(u64, u64)> = if settings.memory.sharded() {
        (1..=max_d).map(|d| (d, d)).collect()
    } else {
        vec![(1, max_d)]
    };
    for chain in chains {
        for &(lo, hi) in &levels {
            let st = Stages::new(chain, settings, lo)?;
            let n = st.n;
            let table: Vec<Vec<Range>> = (0..n)
                .map(|i| {
                    let mut row = Vec::new();
                    st.row(i, n, &mut row);
                    row
                })
                .collect();
            // Every composition of n layers into contiguous stages.
            for mask in 0u64..(1u64 << (n - 1)) {
                let mut cuts = vec![0];
                for b in 0..n - 1 {
                    if mask >> b & 1 == 1 {
                        cuts.push(b + 1);
                    }
                }
                cuts.push(n);
                let s_total = cuts.len() as u64 - 1;
                if s_total as usize > (settings.devices as usize).min(n) {
                    continue;
                }
                let mut stages = Vec::new();
                let mut fits = true;
                let mut devices = 0;
                for (idx, w) in cuts.windows(2).enumerate() {
                    let (i, j) = (w[0], w[1]);
                    let s = s_total - idx as u64;
                    let r = table[i][j - i - 1];
                    if s > r.max_s {
                        fits = false;
                        break;
                    }
                    devices += r.devices;
                    stages.push(StagePlan {
                        start: i,
                        end: j,
                        devices: r.devices,
                        load: r.load(s, settings.recompute),
                        parameter_bytes: r.params,
                        memory_bytes: r.memory(s),
                    });
                }
                if !fits {
                    continue;
                }
                for d in lo..=hi {
                    if devices * d > settings.devices {
                        break;
                    }
                    let run = settings.runnable;
                    if !run.allows_degree(d, settings.devices, settings.micro_batches)
                        || !run.allows_devices(devices * d, settings.devices)
                    {
                        continue;
                    }
                    let plan = evaluate(settings, st.width, d, stages.clone());
                    if best
                        .as_ref()
                        .is_none_or(|b| plan.time_per_batch < b.time_per_batch)
                    {
                        best = Some(plan);
                    }
                }
            }
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests;
