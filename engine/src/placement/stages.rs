//! A stage's quantities — devices, load, parameters, memory — for any contiguous range of
//! one chain, computed a row at a time.
//!
//! Why rows: the program visits the ranges `[i, j)` by their first layer `i`, so it needs
//! only one row of them at a time. Earlier versions kept every range in `(n + 1)²` tables
//! (88 bytes a range: 1.46 GB at 4,000 layers, an abort at 100,000); a row costs `O(n)`
//! memory and `O(n + E log E)` time, where the old tables also spent `O(n³)` on the
//! recomputation loads.
//!
//! The backward latency of `[i, j)` in closed form: a node `v`'s backward starts when the
//! later nodes it feeds inside the range have finished, when the gradients of its edges
//! leaving the range have arrived (`bytes / bandwidth`), and not before 0 (with the
//! reference's recomputation: not before the range's forward pass ran again). So
//! the range's backward ends at `max over v in [i, j)` of `L(i, v) + start(v)`, where
//! `L(i, v)` is the heaviest path of backward times from `i` to `v` inside the range — which
//! does not depend on `j`. One pass over `v` gives every `L(i, v)`; a heap of the edges
//! still leaving the range as `j` grows gives the max of `L(i, v) + c` over them.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{Chain, MemoryRule, PlacementError, Settings};

/// One range `[i, j)` as a stage.
#[derive(Debug, Clone, Copy)]
pub(super) struct Range {
    /// Devices of the stage: 1, or the chain's width if a layer is tensor-parallel.
    pub devices: u64,
    /// Forward plus backward time.
    pub load_plain: f64,
    /// The same with the forward run again before the backward (reference recomputation).
    pub load_recompute: f64,
    pub params: f64,
    /// Memory held whatever the stage's position, and per extra micro-batch in flight.
    pub constant: f64,
    pub stash: f64,
    /// Largest number of stages from this one to the end with which it fits in memory.
    pub max_s: u64,
}

impl Range {
    /// The stage's load `s` stages from the end.
    pub fn load(&self, s: u64, recompute: bool) -> f64 {
        if recompute && s > 1 {
            self.load_recompute
        } else {
            self.load_plain
        }
    }

    /// Peak memory of one device of the stage `s` stages from the end.
    pub fn memory(&self, s: u64) -> f64 {
        self.constant + (s.saturating_sub(1)) as f64 * self.stash
    }

    /// Largest number of stages from this one to the end (at most `devices`) with which
    /// it fits in `memory_bytes`; 0 when it fits nowhere.
    pub fn stages_within(&self, memory_bytes: f64, devices: u64) -> u64 {
        if self.constant + (devices as f64 - 1.0) * self.stash <= memory_bytes {
            devices
        } else if self.constant > memory_bytes {
            0
        } else {
            1 + ((memory_bytes - self.constant) / self.stash).floor() as u64
        }
    }
}

/// A chain prepared for ranges: its edges by node, with the settings that shape memory.
pub(super) struct Stages<'a> {
    pub n: usize,
    pub width: u64,
    pub mixed: bool,
    /// State bytes per parameter byte at the data-parallel degree it was built for.
    pub state: f64,
    chain: &'a Chain,
    settings: &'a Settings,
    /// Per node: (other end, transfer time) of its incoming and outgoing edges.
    incoming: Vec<Vec<(usize, f64)>>,
    outgoing: Vec<Vec<(usize, f64)>>,
}

/// A max-heap item: a value, ordered totally, with the node its edge ends at.
#[derive(PartialEq)]
struct Leaving(f64, usize);

impl Eq for Leaving {}

impl PartialOrd for Leaving {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Leaving {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(other.1.cmp(&self.1))
    }
}

impl<'a> Stages<'a> {
    /// Checks that `chain` is a chain (edges go forward, consecutive layers connected).
    pub fn new(
        chain: &'a Chain,
        settings: &'a Settings,
        shards: u64,
    ) -> Result<Stages<'a>, PlacementError> {
        let n = chain.layers.len();
        let width = chain.width;
        if n == 0 {
            return Err(PlacementError::Empty { width });
        }
        let mut incoming: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
        let mut outgoing: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
        for e in &chain.edges {
            if e.from >= e.to || e.to >= n {
                return Err(PlacementError::BackwardEdge {
                    width,
                    from: e.from,
                    to: e.to,
                });
            }
            incoming[e.to].push((e.from, e.bytes / settings.bandwidth));
            outgoing[e.from].push((e.to, e.bytes / settings.bandwidth));
        }
        if let Some(v) = (1..n).find(|&v| !incoming[v].iter().any(|&(u, _)| u == v - 1)) {
            return Err(PlacementError::NotAChain {
                width,
                at: chain.layers[v].id,
            });
        }
        Ok(Stages {
            n,
            width,
            mixed: chain.mixed(),
            state: settings.memory.state_per_parameter_byte(shards),
            chain,
            settings,
            incoming,
            outgoing,
        })
    }

    /// The ranges `[i, j)` for `j` in `i + 1..=end`, in that order, into `out`.
    pub fn row(&self, i: usize, end: usize, out: &mut Vec<Range>) {
        self.row_while(i, end, false, out);
    }

    /// The ranges `[i, j)` that fit in memory as a last stage, `j` from `i + 1` up: a
    /// prefix of the row, because a range's memory only grows with `j` (its parameters,
    /// activations and stash add up) — so are the stages it fits with, [`Range::max_s`],
    /// which only shrink. A large model's row is mostly ranges that fit nowhere; the
    /// program never needs them.
    pub fn fitting_row(&self, i: usize, out: &mut Vec<Range>) {
        self.row_while(i, self.n, true, out);
    }

    fn row_while(&self, i: usize, end: usize, fitting: bool, out: &mut Vec<Range>) {
        out.clear();
        let st = self.settings;
        let layers = &self.chain.layers;
        let end = end.min(self.n);
        let transient = match st.memory {
            MemoryRule::Reference { .. } => 0.0,
            MemoryRule::Megatron(m) => m.transient_bytes,
        };
        let d = st.devices;
        // Heaviest backward paths from i, inside [i, v].
        let mut path = vec![f64::NEG_INFINITY; end.saturating_sub(i)];
        for v in i..end {
            let before = self.incoming[v]
                .iter()
                .filter(|&&(u, _)| u >= i)
                .map(|&(u, _)| path[u - i])
                .fold(if v == i { 0.0 } else { f64::NEG_INFINITY }, f64::max);
            path[v - i] = before + layers[v].backward;
        }
        let mut finish = vec![0.0f64; end.saturating_sub(i)];
        let mut leaving: BinaryHeap<Leaving> = BinaryHeap::new();
        let (mut p, mut a, mut tp, mut fw_part, mut entering) = (0.0, 0.0, false, 0.0, 0.0);
        let mut workspace: f64 = 0.0;
        let mut longest = f64::NEG_INFINITY;
        for j in i + 1..=end {
            let v = j - 1;
            // Forward: v starts when its inputs are in, from inside or across the boundary.
            let mut start = 0.0f64;
            for &(u, c) in &self.incoming[v] {
                start = start.max(if u >= i { finish[u - i] } else { c });
                if u < i {
                    entering += c * st.bandwidth;
                }
            }
            finish[v - i] = start + layers[v].forward;
            let forward = finish[v - i];
            p += layers[v].parameter_bytes;
            a += layers[v].activation_bytes;
            workspace = workspace.max(layers[v].workspace_bytes);
            tp |= layers[v].tensor_parallel;
            fw_part += layers[v].forward;
            // Backward: v joins the range; its edges leave it until j passes their end.
            longest = longest.max(path[v - i]);
            for &(w, c) in &self.outgoing[v] {
                leaving.push(Leaving(path[v - i] + c, w));
            }
            while leaving.peek().is_some_and(|top| top.1 < j) {
                leaving.pop();
            }
            let across = leaving.peek().map_or(f64::NEG_INFINITY, |top| top.0);
            let (constant, stash) = match st.memory {
                MemoryRule::Reference { .. } => {
                    (self.state * p + a, if st.recompute { entering } else { a })
                }
                MemoryRule::Megatron(_) => (self.state * p + a + transient.max(workspace), a),
            };
            let mut range = Range {
                devices: if tp { self.width } else { 1 },
                load_plain: forward + longest.max(across),
                load_recompute: if st.recompute {
                    forward + (fw_part + longest).max(across)
                } else {
                    f64::INFINITY
                },
                params: p,
                constant,
                stash,
                max_s: 0,
            };
            range.max_s = range.stages_within(st.memory_bytes, d);
            if fitting && range.max_s == 0 {
                break;
            }
            out.push(range);
        }
    }

    /// The one range `[i, j)`.
    pub fn range(&self, i: usize, j: usize) -> Range {
        let mut row = Vec::with_capacity(j - i);
        self.row(i, j, &mut row);
        row[j - i - 1]
    }

    /// Peak memory of one device of `r`, `s` stages from the end, with `d` data-parallel
    /// replicas (which only matters with the distributed optimizer).
    pub fn memory_with(&self, r: &Range, s: u64, d: u64, rule: &MemoryRule) -> f64 {
        r.memory(s) + (rule.state_per_parameter_byte(d) - self.state) * r.params
    }
}
