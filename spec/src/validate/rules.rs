//! Rules shared by the sections: one helper per kind of check, so that a rule reads the
//! same (and reports the same way) wherever it applies.

use crate::raw::OneOrMany;
use crate::{Ctx, FieldPath};
use archplace_engine::training::{Fp8Scaling, Recomputation, RecomputeModule, RecomputeModules};
use archplace_plugin_sdk::text::thousands;
use archplace_plugin_sdk::units::UnitError;

/// Reports every value of `values` that repeats an earlier one.
pub(super) fn duplicates<T: PartialEq + std::fmt::Debug>(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    values: &[T],
) {
    repeated(ctx, path, values, (|v| format!("{v:?}"), "value"));
}

/// [`duplicates`], each value shown by `shown` and the help naming the values `what`.
fn repeated<T: PartialEq>(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    values: &[T],
    (shown, what): (impl Fn(&T) -> String, &str),
) {
    for (i, v) in values.iter().enumerate() {
        if values[..i].contains(v) {
            ctx.error(
                &path.index(i),
                format!("{} is listed twice", shown(v)),
                Some(format!("list each {what} once")),
            );
        }
    }
}

/// Parses `text` with `parse` (a unit parser) and requires a value above zero; reports the
/// parser's message or `zero` at `path`.
pub(super) fn positive<T: PartialOrd + Default>(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    text: &str,
    parse: fn(&str) -> Result<T, UnitError>,
    zero: &str,
    help: Option<&str>,
) -> Option<T> {
    match parse(text) {
        Ok(v) if v > T::default() => Some(v),
        Ok(_) => {
            ctx.error(path, zero, help.map(str::to_string));
            None
        }
        Err(e) => {
            ctx.error(path, e.message, None);
            None
        }
    }
}

/// A count that must lie in `1..=max`: reports `label` (e.g. "0 devices") and the range
/// (`use 1 to 1,000,000 devices`). False when out of range.
pub(super) fn count_in(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    value: u64,
    max: u64,
    label: &str,
    unit: &str,
) -> bool {
    if (1..=max).contains(&value) {
        return true;
    }
    ctx.error(
        path,
        format!("{label} is out of range"),
        Some(format!("use 1 to {}{unit}", thousands(max))),
    );
    false
}

/// `context_parallel_overlap` (at `at`, given or not) overlaps ring attention's steps with
/// their transfers: refused with another exchange `method`, which has none.
pub(super) fn ring_overlap(
    ctx: &mut Ctx<'_>,
    at: &FieldPath,
    method: archplace_engine::training::ContextMethod,
    given: bool,
) {
    if given && method != archplace_engine::training::ContextMethod::Ring {
        ctx.mismatch(
            at,
            format!(
                "context_parallel_overlap overlaps ring attention's steps with their transfers; context_parallel_exchange is \"{}\", which is not overlapped",
                method.name()
            ),
            Some("leave `context_parallel_overlap` out with the all-gather or the all-to-all, or use the ring".into()),
        );
    }
}

/// Where element `i` of a value given as one or a list was written: its index in a list,
/// the key itself for one value.
pub(super) fn element_at<T>(at: &FieldPath, given: Option<&OneOrMany<T>>, i: usize) -> FieldPath {
    match given {
        Some(OneOrMany::Many(_)) => at.index(i),
        _ => at.clone(),
    }
}

/// The FP8 recipe a table gives and the key it is under: `fp8_recipe`, or its older name
/// `fp8_scaling` ([`given_recipe`]); both given is a mistake (located at the older name).
pub(super) fn fp8_recipe(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    recipe: Option<Fp8Scaling>,
    scaling: Option<Fp8Scaling>,
) -> Option<(Fp8Scaling, &'static str)> {
    if recipe.is_some() && scaling.is_some() {
        ctx.mismatch(
            &path.key("fp8_scaling"),
            "fp8_scaling is fp8_recipe's older name; both are given",
            Some("keep `fp8_recipe` only".into()),
        );
    }
    let key = if recipe.is_some() {
        "fp8_recipe"
    } else {
        "fp8_scaling"
    };
    given_recipe(recipe, scaling).map(|r| (r, key))
}

/// The FP8 recipe a table gives: `fp8_recipe`, else its older name `fp8_scaling`.
pub(super) fn given_recipe(
    recipe: Option<Fp8Scaling>,
    scaling: Option<Fp8Scaling>,
) -> Option<Fp8Scaling> {
    recipe.or(scaling)
}

/// `recompute_modules` (of `[training]`, or of `[plan]` at `path` when `plan` gives its
/// recomputation): a list of distinct modules, given only where selective recomputation
/// runs (`selective`), else a mismatch; left out, the attention core.
pub(super) fn recompute_modules(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    given: Option<&[RecomputeModule]>,
    (selective, plan): (bool, Option<Recomputation>),
) -> RecomputeModules {
    let Some(list) = given else {
        return RecomputeModules::default();
    };
    if list.is_empty() {
        ctx.error(
            path,
            "no module to recompute",
            Some("name at least one of \"core_attn\", \"layernorm\", \"mlp\", \"moe\", \"moe_act\", \"shared_experts\", \"mla_up_proj\", or leave the key out".into()),
        );
    }
    repeated(ctx, path, list, (|m| format!("\"{}\"", m.name()), "module"));
    if !selective && ctx.fine(path) {
        let (message, help) = match plan {
            Some(r) => (
                format!(
                    "recompute_modules says what selective recomputation runs again; the plan's recomputation is \"{}\"",
                    r.name()
                ),
                "use recomputation = \"selective\", or leave `recompute_modules` out",
            ),
            None => (
                "recompute_modules says what selective recomputation runs again, and no plan here recomputes selectively".to_string(),
                "add \"selective\" to the recomputation choices, or leave `recompute_modules` out",
            ),
        };
        ctx.mismatch(path, message, Some(help.into()));
    }
    RecomputeModules::of(list.iter().copied())
}
