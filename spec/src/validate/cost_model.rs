//! `[cost_model]`: which plugins, with which parameters; their errors located in the spec.

use crate::calibration::CLUSTER_PARAMETERS;
use crate::raw::{RawCostModel, RawPluginRef};
use crate::{CostModelSpec, Ctx, FieldPath};
use archplace_cost_port::{CLUSTER, ParameterRange, ParameterRef, PluginRef};

fn plugin_ref(r: Option<&RawPluginRef>, path: &FieldPath, ctx: &mut Ctx<'_>) -> Option<PluginRef> {
    let (name, version, hash) = match r {
        None => return Some(PluginRef::named("reference")),
        Some(RawPluginRef::Name(n)) => (n.clone(), None, None),
        Some(RawPluginRef::Pinned(p)) => (p.plugin.clone(), p.version.clone(), p.blake3.clone()),
    };
    let mut ok = true;
    let pinned = matches!(r, Some(RawPluginRef::Pinned(_)));
    let name_path = if pinned {
        path.key("plugin")
    } else {
        path.clone()
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        ctx.error(
            &name_path,
            format!("`{name}` is not a plugin name"),
            Some("plugin names use letters, digits, `-` and `_`".into()),
        );
        ok = false;
    }
    if let Some(v) = &version
        && let Err(e) = semver::VersionReq::parse(v)
    {
        ctx.error(
            &path.key("version"),
            format!("`{v}` is not a version requirement: {e}"),
            Some("e.g. \"1.2\" (meaning ^1.2), \"=1.2.3\" or \">=1.0, <2\"".into()),
        );
        ok = false;
    }
    if let Some(h) = &hash
        && !(h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
    {
        ctx.error(
            &path.key("blake3"),
            "a blake3 hash is 64 hexadecimal digits",
            Some("`archplace plugin check FILE.wasm` prints a component's hash".into()),
        );
        ok = false;
    }
    ok.then_some(PluginRef {
        name,
        version,
        blake3: hash.map(|h| h.to_ascii_lowercase()),
    })
}

pub(super) fn cost_model(c: &RawCostModel, ctx: &mut Ctx<'_>) -> Option<CostModelSpec> {
    let path = FieldPath::root().key("cost_model");
    let area = plugin_ref(c.area.as_ref(), &path.key("area"), ctx);
    let latency = plugin_ref(c.latency.as_ref(), &path.key("latency"), ctx);
    let parameters: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> =
        c.parameters
            .as_ref()
            .map(|m| {
                m.iter()
                    .map(|(model, params)| {
                        (
                            model.clone(),
                            params
                                .iter()
                                .map(|(k, v)| (k.clone(), v.to_text()))
                                .collect(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
    let (area, latency) = (area?, latency?);
    let mut ok = true;
    for model in parameters.keys() {
        if model != &area.name && model != &latency.name {
            ctx.error(
                &path.key("parameters").key(model),
                format!("parameters for `{model}`, which this spec does not use"),
                Some(format!(
                    "this spec uses `{}` (area) and `{}` (latency)",
                    area.name, latency.name
                )),
            );
            ok = false;
        }
    }
    let uncertainty = uncertainty(c, &latency.name, &path, ctx);
    if let Some(file) = &c.calibration
        && file.trim().is_empty()
    {
        ctx.error(
            &path.key("calibration"),
            "an empty calibration file name",
            Some("name a file made by `archplace calibrate`, relative to the spec".into()),
        );
        ok = false;
    }
    ok &= uncertainty.is_some();
    ok.then_some(CostModelSpec {
        area,
        latency,
        parameters,
        calibration: c.calibration.clone(),
        uncertainty: uncertainty.unwrap_or_default(),
    })
}

/// `[cost_model.uncertainty.*]`: each owner the latency plugin or `cluster` (whose
/// parameters are its collective efficiencies, fractions in (0, 1]); each range two
/// numbers in order, with the same unit (checked against the plugin's declaration when
/// the plugin is loaded).
fn uncertainty(
    c: &RawCostModel,
    latency: &str,
    path: &FieldPath,
    ctx: &mut Ctx<'_>,
) -> Option<Vec<ParameterRange>> {
    let mut ranges = Vec::new();
    let mut ok = true;
    for (owner, params) in c.uncertainty.iter().flatten() {
        let at = path.key("uncertainty").key(owner);
        if owner != latency && owner != CLUSTER {
            ctx.error(
                &at,
                format!("uncertainty of `{owner}`, which is not this spec's latency model"),
                Some(format!(
                    "give ranges for `{latency}`'s parameters, or for `cluster`'s (intra_node_efficiency, inter_node_efficiency)"
                )),
            );
            ok = false;
            continue;
        }
        for (name, [lo, hi]) in params {
            let at = at.key(name);
            if owner == CLUSTER && !CLUSTER_PARAMETERS.iter().any(|p| p.0 == name) {
                ctx.error(
                    &at,
                    format!("the cluster has no calibratable parameter `{name}`"),
                    Some("cluster parameters: intra_node_efficiency, inter_node_efficiency".into()),
                );
                ok = false;
                continue;
            }
            match (split_number(&lo.to_text()), split_number(&hi.to_text())) {
                (Some((l, lu)), Some((h, hu))) if lu == hu && l < h => {
                    if owner == CLUSTER && !(l > 0.0 && h <= 1.0) {
                        ctx.error(
                            &at,
                            format!("an efficiency range of {l} to {h} is not within (0, 1]"),
                            None,
                        );
                        ok = false;
                        continue;
                    }
                    ranges.push(ParameterRange {
                        parameter: ParameterRef::new(owner, name),
                        lower: l,
                        upper: h,
                        unit: lu,
                    });
                }
                _ => {
                    ctx.error(
                        &at,
                        format!(
                            "`[{}, {}]` is not a range: two numbers, the lower first, with the same unit",
                            lo.to_text(),
                            hi.to_text()
                        ),
                        Some("e.g. [\"0.75\", \"0.90\"] or [\"2 us\", \"6 us\"]".into()),
                    );
                    ok = false;
                }
            }
        }
    }
    ok.then_some(ranges)
}

/// `"2.5 us"` as (2.5, "us"); `"0.8"` as (0.8, ""): a finite number, then the rest.
pub(crate) fn split_number(text: &str) -> Option<(f64, String)> {
    let t = text.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(t.len());
    let x: f64 = t[..end].parse().ok()?;
    x.is_finite().then(|| (x, t[end..].trim().to_string()))
}

/// Reports the errors of resolving the spec's cost models (unknown plugins, rejected
/// parameters, ...) at the fields they concern.
pub(crate) fn cost_model_errors(
    errors: &[archplace_cost_port::CostModelError],
    spec: &CostModelSpec,
    ctx: &mut Ctx<'_>,
) {
    use archplace_cost_port::CostModelError as E;
    let path = FieldPath::root().key("cost_model");
    for e in errors {
        match e {
            E::Parameter {
                model,
                parameter,
                message,
            } => {
                let table = path.key("parameters").key(model);
                let field = table.key(parameter);
                let at = if ctx.has_field(&field) { field } else { table };
                ctx.error(&at, message.clone(), None)
            }
            E::Unknown { name, .. } | E::Plugin { plugin: name, .. } => {
                let role = match e {
                    E::Plugin { role, .. } => Some(*role),
                    _ => None,
                };
                let key = match role {
                    Some(r) => r,
                    None if &spec.area.name == name => "area",
                    None => "latency",
                };
                ctx.error(&path.key(key), e.to_string(), None)
            }
        }
    }
}
