//! One answer: every plan a search reports — the best chip's, each near-tie's, every line
//! of `explored.jsonl` — is a plan `archplace estimate` accepts, and `estimate --mip` of it
//! gives the search's numbers bit for bit. Checked for every example spec, its model,
//! training and cluster as given, over a small space of chips (the examples' own spaces
//! take minutes to hours).

use crate::util::*;
use serde_json::Value;
use std::path::Path;

/// Four chips (two of them differing only in a buffer that changes little, so there are
/// near-ties), visited exhaustively.
const SMALL_SPACE: &str = r#"
tensor_cores = [64, 128]
vector_cores = [32]
width = [64]
depth = [64]
buffer = ["32 MiB", "64 MiB"]
area_budget = "100000 mm2"
min_area_fraction = 0.0
exhaustive = true
"#;

/// The example `name` with the small space, as a TOML table (no `[accelerator]`/`[plan]`).
fn example(name: &str) -> toml::Table {
    let path = root().join("config/specs").join(format!("{name}.toml"));
    let mut t: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    t.remove("accelerator");
    t.remove("plan");
    t.insert(
        "search".into(),
        toml::Value::Table(SMALL_SPACE.parse().unwrap()),
    );
    t
}

/// `[accelerator]` of a result's chip (`configuration`) with `hbm_bytes`.
fn accelerator(configuration: &Value, hbm_bytes: u64) -> toml::Table {
    let mut a = toml::Table::new();
    for key in [
        "tensor_cores",
        "vector_cores",
        "width",
        "depth",
        "vector_width",
    ] {
        let v = configuration[key].as_u64().unwrap();
        a.insert(key.into(), toml::Value::Integer(v as i64));
    }
    let buffer = configuration["buffer_bytes"].as_u64().unwrap();
    a.insert("buffer".into(), toml::Value::String(format!("{buffer} B")));
    a.insert("hbm".into(), toml::Value::String(format!("{hbm_bytes} B")));
    a
}

/// `[plan]` of a reported plan: every key `[plan]` takes (the optimizer is `[training]`'s).
fn plan_table(plan: &Value) -> toml::Table {
    let mut p: toml::Table = toml::Value::try_from(plan)
        .unwrap()
        .as_table()
        .unwrap()
        .clone();
    p.remove("optimizer");
    p
}

/// The spec's cluster at scale-up domain size `node_size` (one of its `node_size` list,
/// with that size's intra-node bandwidth when it lists one per size).
fn at_domain(spec: &mut toml::Table, node_size: u64) {
    let Some(cluster) = spec.get_mut("cluster").and_then(|c| c.as_table_mut()) else {
        return;
    };
    let sizes: Vec<u64> = match cluster.get("node_size") {
        Some(toml::Value::Array(list)) => list
            .iter()
            .filter_map(|v| v.as_integer())
            .map(|v| v as u64)
            .collect(),
        _ => return,
    };
    let k = sizes
        .iter()
        .position(|&n| n == node_size)
        .expect("a listed size");
    cluster.insert("node_size".into(), toml::Value::Integer(node_size as i64));
    if let Some(toml::Value::Array(list)) = cluster.get("intra_node_bandwidth") {
        let one = list[k].clone();
        cluster.insert("intra_node_bandwidth".into(), one);
    }
}

/// `estimate --mip --json` of `plan` on the chip; the plan's line of the result must agree.
/// `node_size`: the scale-up domain size it was planned for, when the spec lists several.
fn estimate_agrees_at(
    base: &toml::Table,
    chip: toml::Table,
    line: &Value,
    node_size: Option<u64>,
    what: &str,
) {
    let plan = &line["plan"];
    assert!(plan.is_object(), "{what}: the plan has no [plan]: {line}");
    let mut spec = base.clone();
    spec.remove("search");
    if let Some(n) = node_size {
        at_domain(&mut spec, n);
    }
    // `estimate` takes one model: the plan's (by its name, or its preset's).
    if let Some(models) = spec.get_mut("models").and_then(|m| m.as_array_mut()) {
        models.retain(|m| {
            m.get("name")
                .or_else(|| m.get("preset"))
                .and_then(|v| v.as_str())
                == line["model"].as_str()
        });
        assert_eq!(
            models.len(),
            1,
            "{what}: the plan's model {}",
            line["model"]
        );
    }
    spec.insert("accelerator".into(), toml::Value::Table(chip));
    spec.insert("plan".into(), toml::Value::Table(plan_table(plan)));
    let (_dir, path) = temp_spec("estimate.toml", &toml::to_string(&spec).unwrap());
    let o = run(&["estimate", path.to_str().unwrap(), "--mip", "--json"]);
    assert!(o.status.success(), "{what}: {}\n{}", stdout(&o), stderr(&o));
    let e: Value = serde_json::from_slice(&o.stdout).unwrap();
    let bits = |v: &Value| v.as_f64().map(f64::to_bits);
    assert_eq!(
        bits(&e["step_seconds"]),
        bits(&line["time_per_batch_seconds"]),
        "{what}: step time"
    );
    for (part, _) in line["time"].as_object().unwrap() {
        assert_eq!(
            bits(&e["time"][part]),
            bits(&line["time"][part]),
            "{what}: {part}"
        );
    }
    for part in ["weights", "gradients", "optimizer", "activations", "total"] {
        assert_eq!(
            bits(&e["memory_bytes"][part]),
            bits(&line["memory_bytes"][part]),
            "{what}: memory {part}"
        );
    }
    // A runnable plan: every device, an even split of the batch.
    let p = |k: &str| plan[k].as_u64().unwrap();
    let cp = plan["context_parallel"].as_u64().unwrap_or(1);
    assert_eq!(
        p("tensor_parallel") * cp * p("pipeline_parallel") * p("data_parallel"),
        e["devices"].as_u64().unwrap(),
        "{what}: t·CP·p·d"
    );
    let batch = base["training"]["global_batch"].as_integer().unwrap() as u64;
    assert_eq!(batch % (p("micro_batch") * p("data_parallel")), 0, "{what}");
}

/// The example's search over the small space, then every reported plan estimated.
fn every_reported_plan_is_estimated_the_same(name: &str) {
    let _gate = shared();
    let base = example(name);
    let (dir, path) = temp_spec(&format!("{name}.toml"), &toml::to_string(&base).unwrap());
    let out = dir.path().join("out");
    let o = run(&[
        "run",
        path.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{name}: {}", stderr(&o));
    let result = read_json(&out.join("result.json"));
    let best = &result["best"];
    assert!(best.is_object(), "{name}: no chip fits the example's plan");
    let hbm = best["hbm_bytes"].as_u64().unwrap();
    let size = |v: &Value| v["node_size"].as_u64();
    for m in best["models"].as_array().unwrap() {
        let chip = accelerator(&best["configuration"], hbm);
        estimate_agrees_at(&base, chip, m, size(best), name);
    }
    let ties = result["near_ties"].as_array().unwrap();
    for (k, tie) in ties.iter().enumerate() {
        let hbm = tie["hbm_bytes"].as_u64().unwrap();
        for m in tie["plans"].as_array().unwrap() {
            let what = format!("{name}, near-tie {k}");
            let chip = accelerator(&tie["configuration"], hbm);
            estimate_agrees_at(&base, chip, m, size(tie), &what);
        }
    }
    // With several scale-up domain sizes: the best chip at each size, its plans.
    for d in result["scale_up_domains"]["sizes"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(hbm) = d["hbm_bytes"].as_u64() else {
            continue;
        };
        for m in d["plans"].as_array().unwrap() {
            let what = format!("{name}, best at {} per node", d["node_size"]);
            let chip = accelerator(&d["configuration"], hbm);
            estimate_agrees_at(&base, chip, m, size(d), &what);
        }
    }
    // Every line of explored.jsonl: its plan is the one its numbers are of.
    let explored = std::fs::read_to_string(out.join("explored.jsonl")).unwrap();
    let mut checked = 0;
    for (k, line) in explored.lines().enumerate() {
        let e: Value = serde_json::from_str(line).unwrap();
        let Some(hbm) = e["hbm_bytes"].as_u64() else {
            continue;
        };
        for m in e["plans"].as_array().unwrap() {
            let what = format!("{name}, explored line {k}");
            let chip = accelerator(&e["configuration"], hbm);
            estimate_agrees_at(&base, chip, m, size(&e), &what);
            checked += 1;
        }
    }
    assert!(checked > 0, "{name}: no explored plan");
    eprintln!(
        "{name}: the best plan, {} near-tie(s) and {checked} explored plan(s) estimated alike",
        ties.len()
    );
}

macro_rules! examples {
    ($($test:ident: $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                every_reported_plan_is_estimated_the_same($name);
            }
        )*

        /// Every example spec has its test above.
        #[test]
        fn every_example_spec_is_checked() {
            let mut listed = vec![$($name),*];
            listed.sort_unstable();
            let mut found: Vec<String> = std::fs::read_dir(root().join("config/specs"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .map(|p| Path::new(&p).file_stem().unwrap().to_string_lossy().into_owned())
                .collect();
            found.sort_unstable();
            assert_eq!(listed, found);
        }
    };
}

examples! {
    bert_large: "bert-large",
    custom_tiny: "custom-tiny",
    deepseek_v3_domains: "deepseek-v3-domains",
    estimate_a100: "estimate-a100",
    estimate_deepseek_v3_h800: "estimate-deepseek-v3-h800",
    estimate_llama3_70b_h100: "estimate-llama3-70b-h100",
    estimate_llama3_405b_h100: "estimate-llama3-405b-h100",
    estimate_llama3_70b_128k_cp_h100: "estimate-llama3-70b-128k-cp-h100",
    estimate_llama3_8b_fsdp_h100: "estimate-llama3-8b-fsdp-h100",
    estimate_mixtral_8x22b_b200: "estimate-mixtral-8x22b-b200",
    estimate_mixtral_8x7b_h100: "estimate-mixtral-8x7b-h100",
    gpt2_xl: "gpt2-xl",
    gpt3_175b: "gpt3-175b",
    gpu_like: "gpu-like",
    llama2_70b: "llama2-70b",
    llama2_7b: "llama2-7b",
    llama3: "llama3",
    megatron_gpt2_2_5b: "megatron-gpt2-2.5b",
    megatron_gpt2_8_3b: "megatron-gpt2-8.3b",
    mixtral_8x7b: "mixtral-8x7b",
    mixtral_8x7b_domains: "mixtral-8x7b-domains",
    moe: "moe",
    opt_1_3b: "opt-1.3b",
    opt_350m: "opt-350m",
}

/// With `tensor_parallel_overlap = true` the saving shows as less tensor-parallel
/// communication (the time computation does not hide), not as a shorter backward pass:
/// forward and backward are the cores' busy time whether collectives overlap or not.
#[test]
fn overlap_shows_as_less_communication_not_less_backward() {
    let _gate = crate::util::shared();
    let text = std::fs::read_to_string(root().join("config/specs/estimate-a100.toml")).unwrap();
    let concurrent = text.replace(
        "operator_execution = \"sequential\"",
        "operator_execution = \"concurrent\"",
    );
    assert_ne!(concurrent, text, "the example sets operator_execution");
    let estimate = |text: &str| -> Value {
        let (_dir, path) = temp_spec("overlap.toml", text);
        let o = run(&["estimate", path.to_str().unwrap(), "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let alone = estimate(&concurrent);
    let overlapped = estimate(&concurrent.replace(
        "operator_execution = \"concurrent\"",
        "operator_execution = \"concurrent\"\ntensor_parallel_overlap = true",
    ));
    let t = |v: &Value, k: &str| v["time"][k].as_f64().unwrap();
    let tp = "tensor_parallel_communication_seconds";
    assert!(
        t(&overlapped, tp) < 0.9 * t(&alone, tp),
        "{overlapped}\n{alone}"
    );
    for part in ["forward_seconds", "backward_seconds"] {
        let (o, a) = (t(&overlapped, part), t(&alone, part));
        assert!(
            (o - a).abs() <= 1e-6 * a,
            "{part}: {o} overlapped, {a} alone"
        );
    }
    assert!(overlapped["step_seconds"].as_f64() < alone["step_seconds"].as_f64());
}
