//! The rules of a spec beyond its types: units, ranges, and relations between fields.

use super::raw::RawSpec;
use super::{Ctx, FieldPath, Spec};

/// Largest value of an element count we accept: products of shapes stay exact in f64.
pub(super) const MAX_ELEMENTS: u128 = 1 << 53;
/// Largest number of configurations an axis product may have.
pub(super) const MAX_SPACE: u128 = 4_000_000;

mod cluster;
mod cost_model;
mod estimate;
mod models;
mod rules;
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

/// Checks every section that deserialized; `failed` names those that did not (their
/// problems are already reported), whose rules and cross-checks are skipped.
pub(super) fn validate(
    raw: &RawSpec,
    failed: &[&str],
    ctx: &mut Ctx<'_>,
    source: &str,
) -> Option<Spec> {
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
    let training = if ok("training") {
        training(raw, ctx)
    } else {
        None
    };
    let cluster = if ok("cluster") {
        cluster(raw, ctx)
    } else {
        None
    };
    let models = if ok("models") {
        models(raw, ctx, training.as_ref(), cluster.as_ref())
    } else {
        None
    };
    let space = if ok("search") {
        space(&raw.search, ctx)
    } else {
        None
    };
    let cost_model = if ok("cost_model") {
        cost_model(&raw.cost_model, ctx)
    } else {
        None
    };
    let estimate = if ok("accelerator") && ok("plan") {
        estimate(
            raw,
            ctx,
            models.as_deref(),
            training.as_ref(),
            cluster.as_ref(),
        )
    } else {
        None
    };
    if let (Some(m), Some(t), Some(c), Some(s)) = (&models, &training, &cluster, &space) {
        runnable(ctx, m, t, c, s);
    }
    if !failed.is_empty() {
        return None;
    }
    Some(Spec {
        name: raw.name.clone(),
        description: raw.description.clone(),
        content_hash: blake3::hash(source.as_bytes()).to_hex().to_string(),
        source_file: ctx.file().to_string(),
        source_text: source.to_string(),
        models: models?,
        training: training?,
        cluster: cluster?,
        space: space?,
        cost_model: cost_model?,
        estimate: estimate?,
    })
}
