//! `[search]`: the architecture axes, the area budget, convergence and schedule settings.

use super::MAX_SPACE;
use super::rules::{count_in, duplicates, positive};
use crate::raw::{RawAreaBudget, RawAxis, RawSearch};
use crate::{Ctx, FieldPath};
use archplace_engine::search::Strategy;
use archplace_engine::space::{AreaBudget, SpaceSpec};
use archplace_plugin_sdk::AcceleratorConfig;
use archplace_plugin_sdk::units::{parse_area_um2, parse_bytes};

/// The most branch-and-bound nodes a spec may give one layer-schedule MIP: HiGHS counts
/// them in a 32-bit integer, and a million already takes minutes per layer.
const MAX_SCHEDULE_NODE_LIMIT: u64 = archplace_engine::options::MAX_NODE_LIMIT;

fn axis_u32(
    ctx: &mut Ctx<'_>,
    path: &FieldPath,
    axis: &Option<RawAxis<u32>>,
    default: Vec<u32>,
) -> Option<Vec<u32>> {
    let values = match axis {
        None => return Some(default),
        Some(RawAxis::List(v)) => v.clone(),
        Some(RawAxis::Range(r)) => {
            if r.min == 0 || r.min > r.max || !r.min.is_power_of_two() || !r.max.is_power_of_two() {
                ctx.error(
                    path,
                    format!(
                        "{{ min = {}, max = {} }} is not a range of powers of two",
                        r.min, r.max
                    ),
                    Some(
                        "min and max are powers of two with min ≤ max, e.g. { min = 1, max = 64 }"
                            .into(),
                    ),
                );
                return None;
            }
            (r.min.trailing_zeros()..=r.max.trailing_zeros())
                .map(|l| 1 << l)
                .collect()
        }
    };
    if values.is_empty() && ctx.fine(path) {
        ctx.error(
            path,
            "an empty axis leaves nothing to search",
            Some("list at least one value".into()),
        );
        return None;
    }
    let mut ok = true;
    for (i, &v) in values.iter().enumerate() {
        ok &= count_in(
            ctx,
            &path.index(i),
            u64::from(v),
            1 << 20,
            &v.to_string(),
            "",
        );
    }
    duplicates(ctx, path, &values);
    ok.then_some(values)
}

pub(super) fn space(s: &RawSearch, ctx: &mut Ctx<'_>) -> Option<SpaceSpec> {
    let path = FieldPath::root().key("search");
    let d = SpaceSpec::default();
    let tensor_cores = axis_u32(
        ctx,
        &path.key("tensor_cores"),
        &s.tensor_cores,
        d.tensor_cores.clone(),
    );
    let vector_cores = axis_u32(
        ctx,
        &path.key("vector_cores"),
        &s.vector_cores,
        d.vector_cores.clone(),
    );
    let width = axis_u32(ctx, &path.key("width"), &s.width, d.width.clone());
    let depth = axis_u32(ctx, &path.key("depth"), &s.depth, d.depth.clone());
    let vector_width = match &s.vector_width {
        None => Some(None),
        Some(_) => axis_u32(ctx, &path.key("vector_width"), &s.vector_width, Vec::new()).map(Some),
    };
    let buffer_bytes = buffer_axis(ctx, &path.key("buffer"), &s.buffer, &d.buffer_bytes);
    let area_budget = area_budget(
        ctx,
        &path.key("area_budget"),
        &s.area_budget,
        &d.area_budget,
    );
    let Scalars {
        min_area_fraction,
        bucket_um2,
        schedule_gap,
        schedule_time_limit_seconds,
        schedule_node_limit,
        convergence_window,
        ok: scalars_ok,
    } = scalars(ctx, &path, s, &d);
    let strategy = strategy(ctx, &path, s);
    let (
        tensor_cores,
        vector_cores,
        width,
        depth,
        vector_width,
        buffer_bytes,
        area_budget,
        bucket_um2,
    ) = (
        tensor_cores?,
        vector_cores?,
        width?,
        depth?,
        vector_width?,
        buffer_bytes?,
        area_budget?,
        bucket_um2?,
    );
    let size = [
        tensor_cores.len(),
        vector_cores.len(),
        width.len(),
        depth.len(),
        vector_width.as_ref().map_or(1, Vec::len),
        buffer_bytes.len(),
    ]
    .iter()
    .map(|&n| n as u128)
    .product::<u128>();
    if size > MAX_SPACE {
        ctx.error(
            &path,
            format!("the axes make {size} configurations"),
            Some(format!("narrow them to at most {MAX_SPACE}")),
        );
        return None;
    }
    if !scalars_ok {
        return None;
    }
    Some(SpaceSpec {
        objective: s.objective.unwrap_or_default(),
        tensor_cores,
        vector_cores,
        width,
        depth,
        vector_width,
        buffer_bytes,
        area_budget,
        min_area_fraction,
        single_core_exempt: s.single_core_exempt.unwrap_or(d.single_core_exempt),
        bucket_um2,
        convergence_window,
        strategy,
        use_all_devices: s.use_all_devices.unwrap_or(d.use_all_devices),
        plot_colour_by: s.plot_colour_by,
        schedule_gap,
        schedule_node_limit,
        schedule_time_limit_seconds,
    })
}

/// `buffer`: a list of sizes, or a range of powers of two.
fn buffer_axis(
    ctx: &mut Ctx<'_>,
    bp: &FieldPath,
    axis: &Option<RawAxis<String>>,
    default: &[u64],
) -> Option<Vec<u64>> {
    match axis {
        None => Some(default.to_vec()),
        Some(RawAxis::List(v)) if v.is_empty() => {
            // Unless its elements were taken out for not reading (reported there).
            if ctx.fine(bp) {
                ctx.error(
                    bp,
                    "an empty axis leaves nothing to search",
                    Some("list at least one size, e.g. [\"64 MiB\"]".into()),
                );
            }
            None
        }
        Some(RawAxis::List(v)) => {
            let parsed: Vec<Option<u64>> = v
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    positive(
                        ctx,
                        &bp.index(i),
                        t,
                        parse_bytes,
                        "a buffer of 0 bytes",
                        None,
                    )
                })
                .collect();
            let parsed: Option<Vec<u64>> = parsed.into_iter().collect();
            if let Some(p) = &parsed {
                duplicates(ctx, bp, p);
            }
            parsed
        }
        Some(RawAxis::Range(r)) => match (parse_bytes(&r.min), parse_bytes(&r.max)) {
            (Ok(lo), Ok(hi))
                if lo > 0 && lo <= hi && lo.is_power_of_two() && hi.is_power_of_two() =>
            {
                Some(
                    (lo.trailing_zeros()..=hi.trailing_zeros())
                        .map(|l| 1u64 << l)
                        .collect(),
                )
            }
            (Err(e), _) => {
                ctx.error(&bp.key("min"), e.message, None);
                None
            }
            (_, Err(e)) => {
                ctx.error(&bp.key("max"), e.message, None);
                None
            }
            _ => {
                ctx.error(
                    bp,
                    "not a range of powers of two",
                    Some("e.g. { min = \"2 MiB\", max = \"128 MiB\" }".into()),
                );
                None
            }
        },
    }
}

/// `area_budget`: an area, or the area of a reference configuration.
fn area_budget(
    ctx: &mut Ctx<'_>,
    ap: &FieldPath,
    budget: &Option<RawAreaBudget>,
    default: &AreaBudget,
) -> Option<AreaBudget> {
    match budget {
        None => Some(default.clone()),
        Some(RawAreaBudget::Area(text)) => {
            positive(ctx, ap, text, parse_area_um2, "an area budget of 0", None)
                .map(AreaBudget::Um2)
        }
        Some(RawAreaBudget::Config(c)) => {
            let r = &c.reference_config;
            let cp = ap.key("reference_config");
            match parse_bytes(&r.buffer) {
                Ok(buffer_bytes) => Some(AreaBudget::ReferenceConfig(AcceleratorConfig {
                    tensor_cores: r.tensor_cores,
                    vector_cores: r.vector_cores,
                    width: r.width,
                    depth: r.depth,
                    vector_width: r.vector_width.unwrap_or(r.width),
                    buffer_bytes,
                })),
                Err(e) => {
                    ctx.error(&cp.key("buffer"), e.message, None);
                    None
                }
            }
        }
    }
}

/// `[search]`'s scalar settings, each checked and reported once.
struct Scalars {
    min_area_fraction: f64,
    bucket_um2: Option<f64>,
    schedule_gap: f64,
    schedule_time_limit_seconds: f64,
    schedule_node_limit: u64,
    convergence_window: u32,
    ok: bool,
}

fn scalars(ctx: &mut Ctx<'_>, path: &FieldPath, s: &RawSearch, d: &SpaceSpec) -> Scalars {
    let mut scalars_ok = true;
    let min_area_fraction = s.min_area_fraction.unwrap_or(d.min_area_fraction);
    if !(0.0..1.0).contains(&min_area_fraction) {
        scalars_ok = false;
        ctx.error(
            &path.key("min_area_fraction"),
            format!("{min_area_fraction} is not a fraction"),
            Some("use a value from 0 (no minimum) up to, not including, 1".into()),
        );
    }
    let bucket_um2 = match &s.area_bucket {
        None => Some(d.bucket_um2),
        Some(t) => positive(
            ctx,
            &path.key("area_bucket"),
            t,
            parse_area_um2,
            "an area bucket of 0",
            Some("e.g. \"0.01 mm2\""),
        ),
    };
    let schedule_gap = s.schedule_gap.unwrap_or(d.schedule_gap);
    if !(0.0..0.5).contains(&schedule_gap) {
        scalars_ok = false;
        ctx.error(
            &path.key("schedule_gap"),
            format!("{schedule_gap} is not a usable gap"),
            Some(
                "use a fraction from 0 (prove optimality) up to 0.5; the reference uses 0.01"
                    .into(),
            ),
        );
    }
    let schedule_time_limit_seconds = s
        .schedule_time_limit_seconds
        .unwrap_or(d.schedule_time_limit_seconds);
    if !(0.001..=3600.0).contains(&schedule_time_limit_seconds) {
        scalars_ok = false;
        ctx.error(
            &path.key("schedule_time_limit_seconds"),
            format!("{schedule_time_limit_seconds} s is not a usable time limit"),
            Some("use 0.001 to 3600 seconds".into()),
        );
    }
    let schedule_node_limit = s.schedule_node_limit.unwrap_or(d.schedule_node_limit);
    if !(1..=MAX_SCHEDULE_NODE_LIMIT).contains(&schedule_node_limit) {
        scalars_ok = false;
        ctx.error(
            &path.key("schedule_node_limit"),
            format!("{schedule_node_limit} is not a usable node limit"),
            Some(format!(
                "use 1 to {MAX_SCHEDULE_NODE_LIMIT} branch-and-bound nodes; the default is {}",
                d.schedule_node_limit
            )),
        );
    }
    let convergence_window = s.convergence_window.unwrap_or(d.convergence_window);
    if convergence_window == 0 {
        scalars_ok = false;
        ctx.error(
            &path.key("convergence_window"),
            "a convergence window of 0 buckets",
            Some("use 1 or more (the reference uses 5)".into()),
        );
    }
    Scalars {
        min_area_fraction,
        bucket_um2,
        schedule_gap,
        schedule_time_limit_seconds,
        schedule_node_limit,
        convergence_window,
        ok: scalars_ok,
    }
}

/// The walk: `strategy`, or the older `exhaustive = true` (`false`: the default walk); both
/// given, they must agree.
fn strategy(ctx: &mut Ctx<'_>, path: &FieldPath, s: &RawSearch) -> Strategy {
    match (s.strategy, s.exhaustive) {
        (None, exhaustive) => {
            if exhaustive == Some(true) {
                Strategy::Exhaustive
            } else {
                Strategy::default()
            }
        }
        (Some(strategy), None) => strategy,
        (Some(strategy), Some(exhaustive)) => {
            if exhaustive != (strategy == Strategy::Exhaustive) {
                ctx.error(
                    &path.key("exhaustive"),
                    format!(
                        "`exhaustive = {exhaustive}` contradicts `strategy = \"{}\"`",
                        strategy.name()
                    ),
                    Some("give `strategy` alone (`exhaustive = true` is `strategy = \"exhaustive\"`)".into()),
                );
            }
            strategy
        }
    }
}
