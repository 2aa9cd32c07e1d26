//! `[training]`: batch, recomputation, precision, optimizer, distributed optimizer and the
//! memory model.

use super::rules::{count_in, duplicates};
use crate::spec::raw::RawSpec;
use crate::spec::{Ctx, FieldPath};
use archplace_engine::training::{MemoryModel, Optimizer, Precision, Recomputation, Training};
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
    let memory_model = t.memory_model.unwrap_or(MemoryModel::Megatron);
    let activation_recomputation: Vec<Recomputation> = match &t.activation_recomputation {
        Some(list) => list.iter().map(|r| r.value()).collect(),
        None => vec![Recomputation::None, Recomputation::Full],
    };
    let rec_path = path.key("activation_recomputation");
    if activation_recomputation.is_empty() {
        ctx.error(
            &rec_path,
            "no recomputation choice to try",
            Some("list at least one of \"none\", \"selective\", \"full\"".into()),
        );
        ok = false;
    }
    duplicates(ctx, &rec_path, &activation_recomputation);
    if memory_model == MemoryModel::Reference {
        for (i, r) in activation_recomputation.iter().enumerate() {
            if *r == Recomputation::Selective {
                ctx.error(
                    &rec_path.index(i),
                    "the reference memory model has no selective recomputation",
                    Some("use memory_model = \"megatron\", or \"none\"/\"full\"".into()),
                );
                ok = false;
            }
        }
    }
    let precisions = match &t.precision {
        Some(p) => p.to_vec(),
        None => vec![Precision::Bf16Mixed],
    };
    let precision_path = path.key("precision");
    if precisions.is_empty() {
        ctx.error(
            &precision_path,
            "no precision to try",
            Some("e.g. \"bf16-mixed\"".into()),
        );
        ok = false;
    }
    duplicates(ctx, &precision_path, &precisions);
    if memory_model == MemoryModel::Reference && t.precision.is_some() {
        ctx.error(
            &precision_path,
            "the reference memory model counts `bytes_per_element`, not a precision",
            Some("remove `precision`, or use memory_model = \"megatron\"".into()),
        );
        ok = false;
    }
    let distributed_optimizer = match &t.distributed_optimizer {
        Some(d) => d.to_vec(),
        None => vec![false],
    };
    let dist_path = path.key("distributed_optimizer");
    if distributed_optimizer.is_empty() {
        ctx.error(
            &dist_path,
            "no choice to try",
            Some("use false, true or [false, true]".into()),
        );
        ok = false;
    }
    duplicates(ctx, &dist_path, &distributed_optimizer);
    if memory_model == MemoryModel::Reference && distributed_optimizer.contains(&true) {
        ctx.error(
            &dist_path,
            "the reference memory model has no distributed optimizer",
            Some("use memory_model = \"megatron\"".into()),
        );
        ok = false;
    }
    let sequence_parallel = match &t.sequence_parallel {
        Some(d) => d.to_vec(),
        None => vec![false],
    };
    let sp_path = path.key("sequence_parallel");
    if sequence_parallel.is_empty() {
        ctx.error(
            &sp_path,
            "no choice to try",
            Some("use false, true or [false, true]".into()),
        );
        ok = false;
    }
    duplicates(ctx, &sp_path, &sequence_parallel);
    if memory_model == MemoryModel::Reference && sequence_parallel.contains(&true) {
        ctx.error(
            &sp_path,
            "the reference memory model has no sequence parallelism",
            Some("use memory_model = \"megatron\"".into()),
        );
        ok = false;
    }
    let bytes_per_element = t.bytes_per_element.unwrap_or(2);
    let bpe_path = path.key("bytes_per_element");
    if ![1, 2, 4].contains(&bytes_per_element) {
        ctx.error(
            &bpe_path,
            format!("{bytes_per_element} bytes per element is not supported"),
            Some("use 1, 2 (fp16/bf16) or 4 (fp32)".into()),
        );
        ok = false;
    } else if memory_model == MemoryModel::Megatron && t.bytes_per_element.is_some() {
        // The precision sets the element size; an explicit one must agree with every
        // precision listed.
        if let Some(p) = precisions
            .iter()
            .find(|p| p.element_bytes() != bytes_per_element)
        {
            ctx.error(
                &bpe_path,
                format!(
                    "{bytes_per_element} bytes per element contradicts precision {} ({} bytes)",
                    p.name(),
                    p.element_bytes()
                ),
                Some("remove `bytes_per_element`: the precision sets it".into()),
            );
            ok = false;
        }
    }
    let optimizer = t.optimizer.unwrap_or(match memory_model {
        MemoryModel::Megatron => Optimizer::Adam,
        MemoryModel::Reference => Optimizer::Sgd,
    });
    ok.then_some(Training {
        global_batch,
        micro_batch_sizes,
        activation_recomputation,
        optimizer,
        precisions,
        distributed_optimizer,
        sequence_parallel,
        memory_model,
        bytes_per_element,
    })
}
