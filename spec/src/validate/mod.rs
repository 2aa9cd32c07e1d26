//! The rules of a spec beyond its types: units, ranges, and relations between fields.

use super::raw::RawSpec;
use super::{CostModelSpec, Ctx, FieldPath, Spec};
use archplace_engine::execution::Fraction;

/// Largest value of an element count we accept: products of shapes stay exact in f64.
pub(super) const MAX_ELEMENTS: u128 = 1 << 53;
/// Largest number of configurations an axis product may have.
pub(super) const MAX_SPACE: u128 = 4_000_000;

// In their order: each imports only those before it (ARCHITECTURE.md, invariant 19; a
// tidy test checks it). One per group: rustfmt would sort consecutive declarations.
mod rules;

mod cluster;

mod cost_model;

mod models;

mod estimate;

mod runnable;

mod space;

mod training;

use cluster::cluster;
use cost_model::cost_model;
pub(crate) use cost_model::cost_model_errors;
use estimate::estimate;
use models::models;
use runnable::runnable;
use space::space;
use training::training;

/// Checks every section; `failed` names those that could not be read at all (their
/// problems are already reported). The spec, when nothing at all was reported (the caller
/// checks that no diagnostic was).
pub(super) fn validate(
    raw: &RawSpec,
    failed: &[&str],
    ctx: &mut Ctx<'_>,
    source: &str,
) -> (Option<Spec>, Option<CostModelSpec>) {
    let root = FieldPath::root();
    let ok = |k: &str| !failed.contains(&k);
    if ok("schema_version") && raw.schema_version != 1 {
        ctx.error(
            &root.key("schema_version"),
            format!("unsupported schema_version {}", raw.schema_version),
            Some("this archplace reads schema_version = 1".into()),
        );
    }
    if ok("name")
        && (raw.name.is_empty()
            || raw.name.len() > 100
            || raw.name.starts_with('.')
            || !raw
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        ctx.error(
            &root.key("name"),
            format!("`{}` cannot name a search", raw.name),
            Some("use 1 to 100 letters, digits, `-`, `_` or `.`, not starting with `.` (it names the results folder)".into()),
        );
    }
    // Every section is checked, also one that could not be read (it stands as its default,
    // its fields unknown: the rules that would relate them skip them, see `Ctx::fine`).
    let mut training = training(raw, ctx);
    let cluster = cluster(raw, ctx);
    // The layers' overlapped collectives are priced where their schedules are built.
    training.execution.overlap_efficiency = Fraction(cluster.network.overlap_efficiency);
    let models = models(raw, ctx, &training, &cluster);
    let space = space(&raw.search, ctx);
    let cost_model = cost_model(&raw.cost_model, ctx);
    let estimate = estimate(raw, ctx, &models, &training, &cluster);
    let use_all_devices = raw.search.use_all_devices.unwrap_or(true);
    if use_all_devices && ctx.fine(&root.key("search").key("use_all_devices")) {
        runnable(ctx, &models, &training, &cluster);
    }
    // The cost models named, when `[cost_model]` is fine: resolved even when something
    // else is wrong, so that their problems come in the same run.
    let cost_model = cost_model.filter(|_| ctx.fine(&root.key("cost_model")));
    if !failed.is_empty() || models.len() != raw.models.len() {
        return (None, cost_model);
    }
    let (Some(space), Some(cost_model_spec), Some(estimate)) =
        (space, cost_model.clone(), estimate)
    else {
        return (None, cost_model);
    };
    let models = models.into_iter().map(|e| e.spec).collect();
    let spec = Spec {
        name: raw.name.clone(),
        description: raw.description.clone(),
        content_hash: blake3::hash(source.as_bytes()).to_hex().to_string(),
        source_file: ctx.file().to_string(),
        source_text: source.to_string(),
        models,
        stack: raw.training.stack.clone(),
        stack_calibration: None,
        training,
        cluster,
        space,
        cost_model: cost_model_spec,
        estimate,
    };
    (Some(spec), cost_model)
}
