//! `[training]`: batch, sequence, precision, optimizer, the baseline strategy.

use super::rules::{count_in, duplicates};
use crate::spec::raw::RawSpec;
use crate::spec::{Ctx, FieldPath};
use archplace_engine::training::{Optimizer, Training};
pub(super) fn training(raw: &RawSpec, ctx: &mut Ctx<'_>) -> Option<Training> {
    let t = &raw.training;
    let path = FieldPath::root().key("training");
    let mut ok = true;
    let global_batch = t.global_batch.unwrap_or(4096);
    ok &= count_in(
        ctx,
        &path.key("global_batch"),
        global_batch,
        1 << 24,
        &format!("global batch {global_batch}"),
        " samples",
    );
    let micro_batch_sizes = t.micro_batch_sizes.clone().unwrap_or_else(|| vec![1]);
    let mbs_path = path.key("micro_batch_sizes");
    if micro_batch_sizes.is_empty() {
        ctx.error(
            &mbs_path,
            "no micro-batch size to try",
            Some("list at least one, e.g. [1, 2, 4]".into()),
        );
        ok = false;
    }
    for (i, &b) in micro_batch_sizes.iter().enumerate() {
        if b == 0 || (global_batch > 0 && !global_batch.is_multiple_of(b)) {
            let divisors: Vec<String> = (1..=global_batch.min(1 << 16))
                .filter(|d| global_batch.is_multiple_of(*d))
                .take(12)
                .map(|d| d.to_string())
                .collect();
            ctx.error(
                &mbs_path.index(i),
                format!("micro-batch size {b} does not divide the global batch {global_batch}"),
                Some(format!(
                    "divisors of {global_batch}: {}, ...",
                    divisors.join(", ")
                )),
            );
            ok = false;
        }
    }
    duplicates(ctx, &mbs_path, &micro_batch_sizes);
    let activation_recomputation = t
        .activation_recomputation
        .clone()
        .unwrap_or_else(|| vec![false, true]);
    let rec_path = path.key("activation_recomputation");
    if activation_recomputation.is_empty() {
        ctx.error(
            &rec_path,
            "no recomputation choice to try",
            Some("use [false], [true] or [false, true]".into()),
        );
        ok = false;
    }
    duplicates(ctx, &rec_path, &activation_recomputation);
    let bytes_per_element = t.bytes_per_element.unwrap_or(2);
    if ![1, 2, 4].contains(&bytes_per_element) {
        ctx.error(
            &path.key("bytes_per_element"),
            format!("{bytes_per_element} bytes per element is not supported"),
            Some("use 1, 2 (fp16/bf16) or 4 (fp32)".into()),
        );
        ok = false;
    }
    ok.then(|| Training {
        global_batch,
        micro_batch_sizes,
        activation_recomputation,
        optimizer: t.optimizer.unwrap_or(Optimizer::Sgd),
        bytes_per_element,
    })
}
