//! `[cluster]`: devices, the network (one tier, or nodes with two), HBM sizes to try.

use super::rules::{count_in, duplicates, element_at, positive};
use crate::raw::{OneOrMany, RawCluster, RawSpec};
use crate::{Ctx, FieldPath};
use archplace_engine::network::{Network, Tier};
use archplace_engine::training::Cluster;
use archplace_plugin_sdk::gpus;
use archplace_plugin_sdk::units::{format_bytes, parse_bandwidth, parse_bytes, parse_seconds};
/// `[cluster]` as read: each value given or its default (what is wrong reported, and left
/// for the rules relating it to skip, see [`Ctx::fine`]).
pub(super) fn cluster(raw: &RawSpec, ctx: &mut Ctx<'_>) -> Cluster {
    let c = &raw.cluster;
    let path = FieldPath::root().key("cluster");
    let devices = c.devices.unwrap_or(1024);
    count_in(
        ctx,
        &path.key("devices"),
        devices,
        1_000_000,
        &format!("{devices} devices"),
        " devices",
    );
    let (network, mut domains) = match network(raw, ctx, devices) {
        Some((first, all)) => (Some(first), all),
        None => (None, Vec::new()),
    };
    let link = c.link_bandwidth.as_deref().unwrap_or("4 GiB/s");
    let link_bytes_per_second = positive(
        ctx,
        &path.key("link_bandwidth"),
        link,
        parse_bandwidth,
        "the link bandwidth must be above 0 B/s",
        Some("e.g. \"50 GB/s\""),
    )
    .unwrap_or(0.0);
    let preset = c.preset.as_deref().and_then(gpus::system);
    let hbm_text: Vec<String> = c.hbm.clone().unwrap_or_else(|| match preset {
        Some(g) => vec![format_bytes(g.hbm_bytes)],
        None => vec!["32 GiB".into(), "64 GiB".into(), "80 GiB".into()],
    });
    let hbm_path = path.key("hbm");
    // An empty list, unless its elements were taken out for not reading (reported there).
    if hbm_text.is_empty() && ctx.fine(&hbm_path) {
        ctx.error(
            &hbm_path,
            "no HBM size to try",
            Some("list at least one, e.g. [\"80 GiB\"]".into()),
        );
    }
    let mut hbm_bytes = Vec::new();
    for (i, h) in hbm_text.iter().enumerate() {
        if let Some(b) = positive(
            ctx,
            &hbm_path.index(i),
            h,
            parse_bytes,
            "an HBM of 0 bytes cannot hold a model",
            None,
        ) {
            hbm_bytes.push(b);
        }
    }
    duplicates(ctx, &hbm_path, &hbm_bytes);
    let (link_bytes_per_second, mut network) = match network {
        // Two tiers: the placement charges pipeline and data-parallel traffic between nodes.
        Some(n) => (n.inter_node.bytes_per_second, n),
        None => (link_bytes_per_second, Network::flat(link_bytes_per_second)),
    };
    // The link to the host's memory: given, or the preset's.
    let host = match &c.host_bandwidth {
        Some(text) => positive(
            ctx,
            &path.key("host_bandwidth"),
            text,
            parse_bandwidth,
            "a host link of 0 B/s moves nothing",
            Some("e.g. \"63 GB/s\" (PCIe 5.0 x16)"),
        ),
        None => preset.map(|g| g.host_link_bytes_per_second),
    };
    network.host_bytes_per_second = host;
    // Collectives beside computation: any network's (a calibration's factor, mostly).
    let overlap =
        efficiency(ctx, &path, "overlap_efficiency", c.overlap_efficiency, 1.0).unwrap_or(1.0);
    network.overlap_efficiency = overlap;
    for d in &mut domains {
        d.host_bytes_per_second = host;
        d.overlap_efficiency = overlap;
    }
    Cluster {
        devices,
        link_bytes_per_second,
        hbm_bytes,
        network,
        // Several scale-up domain sizes, each a network of its own (the first is `network`).
        domains: if domains.len() > 1 {
            domains
        } else {
            Vec::new()
        },
    }
}

/// The two-tier network of `node_size` and the `intra_node_*`/`inter_node_*` keys, if
/// `node_size` is given (and every problem with them reported): the first size's, and
/// one per size when `node_size` lists several (scale-up domain sizes a search tries,
/// each with its `intra_node_bandwidth` when that is a list too).
fn network(raw: &RawSpec, ctx: &mut Ctx<'_>, devices: u64) -> Option<(Network, Vec<Network>)> {
    let c = &raw.cluster;
    let path = FieldPath::root().key("cluster");
    let efficiency_given = |v: Option<f64>| v.map(|_| String::new());
    let intra_given = c.intra_node_bandwidth.as_ref().map(|_| String::new());
    let tier_keys = [
        ("intra_node_bandwidth", &intra_given),
        ("inter_node_bandwidth", &c.inter_node_bandwidth),
        ("intra_node_latency", &c.intra_node_latency),
        ("inter_node_latency", &c.inter_node_latency),
        (
            "intra_node_efficiency",
            &efficiency_given(c.intra_node_efficiency),
        ),
        (
            "inter_node_efficiency",
            &efficiency_given(c.inter_node_efficiency),
        ),
    ];
    let preset = match &c.preset {
        None => None,
        Some(name) => match gpus::system(name) {
            Some(g) => Some(g),
            None => {
                ctx.error(
                    &path.key("preset"),
                    format!("no GPU preset `{name}`"),
                    Some(format!("presets: {}", gpus::system_names().join(", "))),
                );
                return None;
            }
        },
    };
    let Some((sizes, mut ok)) = node_sizes(ctx, &path, c, preset, devices) else {
        one_tier(ctx, &path, c, &tier_keys);
        return None;
    };
    if c.link_bandwidth.is_some() {
        ctx.mismatch(
            &path.key("link_bandwidth"),
            "with `node_size` (or a preset) the network has two tiers: `link_bandwidth` would be ignored",
            Some("remove it; give `intra_node_bandwidth` and `inter_node_bandwidth`".into()),
        );
        ok = false;
    }
    let intra = intra_bandwidths(
        ctx,
        &path,
        c,
        &sizes,
        preset.map(|g| g.nvlink_bytes_per_second),
    );
    let inter = bandwidth(
        ctx,
        &path,
        "inter_node_bandwidth",
        &c.inter_node_bandwidth,
        preset.map(|g| g.infiniband_bytes_per_second),
        "25 GB/s",
    );
    let intra_latency = latency(
        ctx,
        &path,
        "intra_node_latency",
        &c.intra_node_latency,
        5e-6,
    );
    let inter_latency = latency(
        ctx,
        &path,
        "inter_node_latency",
        &c.inter_node_latency,
        10e-6,
    );
    let intra_efficiency = efficiency(
        ctx,
        &path,
        "intra_node_efficiency",
        c.intra_node_efficiency,
        preset.map_or(1.0, |g| g.nvlink_collective_fraction),
    );
    let inter_efficiency = efficiency(
        ctx,
        &path,
        "inter_node_efficiency",
        c.inter_node_efficiency,
        1.0,
    );
    match (
        ok,
        intra.zip(intra_efficiency),
        inter.zip(inter_efficiency),
        intra_latency,
        inter_latency,
    ) {
        (true, Some((a, ea)), Some((b, eb)), Some(la), Some(lb)) => {
            let all: Vec<Network> = sizes
                .iter()
                .zip(a)
                .map(|(&node_size, a)| Network {
                    node_size,
                    host_bytes_per_second: None,
                    overlap_efficiency: 1.0,
                    // What a device achieves: the link bandwidth times the efficiency.
                    intra_node: Tier {
                        bytes_per_second: a * ea,
                        latency_seconds: la,
                    },
                    inter_node: Tier {
                        bytes_per_second: b * eb,
                        latency_seconds: lb,
                    },
                })
                .collect();
            Some((all[0], all))
        }
        _ => None,
    }
}

/// `node_size`'s sizes (given, or the preset's), each checked against the devices, and
/// whether they are all fine; `None` without `node_size` or a preset (one tier).
fn node_sizes(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    c: &RawCluster,
    preset: Option<&gpus::Gpu>,
    devices: u64,
) -> Option<(Vec<u64>, bool)> {
    let sizes = match &c.node_size {
        Some(given) => given.to_vec(),
        None => match preset {
            Some(g) => vec![g.node_size],
            None => return None,
        },
    };
    let size_path = path.key("node_size");
    let mut ok = true;
    if sizes.is_empty() {
        ctx.error(
            &size_path,
            "no node size to try",
            Some("give one, e.g. 8, or a list of scale-up domain sizes, e.g. [8, 72]".into()),
        );
        ok = false;
    }
    duplicates(ctx, &size_path, &sizes);
    let devices_known = ctx.fine(&path.key("devices"));
    for (i, &node_size) in sizes.iter().enumerate() {
        // Fewer devices than a node holds are part of one node (16 GPUs of a GB200 NVL72
        // rack all on its NVLink); more must fill whole nodes.
        if node_size == 0
            || (devices_known && devices > node_size && !devices.is_multiple_of(node_size))
        {
            ctx.mismatch(
                &element_at(&size_path, c.node_size.as_ref(), i),
                format!(
                    "{node_size} devices per node do not make whole nodes of {devices} devices"
                ),
                Some(format!(
                    "use a divisor of `devices` (or at least {devices}: one node), e.g. 8"
                )),
            );
            ok = false;
        }
    }
    Some((sizes, ok))
}

/// `intra_node_bandwidth` for each node size: one value for all (given, or the preset's),
/// or a list with one per size.
fn intra_bandwidths(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    c: &RawCluster,
    sizes: &[u64],
    preset: Option<f64>,
) -> Option<Vec<f64>> {
    let key = "intra_node_bandwidth";
    match &c.intra_node_bandwidth {
        Some(OneOrMany::Many(list)) => {
            if list.len() != sizes.len() {
                ctx.mismatch(
                    &path.key(key),
                    format!(
                        "{} bandwidths for {} node sizes: a list gives one per size of `node_size`",
                        list.len(),
                        sizes.len()
                    ),
                    Some("give one bandwidth for all sizes, or one per size".into()),
                );
            }
            let mut all = Vec::new();
            for (i, v) in list.iter().enumerate() {
                let at = path.key(key).index(i);
                all.push(positive(
                    ctx,
                    &at,
                    v,
                    parse_bandwidth,
                    "a bandwidth must be above 0 B/s",
                    None,
                ));
            }
            let all: Option<Vec<f64>> = all.into_iter().collect();
            all.filter(|a| a.len() == sizes.len())
        }
        one => {
            let one = match one {
                Some(OneOrMany::One(v)) => Some(v.clone()),
                _ => None,
            };
            let b = bandwidth(ctx, path, key, &one, preset, "300 GB/s")?;
            Some(vec![b; sizes.len()])
        }
    }
}

/// Without `node_size` the network has one tier: each two-tier key given is reported, and
/// its value still read, so that a wrong unit is not left for a later run.
fn one_tier(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    c: &RawCluster,
    tier_keys: &[(&str, &Option<String>)],
) {
    for (key, value) in tier_keys {
        if value.is_some() {
            ctx.mismatch(
                &path.key(key),
                format!("`{key}` needs `node_size`: without it the network has one tier"),
                Some("add `node_size` (devices per node), or use `link_bandwidth`".into()),
            );
        }
    }
    for (i, v) in c
        .intra_node_bandwidth
        .as_ref()
        .map(OneOrMany::to_vec)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let key = path.key("intra_node_bandwidth");
        let at = element_at(&key, c.intra_node_bandwidth.as_ref(), i);
        positive(
            ctx,
            &at,
            v,
            parse_bandwidth,
            "a bandwidth must be above 0 B/s",
            None,
        );
    }
    bandwidth(
        ctx,
        path,
        "inter_node_bandwidth",
        &c.inter_node_bandwidth,
        Some(0.0),
        "",
    );
    latency(ctx, path, "intra_node_latency", &c.intra_node_latency, 0.0);
    latency(ctx, path, "inter_node_latency", &c.inter_node_latency, 0.0);
    efficiency(
        ctx,
        path,
        "intra_node_efficiency",
        c.intra_node_efficiency,
        1.0,
    );
    efficiency(
        ctx,
        path,
        "inter_node_efficiency",
        c.inter_node_efficiency,
        1.0,
    );
}

/// A tier's bandwidth `key` (under `path`): given, or the preset's; missing otherwise.
fn bandwidth(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    key: &str,
    value: &Option<String>,
    preset: Option<f64>,
    example: &str,
) -> Option<f64> {
    match value {
        None if preset.is_some() => preset,
        Some(v) => positive(
            ctx,
            &path.key(key),
            v,
            parse_bandwidth,
            "a bandwidth must be above 0 B/s",
            None,
        ),
        None => {
            ctx.error(
                &path.key(key),
                format!("missing `{key}`: with `node_size`, give both tiers' bandwidths"),
                Some(format!("e.g. {key} = \"{example}\"")),
            );
            None
        }
    }
}

/// A tier's latency `key` (under `path`), below a second; `default` when not given.
fn latency(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    key: &str,
    value: &Option<String>,
    default: f64,
) -> Option<f64> {
    match value {
        None => Some(default),
        Some(v) => match parse_seconds(v) {
            Ok(s) if s < 1.0 => Some(s),
            Ok(_) => {
                ctx.error(
                    &path.key(key),
                    format!("a latency of `{v}` is not plausible"),
                    Some("use less than 1 s, e.g. \"10 us\"".into()),
                );
                None
            }
            Err(e) => {
                ctx.error(&path.key(key), e.message, None);
                None
            }
        },
    }
}

/// A tier's collective efficiency `key` (under `path`): a fraction in (0, 1]; `default`
/// when not given.
fn efficiency(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    key: &str,
    value: Option<f64>,
    default: f64,
) -> Option<f64> {
    match value {
        None => Some(default),
        Some(x) if x > 0.0 && x <= 1.0 => Some(x),
        Some(x) => {
            ctx.error(
                &path.key(key),
                format!("an efficiency of {x} is not a fraction in (0, 1]"),
                Some("e.g. 0.8: collectives achieve 80% of the link bandwidth".into()),
            );
            None
        }
    }
}
