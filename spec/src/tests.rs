// Tests as data: they read the fixture files and example specs.
#![allow(clippy::disallowed_methods)]

use super::*;
use archplace_engine::execution::TensorParallelOverlap;
use archplace_engine::pipeline::PipelineSchedule;
use archplace_engine::training::Recomputation;

const GOOD: &str = r#"
schema_version = 1
name = "gpt3"

[[models]]
preset = "gpt3-175b"
max_tensor_parallel = 8
baseline = { pipeline = 32, data = 8, tensor = 4 }

[training]
global_batch = 4096
micro_batch_sizes = [1, 2, 4, 8]
optimizer = "adam"

[cluster]
devices = 1024
link_bandwidth = "4 GiB/s"
hbm = ["32 GiB", "64 GiB", "80 GiB"]

[search]
area_budget = { reference_config = { tensor_cores = 8, vector_cores = 2, width = 128, depth = 128, buffer = "128 MiB" } }

[cost_model.parameters.reference]
clock = "1.05 GHz"
"#;

fn errors(src: &str) -> Vec<Diagnostic> {
    errors_at(src, "test.toml")
}

/// The problems of `src` read as the spec file `file` (whose folder relative paths in it
/// are read from).
fn errors_at(src: &str, file: &str) -> Vec<Diagnostic> {
    match parse(src, file) {
        Ok(s) => panic!("expected errors, got {s:#?}"),
        Err(d) => d,
    }
}

fn find<'a>(diags: &'a [Diagnostic], field: &str) -> &'a Diagnostic {
    diags
        .iter()
        .find(|d| d.field == field)
        .unwrap_or_else(|| panic!("no error for `{field}` in {diags:#?}"))
}

/// Line and column of the first occurrence of `needle` in `src`.
fn at(src: &str, needle: &str) -> (usize, usize) {
    diagnostic::line_column(src, src.find(needle).expect("needle"))
}

#[test]
fn a_good_spec_is_read_in_si_units() {
    let s = parse(GOOD, "good.toml").unwrap();
    assert_eq!(s.name, "gpt3");
    assert_eq!(s.cluster.hbm_bytes, vec![32 << 30, 64 << 30, 80 << 30]);
    assert_eq!(s.cluster.link_bytes_per_second, 4.0 * (1u64 << 30) as f64);
    assert_eq!(s.training.micro_batch_sizes, vec![1, 2, 4, 8]);
    assert_eq!(
        s.training.activation_recomputation,
        vec![Recomputation::None, Recomputation::Full]
    );
    assert_eq!(s.models[0].config.layers, 96);
    assert_eq!(
        s.models[0].baseline,
        Some(Baseline {
            pipeline: 32,
            data: 8,
            tensor: 4
        })
    );
    assert_eq!(s.space, SpaceSpec::default());
    assert_eq!(s.cost_model.parameters["reference"]["clock"], "1.05 GHz");
    assert_eq!(s.content_hash.len(), 64);
}

#[test]
fn several_errors_in_different_sections_are_reported_together() {
    let src = GOOD
        .replace(
            "optimizer = \"adam\"",
            "optimizer = \"adam\"\nmicro_batch_size = 3",
        )
        .replace("\"64 GiB\"", "\"64 GB/s\"")
        .replace("max_tensor_parallel = 8", "max_tensor_parallel = 64");
    let d = errors(&src);
    assert_eq!(d.len(), 3, "{d:#?}");
    let unknown = find(&d, "training.micro_batch_size");
    assert_eq!(
        (unknown.line, unknown.column),
        at(&src, "micro_batch_size =")
    );
    assert!(
        unknown.message.contains("unknown key `micro_batch_size`"),
        "{unknown:?}"
    );
    assert!(
        unknown
            .help
            .as_deref()
            .unwrap()
            .contains("did you mean `micro_batch_sizes`")
    );
    assert_eq!(d[0].file, "test.toml");
    let hbm = find(&d, "cluster.hbm[1]");
    assert_eq!((hbm.line, hbm.column), at(&src, "\"64 GB/s\""));
    assert!(hbm.message.contains("not a unit of size"), "{hbm:?}");
    let t = find(&d, "models[0].max_tensor_parallel");
    assert_eq!((t.line, t.column), at(&src, "64\nbaseline"));
    assert!(
        t.help.as_deref().unwrap().contains("1, 2, 4, 8, 16, 32"),
        "{t:?}"
    );
}

#[test]
fn structural_errors_in_several_sections_are_reported_together() {
    let src = GOOD
        .replace("global_batch = 4096", "global_batch = \"4096\"")
        .replace("devices = 1024", "devices = 1024\nnodes = 4");
    let d = errors(&src);
    assert_eq!(d.len(), 2, "{d:#?}");
    let gb = find(&d, "training.global_batch");
    assert_eq!((gb.line, gb.column), at(&src, "\"4096\""));
    let nodes = find(&d, "cluster.nodes");
    assert_eq!((nodes.line, nodes.column), at(&src, "nodes = 4"));
}

#[test]
fn micro_batch_must_divide_the_global_batch() {
    let src = GOOD.replace("[1, 2, 4, 8]", "[1, 3, 4, 0]");
    let d = errors(&src);
    let three = find(&d, "training.micro_batch_sizes[1]");
    assert_eq!((three.line, three.column), at(&src, "3, 4, 0"));
    assert!(
        three
            .message
            .contains("does not divide the global batch 4096")
    );
    find(&d, "training.micro_batch_sizes[3]");
}

#[test]
fn heads_must_divide_by_the_tensor_parallel_width() {
    let src = GOOD
        .replace(
            "preset = \"gpt3-175b\"",
            "preset = \"gpt3-175b\"\nheads = 96\nhidden = 12288\nkv_heads = 96",
        )
        .replace("max_tensor_parallel = 8", "max_tensor_parallel = 128");
    let d = errors(&src);
    let t = find(&d, "models[0].max_tensor_parallel");
    assert!(t.message.contains("does not divide the model"), "{t:?}");
    let src = GOOD.replace(
        "preset = \"gpt3-175b\"",
        "preset = \"gpt3-175b\"\nheads = 100",
    );
    let d = errors(&src);
    let h = find(&d, "models[0].heads");
    assert!(h.message.contains("not divisible by 100 heads"), "{h:?}");
}

#[test]
fn empty_axes_and_bad_units_are_located() {
    let src = GOOD.replace(
        "[search]\n",
        "[search]\ntensor_cores = []\nbuffer = [\"64 MiB\", \"12 parsecs\"]\narea_bucket = \"1 mm\"\n",
    );
    let d = errors(&src);
    let tc = find(&d, "search.tensor_cores");
    assert!(tc.message.contains("empty axis"));
    assert_eq!((tc.line, tc.column), at(&src, "[]"));
    let buf = find(&d, "search.buffer[1]");
    assert_eq!((buf.line, buf.column), at(&src, "\"12 parsecs\""));
    find(&d, "search.area_bucket");
}

#[test]
fn unknown_preset_gets_a_suggestion() {
    let d = errors(&GOOD.replace("gpt3-175b", "gpt-3-175b"));
    let p = find(&d, "models[0].preset");
    assert!(
        p.help
            .as_deref()
            .unwrap()
            .contains("did you mean `gpt3-175b`"),
        "{p:?}"
    );
}

#[test]
fn missing_keys_and_unknown_sections() {
    let d = errors("[trainig]\nglobal_batch = 8\n");
    find(&d, "schema_version");
    find(&d, "name");
    find(&d, "models");
    let t = find(&d, "trainig");
    assert_eq!((t.line, t.column), (1, 2));
    assert!(
        t.help
            .as_deref()
            .unwrap()
            .contains("did you mean `training`")
    );
}

#[test]
fn syntax_errors_are_located() {
    let d = errors("schema_version = 1\nname = \"x\nmodels = []\n");
    assert!(!d.is_empty());
    assert_eq!(d[0].line, 2);
    assert!(d[0].message.starts_with("invalid TOML"));
}

#[test]
fn custom_models_need_their_shape() {
    let src = "schema_version = 1\nname = \"c\"\n[[models]]\nlayers = 4\nhidden = 256\n";
    let d = errors(src);
    let m = find(&d, "models[0]");
    assert!(m.message.contains("heads, vocab, seq_len"), "{m:?}");
    let ok = "schema_version = 1\nname = \"c\"\n[[models]]\nname = \"tiny\"\nlayers = 4\nhidden = 256\nheads = 4\nvocab = 1000\nseq_len = 128\nmax_tensor_parallel = 4\n";
    let s = parse(ok, "c.toml").unwrap();
    assert_eq!(s.models[0].config.ffn, 1024);
    assert_eq!(s.models[0].config.max_positions, 128);
    assert_eq!(s.models[0].config.tensor_parallel_widths(), vec![1, 2, 4]);
}

#[test]
fn baselines_and_cost_models_are_checked() {
    let src = GOOD.replace(
        "pipeline = 32, data = 8, tensor = 4",
        "pipeline = 32, data = 64, tensor = 4",
    );
    let d = errors(&src);
    let b = find(&d, "models[0].baseline");
    assert!(b.message.contains("needs 8192 devices"), "{b:?}");
    // A parameter the model rejects is located at its value once the models are resolved.
    let src = GOOD.replace("clock = \"1.05 GHz\"", "clock = \"fast\"");
    let spec = parse(&src, "test.toml").unwrap();
    let d = resolve_cost_models(
        &spec,
        &archplace_cost_port::NativeModels,
        Default::default(),
    )
    .err()
    .unwrap();
    let c = find(&d, "cost_model.parameters.reference.clock");
    assert_eq!((c.line, c.column), at(&src, "\"fast\""));
    assert_eq!(c.file, "test.toml");
    // An unknown model: at the field that names it.
    let src = GOOD.replace(
        "[cost_model.parameters.reference]",
        "[cost_model]\nlatency = \"vendor-x\"\n[cost_model.parameters.reference]",
    );
    let spec = parse(&src, "test.toml").unwrap();
    let d = resolve_cost_models(
        &spec,
        &archplace_cost_port::NativeModels,
        Default::default(),
    )
    .err()
    .unwrap();
    let e = find(&d, "cost_model.latency");
    assert_eq!((e.line, e.column), at(&src, "\"vendor-x\""));
    assert!(e.message.contains("unknown cost model `vendor-x`"), "{e:?}");
    // Parameters of a model the spec does not use.
    let d = errors(&GOOD.replace(
        "[cost_model.parameters.reference]",
        "[cost_model]\narea = \"vendor-x\"\nlatency = \"vendor-x\"\n[cost_model.parameters.reference]",
    ));
    assert!(
        find(&d, "cost_model.parameters.reference")
            .message
            .contains("does not use")
    );
}

#[test]
fn plugins_can_be_pinned_by_version_and_hash() {
    let hash = "ab".repeat(32);
    let src = GOOD.replace(
        "[cost_model.parameters.reference]",
        &format!("[cost_model]\narea = {{ plugin = \"reference\", version = \"0.1\", blake3 = \"{hash}\" }}\n[cost_model.parameters.reference]"),
    );
    let spec = parse(&src, "test.toml").unwrap();
    assert_eq!(spec.cost_model.area.version.as_deref(), Some("0.1"));
    assert_eq!(spec.cost_model.area.blake3.as_deref(), Some(hash.as_str()));
    assert_eq!(spec.cost_model.latency.name, "reference");
    let bad = GOOD.replace(
        "[cost_model.parameters.reference]",
        "[cost_model]\narea = { plugin = \"reference\", version = \"one\", blake3 = \"xyz\" }\nlatency = { plugin = \"ref erence\" }\n[cost_model.parameters.reference]",
    );
    let d = errors(&bad);
    assert!(
        find(&d, "cost_model.area.version")
            .message
            .contains("not a version requirement")
    );
    assert!(
        find(&d, "cost_model.area.blake3")
            .message
            .contains("64 hexadecimal digits")
    );
    let l = find(&d, "cost_model.latency.plugin");
    assert!(l.message.contains("not a plugin name"), "{l:?}");
    let d = errors(&GOOD.replace(
        "[cost_model.parameters.reference]",
        "[cost_model]\nlatency = { plugin = \"reference\", sha = \"1\" }\n[cost_model.parameters.reference]",
    ));
    let l = find(&d, "cost_model.latency.sha");
    assert!(l.message.contains("unknown key `sha`"), "{l:?}");
}

#[test]
fn rendering_points_at_the_field() {
    let src = GOOD.replace("[1, 2, 4, 8]", "[1, 3]");
    let d = errors(&src);
    let text = d[0].render(&src);
    assert!(text.contains("--> test.toml:"), "{text}");
    assert!(text.contains("micro_batch_sizes = [1, 3]"), "{text}");
    assert!(text.contains("^"), "{text}");
    let json = serde_json::to_value(&d[0]).unwrap();
    for key in ["file", "line", "column", "field", "message"] {
        assert!(json.get(key).is_some(), "{json}");
    }
}

#[test]
fn the_embedded_default_spec_is_valid() {
    let s = default_spec().unwrap();
    assert!(!s.models.is_empty());
}

/// Every example spec in `config/specs/` is valid, and there is one per preset.
#[test]
fn example_specs_are_valid_and_cover_every_preset() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/specs");
    let mut presets = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let spec = load(&path).unwrap_or_else(|e| panic!("{}", e.render()));
            for (m, raw) in spec
                .models
                .iter()
                .zip(toml::from_str::<raw::RawSpec>(&text).unwrap().models)
            {
                if let Some(p) = raw.preset {
                    presets.insert(p);
                }
                assert!(m.config.layers > 0);
            }
        }
    }
    for p in archplace_engine::model::PRESETS {
        assert!(
            presets.contains(p),
            "no example spec in config/specs uses preset `{p}`"
        );
    }
}

/// The checked-in schema is what `archplace schema` prints.
#[test]
fn checked_in_schema_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/spec.schema.json");
    let want = serde_json::to_string_pretty(&json_schema()).unwrap() + "\n";
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "config/spec.schema.json is stale: run `cargo run -q -- schema > config/spec.schema.json`"
    );
}

/// Tests as data: every `tests/fixtures/spec/errors/NAME.toml` is validated and all its
/// diagnostics rendered; the text must equal `NAME.expected` beside it (an `expect-test`
/// file). After a deliberate change to a message, `UPDATE_EXPECT=1 cargo test -p
/// archplace-spec` rewrites the expected files; review them with `git diff`.
#[test]
fn spec_error_fixtures_render_as_expected() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/spec/errors");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 7,
        "the error fixtures are missing from {}",
        dir.display()
    );
    for path in &paths {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(path).unwrap();
        let diags = parse(&text, &name).expect_err(&name);
        let rendered: String = diags.iter().map(|d| d.render(&text)).collect();
        expect_test::expect_file![path.with_extension("expected")].assert_eq(&rendered);
    }
}

#[test]
fn training_choices_and_their_defaults() {
    use archplace_engine::training::{MemoryModel, Optimizer, Precision};
    let s = parse(GOOD, "good.toml").unwrap();
    assert_eq!(s.training.memory_model, MemoryModel::Megatron);
    assert_eq!(s.training.precisions, vec![Precision::Bf16Mixed]);
    assert_eq!(s.training.distributed_optimizer, vec![false]);
    assert_eq!(s.training.sequence_parallel, vec![false]);
    let src = GOOD.replace(
        "optimizer = \"adam\"",
        "optimizer = \"sgd_momentum\"\nactivation_recomputation = [false, \"selective\", \"selective_op\", true]\nprecision = [\"bf16-mixed\", \"fp32\"]\ndistributed_optimizer = [false, true]",
    );
    let s = parse(&src, "t.toml").unwrap();
    assert_eq!(s.training.optimizer, Optimizer::SgdMomentum);
    assert_eq!(
        s.training.activation_recomputation,
        vec![
            Recomputation::None,
            Recomputation::Selective,
            Recomputation::SelectiveOp,
            Recomputation::Full
        ]
    );
    assert_eq!(
        s.training.precisions,
        vec![Precision::Bf16Mixed, Precision::Fp32]
    );
    assert_eq!(s.training.distributed_optimizer, vec![false, true]);
    // The reference memory model: its own optimizer default, and no megatron-only choice.
    let src = GOOD.replace("optimizer = \"adam\"", "memory_model = \"reference\"");
    let s = parse(&src, "t.toml").unwrap();
    assert_eq!(s.training.optimizer, Optimizer::Sgd);
    let src = GOOD.replace(
        "optimizer = \"adam\"",
        "memory_model = \"reference\"\nactivation_recomputation = [\"selective\", \"selective_op\"]\nprecision = \"fp32\"\ndistributed_optimizer = true",
    );
    let d = errors(&src);
    for at in [0, 1] {
        assert!(
            find(&d, &format!("training.activation_recomputation[{at}]"))
                .message
                .contains("selective")
        );
    }
    find(&d, "training.precision");
    find(&d, "training.distributed_optimizer");
    // Interleaving: one value or a list, 1 … 64, megatron only; how operators run.
    assert_eq!(s.training.pipeline_interleaving, vec![1]);
    let src = GOOD.replace(
        "optimizer = \"adam\"",
        "pipeline_interleaving = [1, 2]\noperator_execution = \"sequential\"\ntensor_parallel_overlap = true",
    );
    let s = parse(&src, "t.toml").unwrap();
    assert_eq!(s.training.pipeline_interleaving, vec![1, 2]);
    assert_eq!(
        s.training.execution,
        archplace_engine::execution::Execution {
            operators: archplace_engine::execution::OperatorExecution::Sequential,
            tensor_parallel_overlap: TensorParallelOverlap::Pipelined,
            kernels: Default::default(),
            fp8_library: Default::default(),
            cross_entropy: Default::default(),
            overlap_efficiency: Default::default(),
        }
    );
    let d = errors(&GOOD.replace("optimizer = \"adam\"", "pipeline_interleaving = [1, 65]"));
    assert!(
        find(&d, "training.pipeline_interleaving[1]")
            .message
            .contains("outside 1 … 64")
    );
    let d = errors(&GOOD.replace(
        "optimizer = \"adam\"",
        "memory_model = \"reference\"\npipeline_interleaving = 2",
    ));
    assert!(
        find(&d, "training.pipeline_interleaving")
            .message
            .contains("no interleaved pipeline")
    );
    // An element size that contradicts the precision.
    let src = GOOD.replace(
        "optimizer = \"adam\"",
        "precision = \"fp32\"\nbytes_per_element = 2",
    );
    let d = errors(&src);
    assert!(
        find(&d, "training.bytes_per_element")
            .message
            .contains("contradicts precision fp32 (4 bytes)")
    );
}

#[test]
fn a_two_tier_network_and_its_mistakes() {
    let two = GOOD.replace(
        "link_bandwidth = \"4 GiB/s\"",
        "node_size = 8\nintra_node_bandwidth = \"300 GB/s\"\ninter_node_bandwidth = \"25 GB/s\"",
    );
    let s = parse(&two, "t.toml").unwrap();
    let n = s.cluster.network;
    assert_eq!(n.node_size, 8);
    assert_eq!(n.intra_node.bytes_per_second, 300e9);
    assert_eq!(n.inter_node.bytes_per_second, 25e9);
    assert_eq!(n.intra_node.latency_seconds, 5e-6);
    assert_eq!(n.inter_node.latency_seconds, 10e-6);
    // The placement charges traffic between stages and replicas between nodes.
    assert_eq!(s.cluster.link_bytes_per_second, 25e9);
    // One tier as before: the link bandwidth, no latency.
    let s = parse(GOOD, "t.toml").unwrap();
    assert_eq!(s.cluster.network.node_size, u64::MAX);
    assert_eq!(s.cluster.network.inter_node.latency_seconds, 0.0);
    let d = errors(&GOOD.replace("devices = 1024", "devices = 1024\nnode_size = 3"));
    assert!(
        find(&d, "cluster.node_size")
            .message
            .contains("whole nodes")
    );
    find(&d, "cluster.link_bandwidth");
    find(&d, "cluster.intra_node_bandwidth");
    let d = errors(&GOOD.replace(
        "devices = 1024",
        "devices = 1024\ninter_node_bandwidth = \"25 GB/s\"",
    ));
    assert!(
        find(&d, "cluster.inter_node_bandwidth")
            .message
            .contains("needs `node_size`")
    );
}

const PLAN: &str = r#"
[accelerator]
tensor_cores = 108
vector_cores = 108
width = 32
depth = 32
buffer = "40 MiB"
hbm = "80 GiB"
peak_flops = "312 TFLOP/s"

[plan]
tensor_parallel = 8
pipeline_parallel = 16
data_parallel = 8
micro_batch = 1
recomputation = "selective"
"#;

#[test]
fn an_estimate_plan_is_checked_against_the_model_and_cluster() {
    let s = parse(&format!("{GOOD}{PLAN}"), "t.toml").unwrap();
    let e = s.estimate.unwrap();
    assert_eq!(e.accelerator.vector_width, 32);
    assert_eq!(e.hbm_bytes, 80 << 30);
    assert_eq!(e.peak_flops_per_second, Some(312e12));
    assert_eq!(e.plan.recomputation, Recomputation::Selective);
    // Left out, precision and distributed optimizer are [training]'s first values.
    assert_eq!(
        e.plan.precision,
        archplace_engine::training::Precision::Bf16Mixed
    );
    let src = format!(
        "{GOOD}{}",
        PLAN.replace("data_parallel = 8", "data_parallel = 4")
    );
    let d = errors(&src);
    let dp = find(&d, "plan.data_parallel");
    assert!(
        dp.message.contains("512 devices; the cluster has 1024"),
        "{dp:?}"
    );
    let src = format!(
        "{GOOD}{}",
        PLAN.replace("pipeline_parallel = 16", "pipeline_parallel = 5")
    );
    let d = errors(&src);
    assert!(
        find(&d, "plan.pipeline_parallel")
            .message
            .contains("96 blocks")
    );
    let src = format!("{GOOD}{}", PLAN.replace("312 TFLOP/s", "312 TFLOPS"));
    find(&errors(&src), "accelerator.peak_flops");
    // `archplace estimate` takes one model: a second is an error at `[plan]`.
    let two = GOOD.replace(
        "[training]",
        "[[models]]\nname = \"gpt3-twin\"\npreset = \"gpt3-175b\"\n\n[training]",
    );
    let d = errors(&format!("{two}{PLAN}"));
    assert!(
        find(&d, "plan")
            .message
            .contains("one model; the spec has 2 [[models]]"),
        "{d:#?}"
    );
    // One table without the other.
    let only = PLAN.split("[plan]").next().unwrap();
    let d = errors(&format!("{GOOD}{only}"));
    assert!(find(&d, "accelerator").message.contains("needs a [plan]"));
}

/// One mistake, one error: an unknown `[accelerator]` preset does not also report every key
/// it would have filled (nor a vector width of 0), a missing width not also a missing vector
/// width; a value of the wrong kind in a one-or-many field gets that value's own message,
/// with the values it may take.
#[test]
fn one_mistake_is_one_error() {
    let with_chip = |chip: &str| format!("{GOOD}{}", PLAN.replace("tensor_cores = 108\n", chip));
    let src = with_chip("preset = \"a100-sxm-80gbx\"\ntensor_cores = 108\n").replace(
        "vector_cores = 108\nwidth = 32\ndepth = 32\nbuffer = \"40 MiB\"\nhbm = \"80 GiB\"\n",
        "",
    );
    let d = errors(&src);
    let fields: Vec<&str> = d.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["accelerator.preset"], "{d:#?}");
    assert!(
        d[0].help.as_deref().unwrap_or("").contains("a100-sxm-80gb"),
        "{d:#?}"
    );
    let d = errors(&format!("{GOOD}{}", PLAN.replace("width = 32\n", "")));
    let fields: Vec<&str> = d.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["accelerator.width"], "{d:#?}");
    let d = errors(&GOOD.replace(
        "optimizer = \"adam\"",
        "optimizer = \"adam\"\nprecision = \"fp8\"",
    ));
    let e = find(&d, "training.precision");
    assert!(
        e.message.contains("`fp8`")
            && e.message.contains("bf16-mixed")
            && e.message.contains("fp32"),
        "{e:?}"
    );
}

/// A cluster whose device count leaves a model no plan that uses every device (t × p × d
/// = devices, the batch split evenly) is refused at `devices`, with the numbers, unless
/// the spec lets devices idle.
#[test]
fn a_device_count_without_a_runnable_plan_is_refused() {
    // 1,021 is prime: t = 1 and d = 1,021 (the 4,096 samples do not split over it) or
    // p = 1,021 (more stages than the 98 layers).
    let good = GOOD.replace("baseline = { pipeline = 32, data = 8, tensor = 4 }\n", "");
    let prime = good.replace("devices = 1024", "devices = 1021");
    let d = errors(&prime);
    let e = find(&d, "cluster.devices");
    assert!(
        e.message
            .contains("no plan of gpt3-175b uses all 1021 devices"),
        "{e:?}"
    );
    assert!(e.message.contains("at most 98 pipeline stages"), "{e:?}");
    let idle = prime.replace("[search]\n", "[search]\nuse_all_devices = false\n");
    let s = parse(&idle, "t.toml").unwrap();
    assert!(!s.space.use_all_devices);
    // 960 devices have plans (t = 8, p = 15, d = 8); 1,000 have none (d must divide the
    // 4,096 samples, a power of two, leaving at least 125 stages).
    parse(&good.replace("devices = 1024", "devices = 960"), "t.toml").unwrap();
    find(
        &errors(&good.replace("devices = 1024", "devices = 1000")),
        "cluster.devices",
    );
}

/// Uneven pipelines as Megatron-LM gives them: every stage's blocks, or the first and last
/// stage's with the others even; each mistake at its key, with the numbers.
#[test]
fn a_plan_takes_uneven_stages_as_megatron_gives_them() {
    let with = |extra: &str| {
        format!(
            "{GOOD}{}",
            PLAN.replace("pipeline_parallel = 16", "pipeline_parallel = 8")
                .replace("data_parallel = 8", &format!("data_parallel = 16\n{extra}"))
        )
    };
    let list = |src: &str| {
        parse(src, "t.toml")
            .unwrap()
            .estimate
            .unwrap()
            .plan
            .stage_layers
    };
    assert_eq!(list(&with("")), None);
    assert_eq!(
        list(&with("stage_layers = [11, 12, 12, 12, 12, 12, 12, 13]")),
        Some(vec![11, 12, 12, 12, 12, 12, 12, 13])
    );
    assert_eq!(
        list(&with("first_stage_layers = 6\nlast_stage_layers = 6")),
        Some(vec![6, 14, 14, 14, 14, 14, 14, 6])
    );
    assert_eq!(
        list(&with("last_stage_layers = 5")),
        Some(vec![13, 13, 13, 13, 13, 13, 13, 5])
    );
    assert_eq!(
        list(&with("first_stage_layers = 5")),
        Some(vec![5, 13, 13, 13, 13, 13, 13, 13])
    );
    let d = errors(&with("first_stage_layers = 6"));
    let e = find(&d, "plan.first_stage_layers");
    assert!(
        e.message.contains(
            "the 96 blocks less the first/last stage's 6 do not split evenly over the other 7"
        ),
        "{e:?}"
    );
    // Refused ends are the one error: the even split (96 blocks over 8 × 5 chunks) they
    // would replace is not reported beside them.
    let d = errors(&with("first_stage_layers = 6\ninterleaving = 5"));
    find(&d, "plan.first_stage_layers");
    assert!(
        d.iter().all(|e| e.field != "plan.pipeline_parallel"),
        "{d:#?}"
    );
    let d = errors(&with("stage_layers = [12, 12]"));
    let e = find(&d, "plan.stage_layers");
    assert!(
        e.message.contains("each of the 8 pipeline stage(s)"),
        "{e:?}"
    );
    let d = errors(&with("stage_layers = [12, 12]\nfirst_stage_layers = 12"));
    find(&d, "plan.first_stage_layers");
    // Uneven stages may be interleaved (each stage's blocks split over its chunks).
    assert_eq!(
        list(&with(
            "first_stage_layers = 6\nlast_stage_layers = 6\ninterleaving = 2"
        )),
        Some(vec![6, 14, 14, 14, 14, 14, 14, 6])
    );
    assert_eq!(
        list(&with(
            "stage_layers = [12, 12, 12, 12, 12, 12, 12, 12]\ninterleaving = 2"
        )),
        Some(vec![12; 8])
    );
    // A schedule's rules, located at the key.
    let d = errors(&with("interleaving = 2\npipeline_schedule = \"1f1b\""));
    let e = find(&d, "plan.pipeline_schedule");
    assert!(
        e.message
            .contains("needs pipeline_schedule = \"interleaved\""),
        "{e:?}"
    );
    let d = errors(&with("pipeline_schedule = \"zbv\"\ninterleaving = 3"));
    let e = find(&d, "plan.pipeline_schedule");
    assert!(
        e.message.contains("runs 2 model chunk(s) per device"),
        "{e:?}"
    );
}

#[test]
fn gpu_presets_fill_the_chip_and_the_cluster() {
    let src = format!(
        "{}\n[accelerator]\npreset = \"a100-sxm-80gb\"\nbuffer = \"20 MiB\"\n[plan]\ntensor_parallel = 8\npipeline_parallel = 16\ndata_parallel = 8\nmicro_batch = 1\n",
        GOOD.replace(
            "link_bandwidth = \"4 GiB/s\"\nhbm = [\"32 GiB\", \"64 GiB\", \"80 GiB\"]",
            "preset = \"h100-sxm-80gb\""
        )
    );
    let s = parse(&src, "t.toml").unwrap();
    let e = s.estimate.unwrap();
    assert_eq!(
        (
            e.accelerator.tensor_cores,
            e.accelerator.width,
            e.accelerator.depth
        ),
        (108, 32, 32)
    );
    // A key given overrides the preset's.
    assert_eq!(e.accelerator.buffer_bytes, 20 << 20);
    assert_eq!(e.hbm_bytes, 80 << 30);
    assert_eq!(e.peak_flops_per_second, Some(312e12));
    let n = s.cluster.network;
    assert_eq!(n.node_size, 8);
    // NVLink at the share of its line rate NCCL achieves (the preset's measured figure),
    // InfiniBand at its line rate.
    assert_eq!(n.intra_node.bytes_per_second, 450e9 * (370.0 / 450.0));
    assert_eq!(n.inter_node.bytes_per_second, 50e9);
    let given = src.replace(
        "[cluster]\n",
        "[cluster]\nintra_node_efficiency = 0.5\ninter_node_efficiency = 0.9\n",
    );
    let n = parse(&given, "t.toml").unwrap().cluster.network;
    assert_eq!(
        (n.intra_node.bytes_per_second, n.inter_node.bytes_per_second),
        (225e9, 45e9)
    );
    let d = errors(&src.replace("[cluster]\n", "[cluster]\nintra_node_efficiency = 1.5\n"));
    assert!(
        find(&d, "cluster.intra_node_efficiency")
            .message
            .contains("not a fraction"),
        "{d:?}"
    );
    // Collectives beside computation: 1 unless given; the links' rates unchanged by it.
    assert_eq!(s.cluster.network.overlap_efficiency, 1.0);
    let beside = src.replace("[cluster]\n", "[cluster]\noverlap_efficiency = 0.4\n");
    let n = parse(&beside, "t.toml").unwrap().cluster.network;
    assert_eq!(n.overlap_efficiency, 0.4);
    assert_eq!(n.intra_node.bytes_per_second, 370e9);
    let d = errors(&src.replace("[cluster]\n", "[cluster]\noverlap_efficiency = 0\n"));
    assert!(
        find(&d, "cluster.overlap_efficiency")
            .message
            .contains("not a fraction"),
        "{d:?}"
    );
    assert_eq!(s.cluster.hbm_bytes, vec![80 << 30]);
    let bad = src.replace("preset = \"a100-sxm-80gb\"", "preset = \"v100\"");
    let d = errors(&bad);
    assert!(
        find(&d, "accelerator.preset")
            .help
            .as_deref()
            .unwrap()
            .contains("a100-sxm-80gb")
    );
    let missing = src.replace("preset = \"a100-sxm-80gb\"\n", "");
    let d = errors(&missing);
    assert!(
        find(&d, "accelerator.tensor_cores")
            .message
            .contains("missing")
    );
}

/// Ten different mistakes in one spec (for the validator and for the editor's schema).
const TEN_MISTAKES: &str = r#"schema_version = 1
name = "ten-mistakes"
descripton = "a typo at the top"

[[models]]
preset = "gpt3-175b"
max_tensor_paralel = 8
seq_len = "2048"

[[models]]
preset = "gpt3-175"

[training]
global_batch = 4096
micro_batch_sizes = [1, 3]

[cluster]
devices = -4
hbm = [80]
link_bandwidth = 4

[search]
exhaustiv = true
schedule_gap = "1%"
"#;

/// Ten different mistakes, ten located errors, in one run: several in one table, a typo
/// nested in a model, numbers where a unit is needed, a model that does not deserialize
/// beside one that does (the good one is still checked).
#[test]
fn ten_mistakes_give_ten_located_errors_in_one_run() {
    let src = TEN_MISTAKES;
    let d = errors(src);
    let expect: [(&str, &str, &str); 10] = [
        ("descripton", "descripton", "did you mean `description`"),
        (
            "models[0].max_tensor_paralel",
            "max_tensor_paralel",
            "did you mean `max_tensor_parallel`",
        ),
        ("models[0].seq_len", "\"2048\"", "without quotes"),
        ("models[1].preset", "\"gpt3-175\"", "gpt3-175b"),
        ("training.micro_batch_sizes[1]", "3]", ""),
        ("cluster.devices", "-4", "at least 0"),
        ("cluster.hbm[0]", "80]", "\"80 GiB\""),
        ("cluster.link_bandwidth", "4\n\n[search]", "\"4 GB/s\""),
        ("search.exhaustiv", "exhaustiv", "did you mean `exhaustive`"),
        ("search.schedule_gap", "\"1%\"", "a number"),
    ];
    for (field, needle, says) in expect {
        let e = find(&d, field);
        assert_eq!((e.line, e.column), at(src, needle), "{field}: {e:#?}");
        let text = format!("{} {}", e.message, e.help.as_deref().unwrap_or(""));
        assert!(text.contains(says), "{field}: `{says}` not in {text:?}");
    }
    assert_eq!(d.len(), 10, "{d:#?}");
}

/// Every problem the schema finds in `instance`, as "location: what" (the leaves of the
/// validator's error tree).
fn schema_errors(instance: &serde_json::Value) -> Vec<String> {
    fn leaves(e: &boon::ValidationError) -> Vec<String> {
        if e.causes.is_empty() {
            vec![format!("{}: {}", e.instance_location, e.kind)]
        } else {
            e.causes.iter().flat_map(leaves).collect()
        }
    }
    let mut schemas = boon::Schemas::new();
    let mut compiler = boon::Compiler::new();
    compiler
        .add_resource(schema::SCHEMA_ID, json_schema())
        .unwrap();
    let index = compiler.compile(schema::SCHEMA_ID, &mut schemas).unwrap();
    match schemas.validate(instance, index) {
        Ok(()) => Vec::new(),
        Err(e) => leaves(&e),
    }
}

/// Every example spec of `config/specs` and the embedded default: (name, text).
fn example_specs() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/specs");
    let mut texts: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    texts.push(("default".into(), DEFAULT_SPEC.to_string()));
    texts
}

/// Every example spec (and the embedded default) is valid by the schema an editor uses.
#[test]
fn the_schema_accepts_every_example_spec() {
    let texts = example_specs();
    assert!(texts.len() >= 10);
    for (name, text) in texts {
        let v: serde_json::Value = toml::from_str(&text).unwrap();
        let errors = schema_errors(&v);
        assert!(errors.is_empty(), "{name}: {errors:#?}");
    }
    let schema = json_schema();
    assert_eq!(schema["$id"], schema::SCHEMA_ID);
    let defs = schema["$defs"].as_object().unwrap();
    assert!(
        defs.keys().all(|k| !k.starts_with("Raw")),
        "{:?}",
        defs.keys()
    );
    assert!(!schema.to_string().contains("\"null\""), "TOML has no null");
}

/// The ten mistakes of `ten_mistakes_give_ten_located_errors_in_one_run`, as an editor's
/// schema check sees them: all but the one that relates two fields (a micro-batch that
/// must divide the global batch), which only the validator can see.
#[test]
fn the_schema_catches_the_mistakes_a_schema_can() {
    let src = TEN_MISTAKES;
    let v: serde_json::Value = toml::from_str(src).unwrap();
    let errors = schema_errors(&v);
    let found = |location: &str, says: &str| {
        errors
            .iter()
            .any(|e| e.starts_with(&format!("{location}: ")) && e.contains(says))
    };
    for (location, says) in [
        ("", "descripton"),
        ("/models/0", "max_tensor_paralel"),
        ("/models/0/seq_len", "string"),
        ("/models/1/preset", "gpt3-175"),
        ("/cluster/devices", "-4"),
        ("/cluster/hbm/0", "number"),
        ("/cluster/link_bandwidth", "number"),
        ("/search", "exhaustiv"),
        ("/search/schedule_gap", "string"),
    ] {
        assert!(
            found(location, says),
            "no `{says}` at `{location}` in {errors:#?}"
        );
    }
    assert!(
        !errors.iter().any(|e| e.contains("micro_batch_sizes")),
        "{errors:#?}"
    );
    // A quantity's unit is checked by pattern, and a model without a preset must give
    // its shape.
    let v: serde_json::Value = toml::from_str(
        "schema_version = 1\nname = \"x\"\n[[models]]\nname = \"mine\"\nlayers = 2\n[cluster]\nhbm = [\"80 GB/s\"]\n",
    )
    .unwrap();
    let errors = schema_errors(&v);
    assert!(
        errors.iter().any(|e| e.starts_with("/cluster/hbm/0: ")),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("/models/0: ") && e.contains("hidden")),
        "{errors:#?}"
    );
}

/// `--print-resolved` writes a spec: read back, every example gives the same search (the
/// same models, training, cluster, space, cost models and fixed plan), and writing it again
/// gives the same text — also with a model's objective weight, the tokens objective,
/// recompute modules, some blocks recomputed and activations offloaded.
#[test]
fn the_resolved_spec_reads_back_as_the_same_search() {
    let mut texts = example_specs();
    texts.push((
        "weighed".into(),
        GOOD.replace(
            "max_tensor_parallel = 8\n",
            "max_tensor_parallel = 8\nweight = 2.5\n",
        )
        .replace("[search]\n", "[search]\nobjective = \"tokens_per_second\"\n")
        .replace(
            "optimizer = \"adam\"\n",
            "optimizer = \"adam\"\nactivation_recomputation = [\"selective\"]\nrecompute_modules = [\"core_attn\", \"mlp\"]\n",
        ),
    ));
    // The two Megatron-Bridge runs that offload activations and recompute some blocks.
    let validation =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/validation");
    for run in [
        "bridge2511-gb200-llama3-70b-fsdp.toml",
        "bridge2511-h100-llama3-8b-fsdp.toml",
    ] {
        let text = std::fs::read_to_string(validation.join(run)).unwrap();
        assert!(text.contains("activation_offload_layers") || text.contains("recompute_layers"));
        texts.push((run.into(), text));
    }
    for (file, text) in texts {
        let spec = parse(&text, &file).unwrap_or_else(|d| panic!("{file}: {d:#?}"));
        let out = resolved(&spec);
        let again = parse(&out, "resolved.toml")
            .unwrap_or_else(|d| panic!("{file}: the resolved spec is invalid: {d:#?}\n{out}"));
        assert_eq!(again.models, spec.models, "{file}\n{out}");
        assert_eq!(again.training, spec.training, "{file}\n{out}");
        assert_eq!(again.cluster, spec.cluster, "{file}\n{out}");
        assert_eq!(again.space, spec.space, "{file}\n{out}");
        assert_eq!(again.cost_model, spec.cost_model, "{file}\n{out}");
        assert_eq!(again.estimate, spec.estimate, "{file}\n{out}");
        assert_eq!(resolved(&again), out, "{file}");
        assert!(again.defaulted_sections().is_empty(), "{file}: {out}");
    }
}

/// The untagged types' messages are the constants `explain_table` recognises.
#[test]
fn untagged_messages_are_the_recognised_ones() {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Axis {
        a: raw::RawAxis<u32>,
    }
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Area {
        a: raw::RawAreaBudget,
    }
    let axis = toml::from_str::<Axis>("a = true").err().unwrap();
    assert_eq!(axis.message().trim(), raw::AXIS_EXPECTING);
    let area = toml::from_str::<Area>("a = true").err().unwrap();
    assert_eq!(area.message().trim(), raw::AREA_BUDGET_EXPECTING);
}

/// A typo inside a nested table is one error with a suggestion (not also a "missing
/// field"), and inside an untagged value (an area budget, an axis range) too.
#[test]
fn nested_typos_get_one_error_with_a_suggestion() {
    let src = r#"schema_version = 1
name = "nested"
[[models]]
preset = "gpt3-175b"
baseline = { pipline = 32, data = 8, tensor = 4 }
[search]
area_budget = { reference_config = { tensor_core = 8, vector_cores = 2, width = 128, depth = 128, buffer = "128 MiB" } }
tensor_cores = { min = 1, mx = 8 }
"#;
    let d = errors(src);
    for (field, suggestion) in [
        ("models[0].baseline.pipline", "`pipeline`"),
        (
            "search.area_budget.reference_config.tensor_core",
            "`tensor_cores`",
        ),
        ("search.tensor_cores.mx", "`max`"),
    ] {
        let e = find(&d, field);
        assert!(
            e.help
                .as_deref()
                .unwrap_or("")
                .contains(&format!("did you mean {suggestion}")),
            "{e:#?}"
        );
    }
    assert_eq!(d.len(), 3, "{d:#?}");
}

/// `attention` and `causal`: presets of 2023 on default to flash, older ones and custom
/// models to unfused; BERT is not causal; a spec may set either; a wrong kernel lists both.
#[test]
fn attention_and_causal_default_by_preset_and_can_be_set() {
    use archplace_engine::model::AttentionKernel;
    let s = parse(GOOD, "good.toml").unwrap();
    assert_eq!(s.models[0].config.attention, AttentionKernel::Unfused);
    assert!(s.models[0].config.causal);
    let llama = GOOD.replace("preset = \"gpt3-175b\"", "preset = \"llama3-8b\"");
    let s = parse(&llama, "llama.toml").unwrap();
    assert_eq!(s.models[0].config.attention, AttentionKernel::Flash);
    let set = GOOD.replace(
        "max_tensor_parallel = 8\n",
        "max_tensor_parallel = 8\nattention = \"flash\"\ncausal = false\n",
    );
    let s = parse(&set, "set.toml").unwrap();
    assert_eq!(s.models[0].config.attention, AttentionKernel::Flash);
    assert!(!s.models[0].config.causal);
    let bert = GOOD
        .replace("preset = \"gpt3-175b\"", "preset = \"bert-large\"")
        .replace("baseline = { pipeline = 32, data = 8, tensor = 4 }\n", "");
    let s = parse(&bert, "bert.toml").unwrap();
    assert!(!s.models[0].config.causal);
    let wrong = GOOD.replace(
        "max_tensor_parallel = 8\n",
        "max_tensor_parallel = 8\nattention = \"fused\"\n",
    );
    let d = errors(&wrong);
    let e = find(&d, "models[0].attention");
    let text = e.to_string() + &format!("{:?}", e.help);
    assert!(text.contains("unfused") && text.contains("flash"), "{text}");
}

/// A FlashAttention kernel takes head dimensions up to 256: beyond, the spec is refused at
/// the key that made it so, with the numbers.
#[test]
fn flash_attention_refuses_a_head_dimension_its_kernels_do_not_take() {
    let wide = GOOD.replace(
        "preset = \"gpt3-175b\"\nmax_tensor_parallel = 8\n",
        "preset = \"llama3-8b\"\nheads = 8\nkv_heads = 8\nmax_tensor_parallel = 8\n",
    );
    let d = errors(&wide);
    let e = find(&d, "models[0].heads");
    assert!(
        e.message
            .contains("up to 256; this model's is 512 (hidden size 4096 over 8 heads)"),
        "{e:?}"
    );
    let custom = GOOD.replace(
        "preset = \"gpt3-175b\"\nmax_tensor_parallel = 8\n",
        "layers = 2\nhidden = 4096\nheads = 8\nvocab = 1000\nseq_len = 512\nattention = \"flash\"\n",
    )
    .replace("baseline = { pipeline = 32, data = 8, tensor = 4 }\n", "");
    let d = errors(&custom);
    assert!(
        find(&d, "models[0].attention")
            .message
            .contains("up to 256")
    );
    // Unfused attention takes any head dimension.
    parse(&custom.replace("\"flash\"", "\"unfused\""), "ok.toml").unwrap();
}

/// `gb200-nvl72` is a cluster of GB200s, 72 to an NVLink domain: 1,024 devices are not whole
/// racks, 16 devices sit in one rack's domain, 144 fill two.
#[test]
fn an_nvl72_cluster_is_racks_of_72_on_nvlink() {
    let with = |devices: u64| {
        GOOD.replace(
            "devices = 1024\nlink_bandwidth = \"4 GiB/s\"\nhbm = [\"32 GiB\", \"64 GiB\", \"80 GiB\"]",
            &format!("devices = {devices}\npreset = \"gb200-nvl72\""),
        )
        .replace("baseline = { pipeline = 32, data = 8, tensor = 4 }", "")
    };
    let d = errors(&with(1024));
    let e = find(&d, "cluster.node_size");
    assert!(e.message.contains("72 devices per node"), "{e:?}");
    for devices in [16, 144] {
        let s = parse(&with(devices), "t.toml").unwrap();
        let n = s.cluster.network;
        assert_eq!(n.node_size, 72);
        assert_eq!(n.intra_node.bytes_per_second, 900e9 * (370.0 / 450.0));
        assert_eq!(n.inter_node.bytes_per_second, 50e9);
        assert_eq!(s.cluster.hbm_bytes, vec![186 << 30]);
    }
}

/// A schedule named in `[plan]` runs its own chunks, whatever `[training]`'s interleavings
/// (the implied schedule is kept unsaid, however written); a schedule listed twice in
/// `[training]` is a mistake at its place.
#[test]
fn a_named_schedule_takes_its_own_chunks_and_a_listed_one_counts_once() {
    let with = |training: &str, plan: &str| {
        format!("{GOOD}{PLAN}")
            .replace(
                "optimizer = \"adam\"",
                &format!("optimizer = \"adam\"\n{training}"),
            )
            .replace("micro_batch = 1\n", &format!("micro_batch = 1\n{plan}\n"))
    };
    let plan = |src: &str| parse(src, "t.toml").unwrap().estimate.unwrap().plan;
    let interleavings = "pipeline_interleaving = [2, 1]";
    let named = plan(&with(interleavings, "pipeline_schedule = \"zero-bubble\""));
    assert_eq!(
        (named.interleaving, named.schedule()),
        (1, PipelineSchedule::ZeroBubble)
    );
    let one = plan(&with(interleavings, "pipeline_schedule = \"1f1b\""));
    assert_eq!(
        (one.interleaving, one.schedule()),
        (1, PipelineSchedule::OneFOneB)
    );
    // Unsaid, the plan takes [training]'s first interleaving and the schedule it implies,
    // the same plan as when the implied schedule is said.
    let unsaid = plan(&with(interleavings, ""));
    assert_eq!(
        (unsaid.interleaving, unsaid.schedule()),
        (2, PipelineSchedule::Interleaved)
    );
    assert_eq!(
        unsaid,
        plan(&with(interleavings, "pipeline_schedule = \"interleaved\""))
    );
    let d = errors(&with(
        "pipeline_schedule = [\"1f1b\", \"zero-bubble\", \"1f1b\"]",
        "",
    ));
    let e = find(&d, "training.pipeline_schedule[2]");
    assert!(e.message.contains("listed twice"), "{e:?}");
}

/// The row-wise FP8 recipe is torchao's: said to run on Transformer Engine it is refused
/// at `fp8_library`; with torchao, or the key left out, accepted.
#[test]
fn the_row_wise_recipe_is_torchaos() {
    let base = include_str!("../../config/specs/estimate-llama3-8b-fsdp-h100.toml");
    let with = |keys: &str| {
        base.replace(
            "precision = \"bf16-mixed\"\n",
            &format!("precision = \"fp8-hybrid\"\nfp8_recipe = \"rowwise\"\n{keys}"),
        )
    };
    let d = errors(&with("fp8_library = \"transformer_engine\"\n"));
    let e = find(&d, "training.fp8_library");
    assert!(e.message.contains("torchao"), "{e:?}");
    for keys in ["fp8_library = \"torchao\"\n", ""] {
        let spec = parse(&with(keys), "s.toml").unwrap_or_else(|d| panic!("{keys}: {d:#?}"));
        assert_eq!(
            spec.training.fp8_scaling,
            archplace_engine::training::Fp8Scaling::Rowwise
        );
    }
}
/// `[training] cross_entropy` reaches the execution ("fused" when left out) and an unknown
/// one is refused at its key.
#[test]
fn the_loss_kernel_is_read_and_a_bad_one_located() {
    use archplace_engine::execution::CrossEntropy;
    let base = include_str!("../../config/specs/estimate-llama3-8b-fsdp-h100.toml");
    let with = |keys: &str| base.replace("[training]\n", &format!("[training]\n{keys}"));
    for (keys, want) in [
        ("", CrossEntropy::Fused),
        ("cross_entropy = \"fused\"\n", CrossEntropy::Fused),
        ("cross_entropy = \"eager\"\n", CrossEntropy::Eager),
        ("cross_entropy = \"unfused\"\n", CrossEntropy::Unfused),
    ] {
        let spec = parse(&with(keys), "s.toml").unwrap_or_else(|d| panic!("{keys}: {d:#?}"));
        assert_eq!(spec.training.execution.cross_entropy, want, "{keys}");
    }
    let d = errors(&with("cross_entropy = \"chunked\"\n"));
    let e = find(&d, "training.cross_entropy");
    assert!(e.message.contains("chunked"), "{e:?}");
}

/// Each shipped stack profile parses, names only shipped calibrations (with their errors),
/// and fills every `[training]` key an example spec leaves out with its value, while the
/// spec's own keys win; its calibration follows the GPU generation of the spec's presets
/// and gives way to one the spec names. Without `stack`, nothing changes.
#[test]
fn stacks_fill_the_training_keys_a_spec_leaves_out() {
    use archplace_engine::execution::TensorParallelOverlap;
    let base = include_str!("../../config/specs/estimate-llama3-8b-fsdp-h100.toml");
    let plain = parse(base, "s.toml").unwrap();
    assert_eq!(
        (plain.stack.as_ref(), plain.stack_calibration.as_ref()),
        (None, None)
    );
    assert_eq!(
        plain.training.execution,
        archplace_engine::execution::Execution::default()
    );
    for (name, text) in stack::SHIPPED {
        let profile = stack::Stack::parse(text).unwrap();
        assert_eq!(profile.name, name);
        for c in profile.calibrations.values() {
            let errors = stack::calibration_errors(c).unwrap_or_else(|| panic!("{c}"));
            assert!(errors.measurements > 0 && errors.leave_one_out.mean_percent > 0.0);
        }
        let with = base.replace("[training]\n", &format!("[training]\nstack = \"{name}\"\n"));
        let spec = parse(&with, "s.toml").unwrap_or_else(|d| panic!("{name}: {d:#?}"));
        assert_eq!(spec.stack.as_deref(), Some(name));
        let d = &profile.training;
        let t = &spec.training;
        let text_of = |k: &str| d.get(k).and_then(|v| v.as_str());
        assert_eq!(
            text_of("operator_execution"),
            Some(t.execution.operators.name())
        );
        assert_eq!(
            text_of("tensor_parallel_overlap"),
            Some(t.execution.tensor_parallel_overlap.name())
        );
        assert_eq!(
            text_of("kernel_fusion").unwrap_or("fused"),
            t.execution.kernels.name()
        );
        assert_eq!(
            text_of("fp8_library").unwrap_or("transformer_engine"),
            t.execution.fp8_library.name()
        );
        assert_eq!(
            text_of("cross_entropy").unwrap_or("fused"),
            t.execution.cross_entropy.name()
        );
        assert_eq!(
            text_of("context_parallel_exchange"),
            Some(t.context_exchange.method.name())
        );
        assert_eq!(
            d.get("data_parallel_overlap").and_then(|v| v.as_bool()),
            Some(t.data_parallel_overlap)
        );
        if let Some(z) = d.get("zero_stage").and_then(|v| v.as_integer()) {
            assert_eq!(t.zero_stages, vec![z as u64]);
        }
        assert_eq!(
            spec.stack_calibration.as_deref(),
            profile.calibration_for("h100"),
            "{name}"
        );
        // The spec's own keys win, and its own calibration.
        let own = with.replace(
            &format!("stack = \"{name}\"\n"),
            &format!("stack = \"{name}\"\ntensor_parallel_overlap = \"async\"\n"),
        );
        let spec = parse(&own, "s.toml").unwrap();
        assert_eq!(
            spec.training.execution.tensor_parallel_overlap,
            TensorParallelOverlap::Async
        );
        let calibrated = with.replace(
            "[cost_model]\n",
            "[cost_model]\ncalibration = \"mine.toml\"\n",
        );
        assert_eq!(
            parse(&calibrated, "s.toml").unwrap().stack_calibration,
            None
        );
    }
    // The generation picks the calibration: the A100 gets Megatron's 2022 one.
    let a100 = base
        .replace("[training]\n", "[training]\nstack = \"megatron-core\"\n")
        .replace("h100-sxm-80gb", "a100-sxm-80gb");
    let spec = parse(&a100, "s.toml").unwrap();
    assert_eq!(
        spec.stack_calibration.as_deref(),
        Some("a100-megatron-2022")
    );
    // And its defaults: Megatron-LM's as its A100 runs ran it, none of the H100 recipes'
    // overlaps — unless the spec says otherwise.
    let t = &spec.training;
    assert_eq!(
        (
            t.execution.tensor_parallel_overlap,
            t.data_parallel_overlap,
            t.pipeline_parallel_overlap,
            t.distributed_optimizer.clone()
        ),
        (TensorParallelOverlap::None, false, false, vec![false])
    );
    assert_eq!(t.context_exchange.method.name(), "ring");
    let own = a100.replace(
        "stack = \"megatron-core\"\n",
        "stack = \"megatron-core\"\ndata_parallel_overlap = true\n",
    );
    let t = parse(&own, "s.toml").unwrap().training;
    assert!(t.data_parallel_overlap);
    assert_eq!(
        t.execution.tensor_parallel_overlap,
        TensorParallelOverlap::None
    );
}

/// A profile gives the cost-model parameters its framework's runs set (Megatron-LM on A100:
/// `gpu-like`'s `fused_epilogues = false`) to a spec whose latency or area model is that
/// plugin and which leaves them out; not to another generation's, not to a spec of another
/// plugin, and never over the spec's own value.
#[test]
fn stacks_give_the_parameters_their_runs_set() {
    let base = include_str!("../../config/specs/estimate-llama3-8b-fsdp-h100.toml")
        .replace("[training]\n", "[training]\nstack = \"megatron-core\"\n");
    let epilogues = |text: &str| {
        parse(text, "s.toml").unwrap().cost_model.parameters["gpu-like"]
            .get("fused_epilogues")
            .cloned()
    };
    let a100 = base.replace("h100-sxm-80gb", "a100-sxm-80gb");
    assert_eq!(epilogues(&a100).as_deref(), Some("false"));
    assert_eq!(epilogues(&base), None);
    let own = a100.replace(
        "[cost_model.parameters.gpu-like]\n",
        "[cost_model.parameters.gpu-like]\nfused_epilogues = true\n",
    );
    assert_eq!(epilogues(&own).as_deref(), Some("true"));
    // A spec without a parameters table gets one; a spec of another plugin gets nothing.
    let bare = a100.replace(
        "[cost_model.parameters.gpu-like]\npreset = \"a100-sxm-80gb\"\n",
        "",
    );
    assert_eq!(epilogues(&bare).as_deref(), Some("false"));
    // Where the spec's own parameters are not a table, the stack says it cannot add them.
    let wrong = bare.replace("[cost_model]\n", "[cost_model]\nparameters = 5\n");
    let e = errors(&wrong);
    let d = find(&e, "training.stack");
    assert!(
        d.message
            .contains("cannot give the profile's `gpu-like` parameters"),
        "{}",
        d.message
    );
    let reference = bare.replace("\"gpu-like\"", "\"reference\"");
    let spec = parse(&reference, "s.toml").unwrap_or_else(|d| panic!("{d:#?}"));
    assert!(!spec.cost_model.parameters.contains_key("gpu-like"));
    // DeepSpeed's profile gives it on every generation.
    let deepspeed = base.replace("stack = \"megatron-core\"", "stack = \"deepspeed\"");
    assert_eq!(epilogues(&deepspeed).as_deref(), Some("false"));
}

/// A profile's generations are the presets' (a misspelt one would apply to no spec),
/// and a profile file's generation defaults reach a spec of that generation only.
#[test]
fn stack_generations_are_the_presets() {
    let megatron = stack::shipped("megatron-core").unwrap();
    let bad = megatron.replace(
        "[generations.a100.training]",
        "[generations.a1000.training]",
    );
    let e = stack::Stack::parse(&bad).unwrap_err();
    assert!(e.contains("\"a1000\"") && e.contains("a100, h100"), "{e}");
    let bad = megatron.replace("\nh200 = ", "\nh20 = ");
    assert!(stack::Stack::parse(&bad).unwrap_err().contains("\"h20\""));
    // The generation's key wins over the profile's; a generation without a section gets
    // the profile's own.
    use archplace_engine::execution::TensorParallelOverlap;
    let base = include_str!("../../config/specs/estimate-llama3-8b-fsdp-h100.toml")
        .replace("[training]\n", "[training]\nstack = \"megatron-core\"\n");
    let overlap = |text: &str| {
        parse(text, "s.toml")
            .unwrap()
            .training
            .execution
            .tensor_parallel_overlap
    };
    assert_eq!(
        overlap(&base.replace("h100-sxm-80gb", "a100-sxm-80gb")),
        TensorParallelOverlap::None
    );
    assert_eq!(overlap(&base), TensorParallelOverlap::Pipelined);
}

/// A stack that is neither shipped nor a readable profile, and a profile value that is
/// wrong, are reported at the spec's `stack` value; a profile file beside the spec works.
#[test]
fn stack_problems_are_located_at_the_stack() {
    let base = include_str!("../../config/specs/estimate-llama3-8b-fsdp-h100.toml");
    let named = |stack: &str| {
        base.replace(
            "[training]\n",
            &format!("[training]\nstack = \"{stack}\"\n"),
        )
    };
    let e = errors(&named("nemo"));
    let d = find(&e, "training.stack");
    assert!(
        d.message.contains("unknown stack \"nemo\""),
        "{}",
        d.message
    );
    assert_eq!((d.line, d.column), at(&named("nemo"), "\"nemo\""));
    let dir = tempfile::tempdir().unwrap();
    let spec_file = dir.path().join("s.toml");
    let spec_path = spec_file.display().to_string();
    let e = errors_at(&named("missing.toml"), &spec_path);
    assert!(
        find(&e, "training.stack")
            .message
            .contains("cannot read the stack profile")
    );
    let mine = stack::shipped("pytorch-fsdp")
        .unwrap()
        .replace("name = \"pytorch-fsdp\"", "name = \"mine\"")
        .replace(
            "context_parallel_exchange = \"all_gather\"",
            "context_parallel_exchange = \"spiral\"",
        );
    std::fs::write(dir.path().join("mine.toml"), &mine).unwrap();
    let e = errors_at(&named("mine.toml"), &spec_path);
    let d = find(&e, "training.context_parallel_exchange");
    assert_eq!((d.line, d.column), at(&named("mine.toml"), "\"mine.toml\""));
    std::fs::write(
        dir.path().join("mine.toml"),
        mine.replace("\"spiral\"", "\"ring\""),
    )
    .unwrap();
    let spec = parse(&named("mine.toml"), &spec_path).unwrap();
    assert_eq!(spec.stack.as_deref(), Some("mine.toml"));
    assert_eq!(spec.training.zero_stages, vec![3]);
}

/// A model shape key that could not be read does not silence the `[plan]`'s checks
/// against the model: its preset's value stands in (and the key's error says so). One read
/// but wrong leaves the shape unknown: the checks are skipped, and its error says that.
#[test]
fn plan_checks_use_the_presets_value_for_a_shape_key_that_could_not_be_read() {
    let spec = |layers: &str| {
        format!(
            "schema_version = 1\nname = \"skip\"\n[[models]]\npreset = \"llama2-7b\"\n{layers}\n\
             [cluster]\npreset = \"h100-sxm-80gb\"\ndevices = 16\n[training]\nglobal_batch = 64\n\
             [accelerator]\npreset = \"h100-sxm-80gb\"\n\
             [plan]\nmicro_batch = 1\ntensor_parallel = 3\npipeline_parallel = 2\ndata_parallel = 1\n"
        )
    };
    let helps = |d: &Diagnostic, text: &str| d.help.as_deref().is_some_and(|h| h.contains(text));
    let unread = errors(&spec("layers = \"many\""));
    let layers = find(&unread, "models[0].layers");
    assert!(helps(layers, "used the preset's value"), "{layers:?}");
    let t = find(&unread, "plan.tensor_parallel");
    assert!(t.message.contains("width 3"), "{t:?}");
    // Read, but out of range: the shape is unknown, and the error says the checks wait.
    let wrong = errors(&spec("layers = 0"));
    let layers = find(&wrong, "models[0].layers");
    assert!(
        helps(layers, "were skipped until it is fixed"),
        "{layers:?}"
    );
    assert!(
        !wrong.iter().any(|d| d.field == "plan.tensor_parallel"),
        "{wrong:#?}"
    );
}
