//! `[cluster]`: devices, link bandwidth, HBM sizes to try.

use super::rules::{count_in, duplicates, positive};
use crate::spec::raw::RawSpec;
use crate::spec::{Ctx, FieldPath};
use archplace_engine::training::Cluster;
use archplace_plugin_sdk::units::{parse_bandwidth, parse_bytes};
pub(super) fn cluster(raw: &RawSpec, ctx: &mut Ctx<'_>) -> Option<Cluster> {
    let c = &raw.cluster;
    let path = FieldPath::root().key("cluster");
    let mut ok = true;
    let devices = c.devices.unwrap_or(1024);
    ok &= count_in(
        ctx,
        &path.key("devices"),
        devices,
        1_000_000,
        &format!("{devices} devices"),
        " devices",
    );
    let link = c.link_bandwidth.as_deref().unwrap_or("4 GiB/s");
    let link_bytes_per_second = positive(
        ctx,
        &path.key("link_bandwidth"),
        link,
        parse_bandwidth,
        "the link bandwidth must be above 0 B/s",
        Some("e.g. \"50 GB/s\""),
    )
    .unwrap_or_else(|| {
        ok = false;
        0.0
    });
    let hbm_text: Vec<String> = c
        .hbm
        .clone()
        .unwrap_or_else(|| vec!["32 GiB".into(), "64 GiB".into(), "80 GiB".into()]);
    let hbm_path = path.key("hbm");
    if hbm_text.is_empty() {
        ctx.error(
            &hbm_path,
            "no HBM size to try",
            Some("list at least one, e.g. [\"80 GiB\"]".into()),
        );
        ok = false;
    }
    let mut hbm_bytes = Vec::new();
    for (i, h) in hbm_text.iter().enumerate() {
        match positive(
            ctx,
            &hbm_path.index(i),
            h,
            parse_bytes,
            "an HBM of 0 bytes cannot hold a model",
            None,
        ) {
            Some(b) => hbm_bytes.push(b),
            None => ok = false,
        }
    }
    duplicates(ctx, &hbm_path, &hbm_bytes);
    ok.then_some(Cluster {
        devices,
        link_bytes_per_second,
        hbm_bytes,
    })
}
