//! `[cost_model]`: which plugins, with which parameters; their errors located in the spec.

use crate::raw::{RawCostModel, RawPluginRef};
use crate::{CostModelSpec, Ctx, FieldPath};
use archplace_cost_port::PluginRef;
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
    ok.then_some(CostModelSpec {
        area,
        latency,
        parameters,
    })
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
