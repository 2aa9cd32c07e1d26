//! Whether a search can propose any plan at all: with `[search] use_all_devices` (the
//! default) every plan has `t × p × d` = the cluster's devices and the global batch split
//! evenly over the replicas, and a device count with few divisors can leave no plan for a
//! model — which the search would only report as "does not fit in any HBM size". Checked
//! here, with the numbers, before any work.

use super::models::Entry;
use crate::{Ctx, FieldPath, ModelSpec};
use archplace_engine::training::{Cluster, Training};

/// Reports each model no plan of which uses every device (at any width, micro-batch,
/// number of stages up to its layers, and replicas that split the batch evenly): for the
/// models that are fine, when the device count and the batch are.
pub(super) fn runnable(
    ctx: &mut Ctx<'_>,
    models: &[Entry],
    training: &Training,
    cluster: &Cluster,
) {
    let t = FieldPath::root().key("training");
    let devices = FieldPath::root().key("cluster").key("devices");
    if !ctx.all_fine(&[devices, t.key("global_batch"), t.key("micro_batch_sizes")]) {
        return;
    }
    let n = cluster.devices;
    for e in models {
        let m = &e.spec;
        if !ctx.fine(&FieldPath::root().key("models").index(e.index)) {
            continue;
        }
        if !has_plan(m, training, n) {
            ctx.mismatch(
                &FieldPath::root().key("cluster").key("devices"),
                format!(
                    "no plan of {} uses all {n} devices: t × CP × p × d = {n} needs a width t in {:?} (times a context-parallel size) dividing it, at most {} pipeline stages, and d replicas dividing the {} micro-batches of every micro-batch size tried",
                    m.config.name,
                    m.config.tensor_parallel_widths(),
                    m.config.layers + 2,
                    training.global_batch,
                ),
                Some("set [search] use_all_devices = false (devices may stay idle), or a device count with more divisors".into()),
            );
        }
    }
}

/// Whether some (t, CP, p, d, micro-batch) uses all `devices`.
fn has_plan(m: &ModelSpec, training: &Training, devices: u64) -> bool {
    let stages = m.config.layers.saturating_add(2);
    let contexts = training.context_parallel_choices(&m.config, devices);
    m.config
        .tensor_parallel_widths()
        .into_iter()
        .flat_map(|t| contexts.iter().map(move |&cp| t.saturating_mul(cp)))
        .filter(|&t| t > 0 && devices.is_multiple_of(t))
        .any(|t| {
            let rest = devices / t;
            training.micro_batch_sizes.iter().any(|&b| {
                let micro_batches = training.global_batch / b.max(1);
                divisors(rest).any(|d| micro_batches.is_multiple_of(d) && rest / d <= stages)
            })
        })
}

/// The divisors of `n` (n ≥ 1), in no particular order.
fn divisors(n: u64) -> impl Iterator<Item = u64> {
    (1..)
        .take_while(move |k| *k <= n / *k)
        .filter(move |k| n.is_multiple_of(*k))
        .flat_map(move |k| [k, n / k])
}
