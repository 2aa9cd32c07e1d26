//! The network between the devices: tiers (inside a node, between nodes) and the time of a
//! ring collective over a group of ranks. An input of the search and of the step model
//! (`[cluster]`), below every computation that uses it.

use serde::{Deserialize, Serialize};

/// One tier of the network: what a device sends per second and the latency of a message.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tier {
    pub bytes_per_second: f64,
    pub latency_seconds: f64,
}

/// A two-tier network: `node_size` devices per node on the intra-node tier (NVLink-class),
/// nodes connected by the inter-node tier (one NIC per device).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Network {
    /// Devices per node; `u64::MAX` for one tier (written `null` in JSON: no sentinel
    /// numbers in what users read).
    #[serde(with = "one_tier_as_null")]
    pub node_size: u64,
    pub intra_node: Tier,
    pub inter_node: Tier,
    /// What a device moves to or from its host's memory per second, one direction (PCIe,
    /// NVLink-C2C): activation offloading's link. `None`: not known (a spec without a GPU
    /// preset or `host_bandwidth`), and nothing may be offloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_bytes_per_second: Option<f64>,
    /// The share of the computation's time in which a collective overlapped with it
    /// moves at its rate alone (ZeRO's prefetched gathers and its reductions, the
    /// data-parallel synchronisation hidden behind backward; tensor parallelism's
    /// overlaps, which the layer's schedule prices from
    /// [`crate::execution::Execution::overlap_efficiency`]): NCCL's kernels run on the SMs
    /// and through the HBM the GEMMs beside them use, and the GEMMs on theirs, so a
    /// collective hidden behind `c` seconds of computation moves what it moves alone in
    /// `overlap_efficiency × c`, the rest after. 1: as fast beside computation as alone.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub overlap_efficiency: f64,
}

fn one() -> f64 {
    1.0
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

impl Network {
    /// One tier for everything (a spec without `node_size`).
    pub fn flat(bytes_per_second: f64) -> Network {
        let tier = Tier {
            bytes_per_second,
            latency_seconds: 0.0,
        };
        Network {
            node_size: u64::MAX,
            intra_node: tier,
            inter_node: tier,
            host_bytes_per_second: None,
            overlap_efficiency: 1.0,
        }
    }

    /// What of `traffic` seconds of collectives (their time alone) stays exposed when they
    /// overlap `computation` seconds: what the computation's time, at
    /// `overlap_efficiency` of their rate alone, does not move.
    pub fn exposed_beside(&self, traffic: f64, computation: f64) -> f64 {
        (traffic - self.overlap_efficiency * computation).max(0.0)
    }

    /// The tier a group of `span` consecutive ranks communicates on.
    pub fn tier(&self, span: u64) -> Tier {
        if span <= self.node_size {
            self.intra_node
        } else {
            self.inter_node
        }
    }

    /// Seconds of a ring collective moving `passes × (n − 1)/n × bytes` per device over a
    /// group of `n` ranks spaced `stride` apart, with `passes` latency rounds of `n − 1`
    /// steps; hierarchical when the group spans nodes (inside each node over the `k` ranks
    /// there, then between nodes with `1/k` of the bytes).
    pub fn ring_seconds(&self, bytes: f64, passes: f64, n: u64, stride: u64) -> f64 {
        if n <= 1 || bytes <= 0.0 {
            return 0.0;
        }
        let flat = |tier: Tier, n: u64, bytes: f64| {
            let nf = n as f64;
            passes
                * ((nf - 1.0) / nf * bytes / tier.bytes_per_second
                    + (nf - 1.0) * tier.latency_seconds)
        };
        let span = n.saturating_mul(stride.max(1));
        if span <= self.node_size {
            return flat(self.intra_node, n, bytes);
        }
        // Ranks of the group inside one node, and the nodes it spans.
        let k = (self.node_size / stride.max(1)).clamp(1, n);
        let nodes = n.div_ceil(k);
        flat(self.intra_node, k, bytes) + flat(self.inter_node, nodes, bytes / k as f64)
    }
}

impl Network {
    /// Seconds of one step of a ring over `n` ranks spaced `stride` apart in which every
    /// rank sends `bytes` to the next one and receives as much from the previous one, all
    /// at once (ring attention's exchange of keys and values): one message on the slowest
    /// hop, which crosses nodes when the ring spans them.
    pub fn ring_step_seconds(&self, bytes: f64, n: u64, stride: u64) -> f64 {
        if n <= 1 || bytes <= 0.0 {
            return 0.0;
        }
        let tier = self.tier(n.saturating_mul(stride.max(1)));
        bytes / tier.bytes_per_second + tier.latency_seconds
    }

    /// Seconds of an all-to-all over a group of `n` ranks spaced `stride` apart, each rank
    /// holding a buffer of `bytes` of which `1/n` goes to every rank: it sends (and
    /// receives) `(n − 1)/n` of it, every message posted at once (NCCL's grouped sends and
    /// receives), so one latency per tier. When the group spans nodes, the share for the
    /// `k − 1` other ranks of its own node crosses the intra-node tier while the share for
    /// the `n − k` ranks elsewhere crosses the inter-node tier (the device's NIC), at once:
    /// the slower of the two bounds it.
    pub fn all_to_all_seconds(&self, bytes: f64, n: u64, stride: u64) -> f64 {
        if n <= 1 || bytes <= 0.0 {
            return 0.0;
        }
        let nf = n as f64;
        let part = |tier: Tier, peers: f64| {
            if peers <= 0.0 {
                0.0
            } else {
                peers / nf * bytes / tier.bytes_per_second + tier.latency_seconds
            }
        };
        if n.saturating_mul(stride.max(1)) <= self.node_size {
            return part(self.intra_node, nf - 1.0);
        }
        let k = (self.node_size / stride.max(1)).clamp(1, n) as f64;
        part(self.intra_node, k - 1.0).max(part(self.inter_node, nf - k))
    }
}

/// `node_size` in JSON: `null` for one tier (`u64::MAX` inside).
mod one_tier_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(node_size: &u64, s: S) -> Result<S::Ok, S::Error> {
        if *node_size == u64::MAX {
            s.serialize_none()
        } else {
            s.serialize_some(node_size)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.unwrap_or(u64::MAX))
    }
}
