//! The JSON Schema of spec files, for editors (taplo, VS Code's Even Better TOML, …):
//! derived from the serde types of `raw.rs`, then made useful to a person typing a spec —
//! clean type names, no `null` (TOML has none), the presets and choices as enums, a pattern
//! for every quantity with a unit, minimums for counts, the keys a model without a preset
//! needs, and an `$id`. What a schema cannot say (a micro-batch that divides the global
//! batch, heads that divide by the width) stays the validator's.

use super::raw::RawSpec;
use serde_json::{Map, Value, json};

/// The schema's identifier (a URN: the schema ships with archplace, not from a server).
pub const SCHEMA_ID: &str = "urn:archplace:spec-schema:1";

/// A number and a unit, as `units` reads them ("80 GiB", "1.05 GHz", "4 GiB/s", "5 us").
fn quantity(units: &str) -> String {
    format!(r"^\s*[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?\s*({units})\s*$")
}

const BYTES: &str = "B|kB|KB|MB|GB|TB|KiB|MiB|GiB|TiB";
const RATE: &str = "(B|kB|KB|MB|GB|TB|KiB|MiB|GiB|TiB|b|kb|Kb|Mb|Gb|Tb)/s";
const SECONDS: &str = "s|ms|us|µs|ns";
const HERTZ: &str = "Hz|kHz|MHz|GHz";
const FLOPS: &str = "FLOP/s|GFLOP/s|TFLOP/s|PFLOP/s";
const AREA: &str = "mm²|mm2|um²|um2|µm²";

/// The pattern of the quantity a property of this name holds, if it holds one.
fn pattern_for(name: &str) -> Option<String> {
    let units = match name {
        "hbm" | "buffer" => BYTES,
        n if n.ends_with("bandwidth") => RATE,
        n if n.ends_with("latency") => SECONDS,
        "clock" => HERTZ,
        "peak_flops" => FLOPS,
        "area_bucket" => AREA,
        _ => return None,
    };
    Some(quantity(units))
}

/// Counts that must be at least 1.
const POSITIVE: [&str; 22] = [
    "schema_version",
    "devices",
    "global_batch",
    "micro_batch_sizes",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn",
    "vocab",
    "seq_len",
    "max_positions",
    "max_tensor_parallel",
    "vocab_pad_multiple",
    "node_size",
    "pipeline",
    "data",
    "tensor",
    "tensor_parallel",
    "pipeline_parallel",
    "data_parallel",
    "micro_batch",
];

pub fn json_schema() -> Value {
    let mut v = serde_json::to_value(schemars::schema_for!(RawSpec)).unwrap_or(Value::Null);
    let renames = rename_definitions(&mut v);
    walk(&mut v, &renames, None);
    if let Value::Object(root) = &mut v {
        root.insert("$id".into(), json!(SCHEMA_ID));
        if let Some(defs) = root.get_mut("$defs").and_then(Value::as_object_mut) {
            if let Some(model) = defs.get_mut("Model").and_then(Value::as_object_mut) {
                presets(model);
            }
            let gpus: Vec<&str> = archplace_plugin_sdk::gpus::GPUS
                .iter()
                .map(|g| g.name)
                .collect();
            let systems = archplace_plugin_sdk::gpus::system_names();
            for (def, names) in [("Cluster", &systems), ("FixedAccelerator", &gpus)] {
                if let Some(Value::Object(p)) = defs
                    .get_mut(def)
                    .and_then(|d| d.get_mut("properties"))
                    .and_then(|p| p.get_mut("preset"))
                {
                    p.insert("enum".into(), json!(names));
                }
            }
        }
    }
    v
}

/// `RawModel` → `Model`, `OneOrMany2` → `OneOrManyOfBoolean`, `RawRecomputation` →
/// `RecomputationChoice` (beside the engine's `Recomputation`): the names an editor shows.
fn rename_definitions(v: &mut Value) -> Vec<(String, String)> {
    let Some(defs) = v.get_mut("$defs").and_then(Value::as_object_mut) else {
        return Vec::new();
    };
    let original: Vec<String> = defs.keys().cloned().collect();
    let mut renames = Vec::new();
    let old: Map<String, Value> = std::mem::take(defs);
    for (name, def) in old {
        let base = name
            .strip_prefix("Raw")
            .unwrap_or(&name)
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .to_string();
        let mut clean = if ["OneOrMany", "Axis", "Range"].contains(&base.as_str()) {
            format!("{base}Of{}", inner_type(&def).unwrap_or_default())
        } else {
            base
        };
        if clean != name && original.contains(&clean) {
            clean = format!("{clean}Choice");
        }
        if clean != name {
            renames.push((format!("#/$defs/{name}"), format!("#/$defs/{clean}")));
        }
        defs.insert(clean, def);
    }
    renames
}

/// The first scalar type or referenced definition inside `v`, capitalised: what a generic
/// definition (one value or many, an axis, a range) holds.
fn inner_type(v: &Value) -> Option<String> {
    let o = v.as_object()?;
    if let Some(Value::String(r)) = o.get("$ref") {
        let name = r.rsplit('/').next()?;
        return Some(name.strip_prefix("Raw").unwrap_or(name).to_string());
    }
    if let Some(Value::String(t)) = o.get("type")
        && !matches!(t.as_str(), "array" | "object" | "null")
    {
        let mut c = t.chars();
        return c
            .next()
            .map(|f| f.to_ascii_uppercase().to_string() + c.as_str());
    }
    for key in ["anyOf", "oneOf", "items", "properties"] {
        match o.get(key) {
            Some(Value::Array(a)) => {
                if let Some(t) = a.iter().find_map(inner_type) {
                    return Some(t);
                }
            }
            Some(Value::Object(p)) if key == "properties" => {
                if let Some(t) = p.values().find_map(inner_type) {
                    return Some(t);
                }
            }
            Some(x) => {
                if let Some(t) = inner_type(x) {
                    return Some(t);
                }
            }
            None => {}
        }
    }
    None
}

/// Every schema object: `$ref`s renamed, `null` dropped, quantity patterns and minimums by
/// property name.
fn walk(v: &mut Value, renames: &[(String, String)], property: Option<&str>) {
    match v {
        Value::Object(o) => {
            // First: a dropped `null` branch may bring a `$ref` up to this object.
            drop_null(o);
            if let Some(Value::String(r)) = o.get_mut("$ref")
                && let Some((_, new)) = renames.iter().find(|(old, _)| old == r)
            {
                *r = new.clone();
            }
            if let Some(name) = property {
                let is_string = o.get("type") == Some(&json!("string"));
                let items_string =
                    o.get("items").and_then(|i| i.get("type")) == Some(&json!("string"));
                if let Some(p) = pattern_for(name) {
                    if is_string {
                        o.insert("pattern".into(), json!(p));
                    } else if items_string && let Some(Value::Object(items)) = o.get_mut("items") {
                        items.insert("pattern".into(), json!(p));
                    }
                }
                if POSITIVE.contains(&name) {
                    if o.get("type") == Some(&json!("integer")) {
                        o.insert("minimum".into(), json!(1));
                    } else if let Some(Value::Object(items)) = o.get_mut("items")
                        && items.get("type") == Some(&json!("integer"))
                    {
                        items.insert("minimum".into(), json!(1));
                    }
                }
            }
            let keys: Vec<String> = o.keys().cloned().collect();
            for k in keys {
                if k == "properties" {
                    if let Some(Value::Object(props)) = o.get_mut("properties") {
                        for (name, p) in props.iter_mut() {
                            walk(p, renames, Some(name.as_str()));
                        }
                    }
                } else if let Some(child) = o.get_mut(&k) {
                    // Items of a property's list are that property's values.
                    let inherited = if k == "items" { property } else { None };
                    walk(child, renames, inherited);
                }
            }
        }
        Value::Array(a) => {
            for x in a {
                walk(x, renames, property);
            }
        }
        _ => {}
    }
}

/// TOML has no null: `"type": ["integer", "null"]` → `"integer"`, and `anyOf` with a
/// `null` branch → the other branch.
fn drop_null(o: &mut Map<String, Value>) {
    if let Some(Value::Array(types)) = o.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let t = types[0].clone();
            o.insert("type".into(), t);
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = o.get_mut(key) {
            branches.retain(|b| {
                b.get("type") != Some(&json!("null")) && b.get("const") != Some(&Value::Null)
            });
            if branches.len() == 1 {
                let only = branches.remove(0);
                o.remove(key);
                if let Value::Object(only) = only {
                    for (k, v) in only {
                        o.entry(k).or_insert(v);
                    }
                }
            }
        }
    }
}

/// A model's `preset` is one of the presets; without one, the shape must be given.
fn presets(model: &mut Map<String, Value>) {
    if let Some(Value::Object(p)) = model
        .get_mut("properties")
        .and_then(|p| p.get_mut("preset"))
    {
        p.insert(
            "enum".into(),
            json!(archplace_engine::model::PRESETS.to_vec()),
        );
    }
    model.insert("if".into(), json!({ "not": { "required": ["preset"] } }));
    model.insert(
        "then".into(),
        json!({ "required": ["layers", "hidden", "heads", "vocab", "seq_len"] }),
    );
}
