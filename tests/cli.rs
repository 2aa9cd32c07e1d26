//! End-to-end tests of the `archplace` binary: real processes, real files, stdout parsed
//! the way a script would.

use crate::util::*;
use std::path::Path;
use std::process::Command;

#[test]
fn validate_accepts_every_example_and_the_default() {
    let _gate = crate::util::shared();
    let o = run(&["validate"]);
    assert!(o.status.success(), "{o:?}");
    // Every example fits the daemon's default memory budget on eight threads.
    let mut args = vec![
        "validate".to_string(),
        "--memory-budget".into(),
        "3 GiB".into(),
        "--threads".into(),
        "8".into(),
    ];
    for e in std::fs::read_dir(root().join("config/specs")).unwrap() {
        args.push(e.unwrap().path().display().to_string());
    }
    let o = archplace().args(&args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

/// `-v` is archplace's own events; the WebAssembly runtime's internals (hundreds of lines
/// per plugin load) only at `-vvv`.
#[test]
fn verbose_shows_our_events_not_the_runtimes() {
    let _gate = crate::util::shared();
    let spec = root().join("config/specs/custom-tiny.toml");
    let spec = spec.to_str().unwrap();
    let count = |v: &str| {
        let o = archplace()
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .args([v, "validate", spec])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let e = stderr(&o);
        assert!(!e.contains("\u{1b}["), "colour despite NO_COLOR: {e}");
        e.lines().filter(|l| l.contains(" wasmtime")).count()
    };
    assert_eq!(count("-v"), 0);
    assert_eq!(count("-vv"), 0);
    assert!(count("-vvv") > 10);
}

/// A vendor's path, outside this repository: `plugin new` writes a project, cargo builds
/// it to a component in a temporary folder, `plugin check` passes, `plugin install` installs
/// it, and a spec uses it (validated and searched).
#[test]
fn a_plugin_from_plugin_new_builds_outside_the_repository_and_is_used() {
    let _gate = crate::util::shared();
    let tmp = tempfile::tempdir().unwrap();
    assert!(!tmp.path().starts_with(root().canonicalize().unwrap()));
    let o = run(&[
        "plugin",
        "new",
        "acme-npu",
        "--dir",
        tmp.path().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let project = tmp.path().join("acme-npu");
    let target = root().join("target/wasm/plugin-new");
    let built = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(project.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "the new project does not build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let wasm = target.join("wasm32-wasip2/release/acme_npu.wasm");
    let w = wasm.to_str().unwrap();
    let o = run(&["plugin", "check", w]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("`acme-npu` 0.1.0"), "{}", stdout(&o));
    let plugins = tmp.path().join("plugins");
    let o = run(&["plugin", "install", "--dir", plugins.to_str().unwrap(), w]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = format!(
        "{TINY}\n[cost_model]\nlatency = \"acme-npu\"\n[cost_model.parameters.acme-npu]\nclock = \"1.5 GHz\"\n"
    );
    let (sdir, spec) = temp_spec("acme.toml", &text);
    let spec = spec.to_str().unwrap();
    let dir = plugins.to_str().unwrap();
    let o = run(&["validate", "--plugin-dir", dir, spec]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = sdir.path().join("out");
    let o = run(&[
        "run",
        "--plugin-dir",
        dir,
        "--out",
        out.to_str().unwrap(),
        spec,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let result = read_json(&out.join("result.json"));
    assert!(
        result["cost_models"].to_string().contains("acme-npu"),
        "{}",
        result["cost_models"]
    );
}

/// Completions for each shell and a man page, from the parser's own definition.
#[test]
fn completions_and_man_page() {
    let _gate = crate::util::shared();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = run(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let out = stdout(&o);
        assert!(
            out.contains("validate") && out.contains("memory-budget"),
            "{shell}: {out}"
        );
    }
    let o = run(&["man"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let man = stdout(&o);
    assert!(
        man.starts_with(".ie") || man.contains(".TH archplace"),
        "{man}"
    );
    assert!(man.contains("validate"), "{man}");
    let o = run(&["completions", "tcsh"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

/// The first memory estimate counts every configuration of the axes a candidate; above the
/// budget, the space is enumerated and the estimate made again with the candidates the
/// area filter left (29,360 of the GPT-3 example's 75,712), and only then is the spec
/// refused — unless enumerating would not fit the budget either.
#[test]
fn a_search_above_the_budget_by_its_configurations_is_estimated_again_by_its_candidates() {
    let _gate = crate::util::shared();
    let spec = root().join("config/specs/gpt3-175b.toml");
    let spec = spec.to_str().unwrap();
    let validate = |budget: &str| {
        run(&[
            "validate",
            "--memory-budget",
            budget,
            "--threads",
            "1",
            spec,
        ])
    };
    let gib = |text: &str| -> f64 {
        let after = text.split("may need up to ").nth(1).expect(text);
        let number = after.split(" GiB").next().expect(text);
        number.parse().expect(text)
    };
    // Within the budget: the first estimate.
    let o = validate("64 GiB");
    assert!(o.status.success(), "{o:?}");
    let by_configurations = gib(&stdout(&o));
    // Below both estimates, enumerating fits: refused by the candidates' estimate.
    let o = validate("1 GiB");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = stderr(&o);
    assert!(
        err.contains("a summary of each of up to 29,360 candidates"),
        "{err}"
    );
    let by_candidates = gib(&err);
    assert!(by_candidates < by_configurations, "{err}");
    // Between the two: accepted, with the smaller estimate.
    let between = format!("{:.3} GiB", (by_candidates + by_configurations) / 2.0);
    let o = validate(&between);
    assert!(o.status.success(), "{between}: {o:?}");
    assert_eq!(gib(&stdout(&o)), by_candidates, "{}", stdout(&o));
    // Where the plugins alone are above the budget, the space is not enumerated.
    let o = validate("100 MiB");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        stderr(&o).contains("a summary of each of up to 75,712 candidates"),
        "{}",
        stderr(&o)
    );
}

/// A spec whose search may need more memory than the budget is refused before it starts,
/// with the estimate, its largest parts and what to change; under a larger
/// budget the same spec is accepted and its estimate printed.
#[test]
fn a_search_above_the_memory_budget_is_refused_with_the_numbers() {
    let _gate = crate::util::shared();
    let (dir, spec) = temp_spec("tiny.toml", TINY);
    let spec = spec.to_str().unwrap();
    let o = run(&[
        "validate",
        "--memory-budget",
        "200 MiB",
        "--threads",
        "1",
        spec,
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let out = stderr(&o);
    assert!(out.contains("above the memory budget of 200 MiB"), "{out}");
    assert!(out.contains("the cost-model plugins 512"), "{out}");
    assert!(out.contains("tiny.toml:19:1"), "located at [search]: {out}");
    assert!(
        out.contains("--memory-budget"),
        "says what to change: {out}"
    );
    let o = run(&[
        "validate",
        "--memory-budget",
        "4 GiB",
        "--threads",
        "1",
        spec,
    ]);
    assert!(o.status.success(), "{o:?}");
    assert!(
        stdout(&o).contains("may need up to")
            && stdout(&o).contains("of its 4 GiB memory budget on 1 thread(s)"),
        "{}",
        stdout(&o)
    );
    let out_dir = dir.path().join("out");
    let o = run(&[
        "run",
        "--memory-budget",
        "200 MiB",
        "--out",
        out_dir.to_str().unwrap(),
        spec,
    ]);
    assert!(!o.status.success(), "{o:?}");
    assert!(
        stderr(&o).contains("above the memory budget of 200 MiB"),
        "{}",
        stderr(&o)
    );
    assert!(!out_dir.exists(), "nothing searched, nothing written");
    let o = run(&["validate", "--memory-budget", "lots", spec]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}

#[test]
fn validate_reports_located_errors_and_exits_1() {
    let _gate = crate::util::shared();
    let text = "schema_version = 1\nname = \"bad\"\n\n[[models]]\npreset = \"gpt3-175b\"\nmax_tensor_parallel = 3\n\n[training]\nmicro_batch_sizes = [1, 3]\n\n[cluster]\nhbm = [\"80 GB/s\"]\n";
    let (_dir, path) = temp_spec("bad.toml", text);
    let p = path.display().to_string();
    let o = run(&["validate", &p]);
    assert_eq!(o.status.code(), Some(1));
    // Diagnostics on stderr; nothing on stdout.
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
    let out = stderr(&o);
    assert!(out.contains(&format!("{p}:6:23")), "{out}");
    assert!(out.contains(&format!("{p}:9:25")), "{out}");
    assert!(out.contains(&format!("{p}:12:8")), "{out}");
    assert!(
        out.contains("field: training.micro_batch_sizes[1]"),
        "{out}"
    );
    assert!(out.contains("3 error(s)"), "{out}");

    let o = run(&["validate", "--json", &p]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let errs = v.as_array().unwrap();
    assert_eq!(errs.len(), 3);
    let hbm = errs
        .iter()
        .find(|e| e["field"] == "cluster.hbm[0]")
        .unwrap();
    assert_eq!(
        (hbm["line"].as_u64(), hbm["column"].as_u64()),
        (Some(12), Some(8))
    );
    assert_eq!(hbm["file"], p.as_str());
}

#[test]
fn validate_survives_missing_and_binary_files() {
    let _gate = crate::util::shared();
    let (_dir, path) = temp_spec("bin.toml", "");
    std::fs::write(&path, [0xff, 0xfe, 0x00, 0x41]).unwrap();
    let o = run(&[
        "validate",
        "/nonexistent/spec.toml",
        &path.display().to_string(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let out = stderr(&o);
    assert!(out.contains("cannot read the file"), "{out}");
    assert!(out.contains("not valid UTF-8"), "{out}");
    // Located at the first bad byte, with a snippet, in text and JSON alike.
    std::fs::write(&path, b"schema_version = 1\nname = \"caf\xe9\"\n").unwrap();
    let o = run(&["validate", &path.display().to_string()]);
    let out = stderr(&o);
    assert!(out.contains("bin.toml:2:12"), "{out}");
    assert!(out.contains("^"), "a caret under the byte: {out}");
    let o = run(&["validate", "--json", &path.display().to_string()]);
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (d[0]["line"].as_u64(), d[0]["column"].as_u64()),
        (Some(2), Some(12))
    );
}

/// `validate` on the zero device (which never ends and claims
/// length 0) or a FIFO (whose open blocks until a writer comes) used to hang or grow
/// without bound; a spec beyond a megabyte was read whole. Each is refused at once now,
/// with what it is, and nothing of its contents.
#[test]
fn validate_refuses_devices_fifos_and_huge_files_at_once() {
    let _gate = crate::util::shared();
    let (dir, big) = temp_spec("big.toml", "");
    std::fs::write(&big, vec![b'#'; (1 << 20) + 1]).unwrap();
    let fifo = dir.path().join("fifo.toml");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let started = std::time::Instant::now();
    let o = run(&[
        "validate",
        "/dev/zero",
        &fifo.display().to_string(),
        &big.display().to_string(),
    ]);
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(1));
    let out = stderr(&o);
    assert!(out.contains("not a regular file (a device)"), "{out}");
    assert!(out.contains("not a regular file (a FIFO)"), "{out}");
    assert!(out.contains("larger than 1048576 bytes"), "{out}");
}

#[test]
fn schema_is_the_checked_in_copy() {
    let _gate = crate::util::shared();
    let o = run(&["schema"]);
    assert!(o.status.success());
    let printed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let file: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("config/spec.schema.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(printed, file);
    assert!(printed["properties"]["training"].is_object());
    // Measurements files' schema likewise.
    let o = run(&["calibrate", "--schema"]);
    assert!(o.status.success());
    let printed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let file: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("config/measurements.schema.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(printed, file);
    assert!(printed["properties"]["measurement"].is_object());
}

#[test]
fn model_prints_tables_and_json() {
    let _gate = crate::util::shared();
    let o = run(&["model"]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert!(
        out.contains(
            "bert-large — 335,143,938 parameters in all, 335,143,938 active per token; micro-batch 4, tensor-parallel width 1"
        ),
        "{out}"
    );
    assert!(out.contains("335,143,938"), "{out}");

    let spec = root()
        .join("config/specs/gpt3-175b.toml")
        .display()
        .to_string();
    let o = run(&["model", &spec, "--json", "--micro-batch", "2"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let reports = v.as_array().unwrap();
    let widths: Vec<u64> = reports
        .iter()
        .map(|r| r["tensor_parallel"].as_u64().unwrap())
        .collect();
    assert_eq!(widths, [1, 2, 4, 8]);
    let t1 = &reports[0];
    assert_eq!(t1["micro_batch"], 2);
    let layers: Vec<&str> = t1["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["layer"].as_str().unwrap())
        .collect();
    assert_eq!(layers, ["embedding", "block", "head"]);
    assert_eq!(t1["layers"][1]["count"], 96);
    let params = t1["totals"]["parameters_per_rank"].as_f64().unwrap();
    assert!((params / 174.6e9 - 1.0).abs() < 0.005, "{params}");
}

#[test]
fn space_lists_the_reference_space() {
    let _gate = crate::util::shared();
    let spec = root()
        .join("config/specs/gpt3-175b.toml")
        .display()
        .to_string();
    // `--json` is one document.
    let o = run(&["space", &spec, "--json", "--limit", "5"]);
    assert!(o.status.success(), "{o:?}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["candidates"].as_array().unwrap().len(), 5);
    assert_eq!(doc["summary"]["candidates"], 29_360);
    // `--jsonl` streams a line per candidate, then the summary.
    let o = run(&["space", &spec, "--jsonl"]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 29_360 + 1);
    let first = &lines[0];
    assert_eq!(
        (
            first["tensor_cores"].as_u64(),
            first["vector_cores"].as_u64(),
            first["width"].as_u64(),
            first["buffer_bytes"].as_u64()
        ),
        (Some(8), Some(2), Some(128), Some(128 << 20))
    );
    assert!((first["area_mm2"].as_f64().unwrap() - 278.826_676_31).abs() < 1e-6);
    assert_eq!(
        first["area_um2"].as_f64().unwrap(),
        first["area_mm2"].as_f64().unwrap() * 1e6
    );
    let summary = lines.last().unwrap();
    assert_eq!(summary["summary"], true);
    assert_eq!(summary["candidates"], 29_360);
    assert_eq!(summary["distinct_tensor_core_configs"], 4_186);
    assert_eq!(summary["distinct_vector_core_configs"], 697);
    assert_eq!(summary["area_buckets"], 13_506);
    // Visit order: area buckets never increase.
    let buckets: Vec<u64> = lines[..lines.len() - 1]
        .iter()
        .map(|l| l["bucket"].as_u64().unwrap())
        .collect();
    assert!(buckets.windows(2).all(|w| w[0] >= w[1]));
}

#[test]
fn space_text_output_and_limit() {
    let _gate = crate::util::shared();
    let spec = root()
        .join("config/specs/custom-tiny.toml")
        .display()
        .to_string();
    let o = run(&["space", &spec, "--limit", "3"]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 1 + 3 + 2, "{out}");
    assert!(out.contains("candidates of"), "{out}");
    assert!(o.stderr.is_empty() || !String::from_utf8_lossy(&o.stderr).contains("error"));
}

#[test]
fn an_invalid_spec_fails_model_and_space_cleanly() {
    let _gate = crate::util::shared();
    let (_dir, path) = temp_spec(
        "x.toml",
        "schema_version = 2\nname = \"x\"\n[[models]]\npreset = \"bert-large\"\n",
    );
    let p = path.display().to_string();
    for cmd in ["model", "space"] {
        let o = run(&[cmd, &p]);
        assert_eq!(o.status.code(), Some(1), "{cmd}");
        assert!(o.stdout.is_empty(), "{cmd}: stdout must stay clean");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("{p}:1:18")), "{cmd}: {err}");
    }
}

#[test]
fn run_writes_result_files_and_a_summary() {
    let _gate = crate::util::shared();
    let text = TINY;
    let (dir, spec) = temp_spec("tiny.toml", text);
    let out = dir.path().join("out");
    let o = run(&[
        "run",
        &spec.display().to_string(),
        "--out",
        &out.display().to_string(),
        "--threads",
        "2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = stdout(&o);
    assert!(summary.contains("best chip:"), "{summary}");
    let result = read_json(&out.join("result.json"));
    assert_eq!(result["spec"]["name"], "e2e-tiny");
    assert_eq!(result["spec"]["content_hash"].as_str().unwrap().len(), 64);
    assert_eq!(result["cost_models"]["latency"]["name"], "reference");
    let best = &result["best"];
    assert!(best["configuration"]["area_mm2"].as_f64().unwrap() > 0.0);
    let plan = &best["models"][0];
    assert!(plan["throughput_samples_per_second"].as_f64().unwrap() > 0.0);
    let tokens = plan["throughput_tokens_per_second"].as_f64().unwrap();
    let samples = plan["throughput_samples_per_second"].as_f64().unwrap();
    assert!(
        (tokens / (samples * 64.0) - 1.0).abs() < 1e-12,
        "{tokens} vs {samples}"
    );
    assert_eq!(result["search"]["candidates_evaluated"], 2);
    let block = &plan["layers"][1];
    assert_eq!(block["layer"], "block");
    assert!(
        block["forward_proven_optimal"].is_boolean()
            && block["backward_gap"].as_f64().unwrap() >= 0.0
    );
    // Each plan explains itself: time parts that add up, memory parts, training choices.
    let time: f64 = plan["time"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .sum();
    let per_batch = plan["time_per_batch_seconds"].as_f64().unwrap();
    assert!(((time - per_batch) / per_batch).abs() < 1e-9, "{plan}");
    assert!(plan["memory_bytes"]["optimizer"].as_f64().unwrap() > 0.0);
    assert!(plan["limiting"].is_string() && plan["recomputation"].is_string());
    assert!(summary.contains("limited by"), "{summary}");
    // The parameters used, defaults included, and the spec with its defaults filled in.
    assert!(result["cost_model_parameters"]["reference"]["clock"].is_string());
    assert!(result["near_ties"].is_array());
    let filled: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("spec.json")).unwrap()).unwrap();
    assert_eq!(filled["name"], "e2e-tiny");
    assert!(filled["training"]["precisions"].is_array());
    let explored = std::fs::read_to_string(out.join("explored.jsonl")).unwrap();
    assert_eq!(explored.lines().count(), 2);
    for line in explored.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["configuration"]["tensor_cores"].is_u64());
        for p in v["plans"].as_array().unwrap() {
            assert!(p["time"]["forward_seconds"].is_f64(), "{p}");
            assert!(p["memory_bytes"]["total"].is_f64(), "{p}");
        }
    }
    // --json prints result.json itself.
    let o = run(&[
        "run",
        &spec.display().to_string(),
        "--out",
        &out.display().to_string(),
        "--json",
    ]);
    assert!(o.status.success());
    let printed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        printed["best"]["configuration"],
        result["best"]["configuration"]
    );
}

/// The texts of an SVG file, after checking that it is well-formed XML with an `svg` root
/// in the SVG namespace and a size.
fn svg_texts(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not well-formed: {e}", path.display()));
    let svg = doc.root_element();
    assert_eq!(svg.tag_name().name(), "svg", "{}", path.display());
    assert_eq!(
        svg.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    assert!(svg.attribute("width").is_some() && svg.attribute("viewBox").is_some());
    doc.descendants()
        .filter(|n| n.tag_name().name() == "text")
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn run_of_the_default_spec_draws_pareto_and_placement_svgs() {
    let _gate = crate::util::shared();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(&["run", "--out", &out.display().to_string(), "--threads", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let result = read_json(&out.join("result.json"));
    let best = &result["best"];
    let evaluated = result["search"]["candidates_evaluated"].as_u64().unwrap();

    let pareto = svg_texts(&out.join("pareto.svg"));
    for want in [
        "default-bert-large — throughput against chip area",
        "chip area (mm²)",
        "throughput, mean over the models (samples/s)",
        "Pareto frontier (",
        "reference configuration: 8 TC 128×128, 2 VC ×128, 128 MiB",
        &format!(
            "— {:.1} mm², {:.4} samples/s",
            best["configuration"]["area_mm2"].as_f64().unwrap(),
            best["mean_throughput_samples_per_second"].as_f64().unwrap()
        ),
    ] {
        assert!(
            pareto.contains(want),
            "pareto.svg lacks {want:?}:\n{pareto}"
        );
    }
    // Every evaluated candidate that fits is a point.
    let fitting = std::fs::read_to_string(out.join("explored.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| !l.contains("\"mean_throughput_samples_per_second\":null"))
        .count();
    assert!(fitting > 0 && fitting as u64 <= evaluated);
    assert!(
        pareto.contains(&format!("evaluated candidates ({fitting}")),
        "{pareto}"
    );
    let svg = std::fs::read_to_string(out.join("pareto.svg")).unwrap();
    assert!(svg.matches("<circle").count() >= fitting, "{svg}");

    let placement = svg_texts(&out.join("placement.svg"));
    let plan = &best["models"][0];
    let stages = plan["pipeline_stages"].as_u64().unwrap();
    for want in [
        format!(
            "bert-large: {stages} pipeline stages, t = {} (tensor), d = {} (data)",
            plan["tensor_parallel"], plan["data_parallel"]
        ),
        "time (ms)".to_string(),
        "memory (GiB)".to_string(),
        "HBM limit 32 GiB".to_string(),
        format!("{stages} stages from embedding to head"),
    ] {
        assert!(
            placement.contains(&want),
            "placement.svg lacks {want:?}:\n{placement}"
        );
    }
}

#[test]
fn run_reports_when_nothing_fits() {
    let _gate = crate::util::shared();
    let text = "schema_version = 1\nname = \"nofit\"\n[[models]]\npreset = \"gpt2-xl\"\n[training]\nmicro_batch_sizes = [1]\nactivation_recomputation = [false]\n[cluster]\ndevices = 1\nhbm = [\"1 MiB\"]\n[search]\ntensor_cores = [1]\nvector_cores = [1]\nwidth = [8]\ndepth = [8]\nbuffer = [\"2 MiB\"]\nmin_area_fraction = 0.0\n";
    let (dir, spec) = temp_spec("nofit.toml", text);
    let out = dir.path().join("out");
    let o = run(&[
        "run",
        &spec.display().to_string(),
        "--out",
        &out.display().to_string(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout(&o).contains("no candidate can train"));
    let result = read_json(&out.join("result.json"));
    assert!(result["best"].is_null());
}

#[test]
fn plugin_check_passes_good_components_and_names_what_is_wrong_with_bad_ones() {
    let _gate = crate::util::shared();
    for name in ["reference", "gpu-like", "template"] {
        let c = component(name);
        let o = run(&["plugin", "check", "--json", c.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(r["fit"], true, "{r}");
        assert_eq!(r["interface"], "archplace:cost-model@1.3.0");
        assert_eq!(r["deterministic_as_claimed"], true);
        assert_eq!(r["blake3"].as_str().unwrap().len(), 64);
        assert!(r["operators_estimated"].as_u64().unwrap() >= 940, "{r}");
        assert!(
            r["operators_with_memory_time"].as_u64().unwrap() >= 940,
            "{r}"
        );
        assert_eq!(r["operators_without_memory_time"], 0, "{r}");
    }
    // A plugin of interface 1.0 is fit, with a warning that it reports no memory times.
    let c = component("interface-1-0");
    let o = run(&["plugin", "check", c.to_str().unwrap()]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("archplace:cost-model@1.0.0"), "{out}");
    assert!(out.contains("memory times   0 of 940"), "{out}");
    assert!(
        out.contains("940 of 940 operators have no memory time"),
        "{out}"
    );
    // Text output for people.
    let c = component("reference");
    let o = run(&["plugin", "check", c.to_str().unwrap()]);
    let out = stdout(&o);
    assert!(out.contains("verdict        fit to use"), "{out}");
    assert!(out.contains("parameter      clock = \"1.05 GHz\""), "{out}");
    for (fixture, reason) in [
        ("hostile-trap", "deliberate panic in latency"),
        ("hostile-infinite-loop", "ran out of fuel"),
        ("hostile-memory-bomb", "exceeded its memory limit"),
        ("hostile-nan-output", "returned NaN s"),
        ("hostile-negative-output", "returned -1 s"),
        (
            "hostile-wrong-count",
            "returned 17 results for 16 operators",
        ),
        ("hostile-enormous-output", "error message of 33554432 bytes"),
        ("hostile-memory-over-latency", "returned a memory time of"),
        (
            "hostile-wrong-interface-version",
            "built for archplace:cost-model@2.0.0",
        ),
        ("hostile-missing-export", "does not have export `info`"),
    ] {
        let c = component(fixture);
        let o = run(&["plugin", "check", c.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{fixture}");
        let err = stderr(&o);
        assert!(err.contains("is not fit to use"), "{fixture}: {err}");
        assert!(err.contains(reason), "{fixture}: {err}");
    }
}

#[test]
fn plugins_are_installed_listed_and_used_by_a_spec() {
    let _gate = crate::util::shared();
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    let d = plugins.to_str().unwrap();
    let template = component("template");
    let o = run(&[
        "plugin",
        "install",
        "--pin",
        "--dir",
        d,
        template.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("installed `my-cost-model` 0.1.0"),
        "{}",
        stdout(&o)
    );
    let manifest =
        std::fs::read_to_string(plugins.join("my-cost-model-0.1.0/plugin.toml")).unwrap();
    assert!(manifest.contains("blake3 = "), "{manifest}");
    let o = run(&["plugin", "list", "--json", "--plugin-dir", d]);
    let cat: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let names: Vec<&str> = cat["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["manifest"]["name"].as_str())
        .collect();
    // `--plugin-dir` adds to the default folders (the built reference plugin is there too).
    assert!(
        names.contains(&"my-cost-model") && names.contains(&"reference"),
        "{names:?}"
    );
    // The same component again: fine, and the pin stays; a folder the commands do not
    // search by default is named with what to give them.
    let o = run(&["plugin", "install", "--dir", d, template.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("give `--plugin-dir {d}` to later commands")),
        "{}",
        stderr(&o)
    );
    let manifest =
        std::fs::read_to_string(plugins.join("my-cost-model-0.1.0/plugin.toml")).unwrap();
    assert!(manifest.contains("blake3 = "), "pin kept: {manifest}");
    // A different component under the same name and version: refused without --force.
    let installed = plugins.join("my-cost-model-0.1.0/my-cost-model.wasm");
    let before = std::fs::read(&installed).unwrap();
    std::fs::write(&installed, std::fs::read(component("gpu-like")).unwrap()).unwrap();
    // `plugin list` marks the pinned plugin whose file changed.
    let o = run(&["plugin", "list", "--plugin-dir", d]);
    let changed = stdout(&o)
        .lines()
        .find(|l| l.starts_with("my-cost-model"))
        .unwrap_or_default()
        .to_string();
    assert!(
        changed.contains("pinned component changed"),
        "{}",
        stdout(&o)
    );
    let o = run(&["plugin", "list", "--plugin-dir", d, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pins: Vec<(String, serde_json::Value)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["manifest"]["name"].as_str().unwrap().to_string(),
                e["pin_matches"].clone(),
            )
        })
        .collect();
    assert!(
        pins.contains(&("my-cost-model".into(), serde_json::json!(false))),
        "{pins:?}"
    );
    let o = run(&["plugin", "install", "--dir", d, template.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("a different component is installed as `my-cost-model` 0.1.0"),
        "{}",
        stderr(&o)
    );
    let o = run(&[
        "plugin",
        "install",
        "--force",
        "--dir",
        d,
        template.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&installed).unwrap(), before);
    let manifest =
        std::fs::read_to_string(plugins.join("my-cost-model-0.1.0/plugin.toml")).unwrap();
    assert!(manifest.contains("blake3 = "), "pin kept: {manifest}");

    // A spec that takes its latency model from the installed plugin.
    let tiny = TINY;
    let text = format!(
        "{tiny}\n[cost_model]\narea = \"reference\"\nlatency = \"my-cost-model\"\n[cost_model.parameters.my-cost-model]\nclock = \"2 GHz\"\n"
    );
    let (sdir, spec) = temp_spec("tiny.toml", &text);
    let out = sdir.path().join("out");
    let reference_dir = root().join("target/plugins");
    let o = run(&[
        "run",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--plugin-dir",
        d,
        "--plugin-dir",
        reference_dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let result = read_json(&out.join("result.json"));
    assert_eq!(result["cost_models"]["latency"]["name"], "my-cost-model");
    assert_eq!(result["cost_models"]["area"]["name"], "reference");
    assert_eq!(
        result["cost_models"]["latency_source"]["blake3"]
            .as_str()
            .unwrap()
            .len(),
        64
    );

    // A parameter the plugin rejects: located in the spec, no search.
    let bad = text.replace("clock = \"2 GHz\"", "clock = \"2 GB\"");
    let (_bdir, bspec) = temp_spec("bad.toml", &bad);
    let b = bspec.to_str().unwrap();
    let o = run(&[
        "validate",
        b,
        "--plugin-dir",
        d,
        "--plugin-dir",
        reference_dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let line = bad
        .lines()
        .position(|l| l.starts_with("clock = \"2 GB\""))
        .unwrap()
        + 1;
    assert!(
        stderr(&o).contains(&format!("{b}:{line}:9")),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("field: cost_model.parameters.my-cost-model.clock"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_hostile_plugin_fails_only_its_search_with_the_plugin_and_fault_named() {
    let _gate = crate::util::shared();
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    let d = plugins.to_str().unwrap();
    install_unchecked(&plugins, "hostile-nan-output", "hostile-nan-output");
    let tiny = TINY;
    let (sdir, spec) = temp_spec(
        "tiny.toml",
        &format!("{tiny}\n[cost_model]\narea = \"reference\"\nlatency = \"hostile-nan-output\"\n"),
    );
    let out = sdir.path().join("out");
    let reference_dir = root().join("target/plugins");
    let args = |spec: &str, out: &str| {
        vec![
            "run".to_string(),
            spec.to_string(),
            "--out".into(),
            out.to_string(),
            "--plugin-dir".into(),
            d.to_string(),
            "--plugin-dir".into(),
            reference_dir.display().to_string(),
        ]
    };
    let o = archplace()
        .args(args(spec.to_str().unwrap(), out.to_str().unwrap()))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("plugin `hostile-nan-output`"), "{err}");
    assert!(err.contains("bad_output fault"), "{err}");
    assert!(err.contains("returned NaN s"), "{err}");
    assert!(!out.join("result.json").exists());
    // The same setup with a good plugin searches fine.
    let (gdir, good) = temp_spec("good.toml", tiny);
    let gout = gdir.path().join("out");
    let o = archplace()
        .args(args(good.to_str().unwrap(), gout.to_str().unwrap()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(gout.join("result.json").exists());
}

/// A reader that stops early (`archplace schema | head -1`) ends the command quietly and
/// successfully, as ripgrep does: no "Broken pipe" on stderr, exit 0. The outputs are
/// larger than a pipe's buffer, so the writer does meet the closed pipe.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let _gate = crate::util::shared();
    use std::io::Read;
    for args in [&["schema"][..], &["space"][..], &["space", "--json"][..]] {
        let mut child = archplace()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 16];
        child.stdout.take().unwrap().read_exact(&mut first).unwrap();
        // The read end is dropped here: every later write fails with EPIPE.
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {:?} {}",
            out.status,
            stderr(&out)
        );
        assert!(
            !stderr(&out).contains("Broken pipe"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn estimate_explains_a_step_and_its_memory() {
    let _gate = crate::util::shared();
    let spec = root().join("config/specs/estimate-a100.toml");
    let spec = spec.display().to_string();
    let o = run(&["--plugin-dir", &plugin_dir(), "estimate", &spec, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let step = v["step_seconds"].as_f64().unwrap();
    assert!(step > 0.0, "{v}");
    let m = &v["memory_bytes"];
    let part = |k: &str| m[k].as_f64().unwrap();
    assert_eq!(
        part("total"),
        part("weights") + part("gradients") + part("optimizer") + part("activations")
    );
    // fp16 mixed-precision Adam: 20 bytes per parameter of the most loaded stage.
    let stage = &v["stages"][v["memory_stage"].as_u64().unwrap() as usize];
    let params = stage["parameters"].as_f64().unwrap();
    assert_eq!(
        part("weights") + part("gradients") + part("optimizer"),
        20.0 * params
    );
    // The time parts add up to the step.
    let t = v["time"].as_object().unwrap();
    let sum: f64 = t.values().map(|x| x.as_f64().unwrap()).sum();
    assert!(((sum - step) / step).abs() < 1e-9, "{t:?} vs {step}");
    assert!(v["model_flops_utilisation"].as_f64().unwrap() > 0.0);
    assert!(v["energy_per_step_joules"].as_f64().unwrap() > 0.0);
    // The HBM is busy for part of the chip's time (forward, backward, recomputation).
    let chip: f64 = ["forward", "backward", "recomputation"]
        .iter()
        .map(|k| t[&format!("{k}_seconds")].as_f64().unwrap())
        .sum();
    let busy = v["hbm_busy_seconds"].as_f64().unwrap();
    assert!(
        busy > 0.0 && busy <= chip * (1.0 + 1e-12),
        "{busy} of {chip}"
    );
    // The same in text, for people.
    let o = run(&["--plugin-dir", &plugin_dir(), "estimate", &spec]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for needle in [
        "step time",
        "pipeline bubble",
        "optimizer state",
        "MFU",
        "limiting:",
        "HBM busy",
        "the chip is limited by its compute",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    // A latency model of interface 1.0 reports no memory times: nothing is made up.
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    install_unchecked(&plugins, "interface-1-0", "interface-1-0");
    let base = std::fs::read_to_string(&spec).unwrap();
    let (_sdir, old) = temp_spec(
        "old.toml",
        &base.replace("latency = \"gpu-like\"", "latency = \"interface-1-0\""),
    );
    let o = run(&[
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--plugin-dir",
        &plugin_dir(),
        "estimate",
        old.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("the latency model does not report memory times"),
        "{text}"
    );
    assert!(!text.contains("HBM busy"), "{text}");
}

/// The Mixture-of-Experts example answers with what a performance engineer reads first: the
/// step, tokens per second per device, the all-to-all in the time breakdown and the memory
/// by kind of state; the parameters a token goes through.
#[test]
fn estimate_of_the_mixtral_example_shows_its_all_to_all_and_memory() {
    let _gate = crate::util::shared();
    let spec = root().join("config/specs/estimate-mixtral-8x7b-h100.toml");
    let spec = spec.display().to_string();
    let o = run(&["--plugin-dir", &plugin_dir(), "estimate", &spec, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let step = v["step_seconds"].as_f64().unwrap();
    let per_device = v["tokens_per_second_per_device"].as_f64().unwrap();
    let tokens = v["global_batch"].as_f64().unwrap() * 4096.0;
    let devices = v["devices"].as_f64().unwrap();
    assert!(((per_device * step * devices - tokens) / tokens).abs() < 1e-9);
    assert!(
        v["time"]["all_to_all_seconds"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert!(v["operator_seconds"]["all_to_all"].as_f64().unwrap() > 0.0);
    let m = &v["memory_bytes"];
    let part = |k: &str| m[k].as_f64().unwrap();
    assert_eq!(
        part("total"),
        part("weights") + part("gradients") + part("optimizer") + part("activations")
    );
    let (total, active) = (
        v["parameters"].as_f64().unwrap(),
        v["active_parameters"].as_f64().unwrap(),
    );
    assert!(active < total / 3.0, "{active} of {total}");
    assert!(v.get("mtp_parameters").is_none());
}

/// The long-sequence example with each context-parallel exchange `estimate` takes — the
/// ring, the all-gather and Ulysses' all-to-all — at a layout Ulysses can run (Llama 3
/// 70B's 8 key-value heads over t × CP = 4 × 2): each prices its exchange, says which it
/// ran, and its step adds up; at t = 8 the all-to-all is refused with the heads' numbers.
#[test]
fn estimate_prices_each_context_parallel_exchange() {
    let _gate = crate::util::shared();
    let path = root().join("config/specs/estimate-llama3-70b-128k-cp-h100.toml");
    let base = std::fs::read_to_string(&path)
        .unwrap()
        .replace("tensor_parallel = 8", "tensor_parallel = 4")
        .replace("context_parallel = 16", "context_parallel = 2")
        .replace("data_parallel = 1", "data_parallel = 16");
    let plugins = plugin_dir();
    let estimate = |text: &str, json: bool| {
        let (_dir, spec) = temp_spec("cp.toml", text);
        let spec = spec.display().to_string();
        let mut args = vec!["--plugin-dir", &plugins, "estimate", &spec];
        if json {
            args.push("--json");
        }
        run(&args)
    };
    for (method, words) in [
        ("ring", "ring attention"),
        ("all_gather", "all-gathered"),
        ("all_to_all", "Ulysses all-to-all"),
    ] {
        let text = base.replace(
            "[plan]\n",
            &format!("[plan]\ncontext_parallel_exchange = \"{method}\"\n"),
        );
        let o = estimate(&text, true);
        assert!(o.status.success(), "{method}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        // The exchange's whole time; exposed, all of it but with the ring (overlapped).
        let whole = v["operator_seconds"]["context_parallel"].as_f64().unwrap();
        let exposed = v["time"]["context_parallel_communication_seconds"]
            .as_f64()
            .unwrap();
        assert!(whole > 0.0, "{method}: {v}");
        if method != "ring" {
            assert!(
                (exposed - whole).abs() < 1e-12 * whole,
                "{method}: {exposed} vs {whole}"
            );
        }
        let parts: f64 = v["time"]
            .as_object()
            .unwrap()
            .values()
            .filter_map(serde_json::Value::as_f64)
            .sum();
        let step = v["step_seconds"].as_f64().unwrap();
        assert!(
            (parts - step).abs() < 1e-9 * step,
            "{method}: {parts} vs {step}"
        );
        let o = estimate(&text, false);
        assert!(stdout(&o).contains(words), "{method}: {}", stdout(&o));
    }
    let refused = std::fs::read_to_string(&path).unwrap().replace(
        "[plan]\n",
        "[plan]\ncontext_parallel_exchange = \"all_to_all\"\n",
    );
    let o = estimate(&refused, false);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("64 heads and 8 key-value heads do not divide among them"),
        "{}",
        stderr(&o)
    );
}

/// `estimate --json` of a spec given as text (in a temporary folder), which must succeed.
fn estimate_json(text: &str) -> serde_json::Value {
    let (_dir, spec) = temp_spec("spec.toml", text);
    let o = run(&[
        "--plugin-dir",
        &plugin_dir(),
        "estimate",
        &spec.display().to_string(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// `fp8_recipe` on the FP8 example (Llama-3-70B, H100, t = 4): every recipe accepted by
/// `estimate` and recorded in its plan; the casts cost least with delayed scaling (the
/// norms write theirs), then block-wise scales (kernels of their own, each reading its
/// input once), then per-tensor current scaling (kernels of their own, those after a GEMM
/// or FlashAttention reading their input twice), then row-wise scales (every one reading
/// twice, and the backward products rescaled by kernels of their own); the GEMMs the same
/// for all but row-wise, whose backward GEMMs take no epilogue (the rescaling follows
/// them).
#[test]
fn estimate_takes_every_fp8_recipe_and_prices_its_casts() {
    let _gate = crate::util::shared();
    let path = root().join("config/specs/estimate-llama3-70b-h100.toml");
    let base = std::fs::read_to_string(&path).unwrap();
    assert!(base.contains("fp8_recipe = \"tensorwise\"\n"));
    let mut seen = Vec::new();
    for recipe in ["delayed", "blockwise", "tensorwise", "rowwise"] {
        let text = base.replace(
            "fp8_recipe = \"tensorwise\"\n",
            &format!("fp8_recipe = \"{recipe}\"\n"),
        );
        let v = estimate_json(&text);
        // The plan says the recipe but for the default (delayed).
        let named = match recipe {
            "delayed" => serde_json::Value::Null,
            "tensorwise" => "current".into(),
            r => r.into(),
        };
        assert_eq!(v["plan"]["fp8_scaling"], named, "{v}");
        let f = |a: &str, b: &str| v[a][b].as_f64().unwrap();
        seen.push((
            recipe,
            f("operator_seconds", "casts"),
            f("operator_seconds", "other_gemm"),
            v["step_seconds"].as_f64().unwrap(),
        ));
    }
    let casts: Vec<f64> = seen.iter().map(|s| s.1).collect();
    assert!(casts.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert!(seen[..3].iter().all(|s| s.2 == seen[0].2), "{seen:?}");
    assert!(seen[3].2 <= seen[0].2, "{seen:?}");
    // The older key says the same.
    let v =
        estimate_json(&base.replace("fp8_recipe = \"tensorwise\"", "fp8_scaling = \"current\""));
    assert_eq!(v["step_seconds"].as_f64().unwrap(), seen[2].3);
}

/// `recompute_modules` (Megatron-LM's `--recompute-modules`) on the FP8 example with
/// selective recomputation: the plan records the modules; "layernorm" keeps less than the
/// attention core alone at almost no time, "mlp" far less again at the cost of the MLP's
/// forward pass run twice (its GEMMs: the hardware FLOPs grow, the model's do not).
#[test]
fn estimate_takes_recompute_modules_and_prices_them() {
    let _gate = crate::util::shared();
    let path = root().join("config/specs/estimate-llama3-70b-h100.toml");
    let base = std::fs::read_to_string(&path).unwrap();
    assert!(base.contains("recomputation = \"none\"\n"));
    let with = |modules: &str| {
        let v = estimate_json(&base.replace(
            "recomputation = \"none\"\n",
            &format!("recomputation = \"selective\"\n{modules}"),
        ));
        let f = |a: &str, b: &str| v[a][b].as_f64().unwrap();
        let g = |a: &str| v[a].as_f64().unwrap();
        (
            v["plan"]["recompute_modules"].clone(),
            f("memory_bytes", "activations"),
            g("step_seconds"),
            g("hardware_flops_per_step"),
            g("model_flops_per_step"),
        )
    };
    let core = with("");
    let norms = with("recompute_modules = [\"core_attn\", \"layernorm\"]\n");
    let mlp = with("recompute_modules = [\"core_attn\", \"mlp\"]\n");
    assert_eq!(core.0, serde_json::Value::Null);
    assert_eq!(mlp.0, serde_json::json!(["core_attn", "mlp"]));
    assert!(
        mlp.1 < norms.1 && norms.1 < core.1,
        "{core:?} {norms:?} {mlp:?}"
    );
    assert!(
        norms.2 < core.2 * 1.01 && core.2 < mlp.2,
        "{core:?} {norms:?} {mlp:?}"
    );
    assert_eq!(norms.3, core.3);
    assert!(mlp.3 > core.3 * 1.1, "{core:?} {mlp:?}");
    assert_eq!(mlp.4, core.4);
}

/// The FP8 example (Llama-3-70B on 64 H100s, Megatron-Bridge's published layout) answers
/// with its casts in the breakdowns and its weights' quantised copies in memory, faster
/// than the same plan in bf16 by what FP8 GEMMs give on the H100 and no more; a latency
/// plugin of interface 1.1 cannot be told an element type and is refused for it, naming
/// the version, before anything runs.
#[test]
fn estimate_of_the_fp8_example_shows_its_casts_and_refuses_an_untyped_plugin() {
    let _gate = crate::util::shared();
    let path = root().join("config/specs/estimate-llama3-70b-h100.toml");
    let base = std::fs::read_to_string(&path).unwrap();
    let estimate = estimate_json;
    let fp8 = estimate(&base);
    let bf16 = estimate(
        &base
            .replace("precision = \"fp8-hybrid\"", "precision = \"bf16-mixed\"")
            .replace("fp8_recipe = \"tensorwise\"\n", "")
            .replace("fp8_param_gather = true\n", ""),
    );
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    let speedup =
        f(&fp8, "tokens_per_second_per_device") / f(&bf16, "tokens_per_second_per_device");
    // NVIDIA's performance tuning guide: FP8 gives 1.2–1.5× over BF16 (less where the
    // GEMMs are a smaller share); never the GEMMs' 2×.
    assert!((1.2..1.6).contains(&speedup), "{speedup}");
    assert!(fp8["time"]["weight_cast_seconds"].as_f64().unwrap() > 0.0);
    assert!(fp8["operator_seconds"]["casts"].as_f64().unwrap() > 0.0);
    assert_eq!(bf16["time"]["weight_cast_seconds"].as_f64().unwrap(), 0.0);
    let stage = &fp8["stages"][0];
    let quantised = stage["quantised_parameters"].as_f64().unwrap();
    // The blocks' GEMM weights: all but the embedding, the norms and the routers.
    assert!(quantised > 0.0 && quantised < stage["parameters"].as_f64().unwrap());
    let weights =
        |v: &serde_json::Value| v["stages"][0]["memory_bytes"]["weights"].as_f64().unwrap();
    // FP8 parameters: each GEMM weight in FP8 with its transpose (2 bytes) instead of
    // bf16 (2 bytes); without them the bf16 weight stays and the copies add 2 bytes.
    assert_eq!(weights(&fp8), weights(&bf16));
    let copies = estimate(&base.replace("fp8_param_gather = true\n", ""));
    assert_eq!(weights(&copies), weights(&bf16) + 2.0 * quantised);
    assert!(
        fp8["memory_bytes"]["activations"].as_f64().unwrap()
            < bf16["memory_bytes"]["activations"].as_f64().unwrap()
    );
    // A plugin of interface 1.1 cannot be told FP8: refused at the precision.
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    install_unchecked(&plugins, "interface-1-1", "interface-1-1");
    let (_sdir, old) = temp_spec(
        "old.toml",
        &base.replace("latency = \"gpu-like\"", "latency = \"interface-1-1\""),
    );
    let o = run(&[
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--plugin-dir",
        &plugin_dir(),
        "estimate",
        old.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("training.precision")
            && err.contains("interface 1.1")
            && err.contains("interface 1.2 or later"),
        "{err}"
    );
}

#[test]
fn estimate_answers_a_plan_that_cannot_run_with_the_numbers() {
    let _gate = crate::util::shared();
    let base = std::fs::read_to_string(root().join("config/specs/estimate-a100.toml")).unwrap();
    // The whole model on one pipeline stage: 145.6 B / 8 parameters × 20 bytes.
    let text = base
        .replace("pipeline_parallel = 8", "pipeline_parallel = 1")
        .replace("data_parallel = 24", "data_parallel = 192");
    let (_dir, spec) = temp_spec("oom.toml", &text);
    let spec = spec.display().to_string();
    let o = run(&["--plugin-dir", &plugin_dir(), "estimate", &spec, "--json"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["feasible"], false);
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("needs ") && reason.contains("HBM is 80.0 GiB"),
        "{reason}"
    );
    assert!(v["memory_bytes"]["total"].as_f64().unwrap() > 80.0 * (1u64 << 30) as f64);
    // A plan the model cannot be split into is a located spec error.
    let text = base.replace("pipeline_parallel = 8", "pipeline_parallel = 7");
    let (_dir, spec) = temp_spec("bad.toml", &text);
    let o = run(&["estimate", &spec.display().to_string()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("plan.pipeline_parallel") && err.contains("80 blocks"),
        "{err}"
    );
}

#[test]
fn estimate_op_prices_one_operator() {
    let _gate = crate::util::shared();
    let spec = root().join("config/specs/estimate-a100.toml");
    let spec = spec.display().to_string();
    let o = run(&[
        "--plugin-dir",
        &plugin_dir(),
        "estimate",
        "op",
        &spec,
        "--gemm",
        "2048x12288x12288",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let seconds = v["seconds"].as_f64().unwrap();
    let cycles = v["cycles"].as_f64().unwrap();
    assert!((cycles / seconds / 1.41e9 - 1.0).abs() < 1e-9, "{v}");
    let rate = v["flops_per_second"].as_f64().unwrap();
    assert!(rate > 100e12 && rate < 312e12, "{rate}");
    let o = run(&[
        "--plugin-dir",
        &plugin_dir(),
        "estimate",
        "op",
        &spec,
        "--vector",
        "softmax",
        "--elements",
        "100663296",
        "--row",
        "2048",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // In words and units, no Rust structures.
    let text = stdout(&o);
    assert!(
        text.starts_with("softmax of 100,663,296 elements in rows of 2,048 on 108 vector cores of 64 lanes, 40 MiB buffer"),
        "{text}"
    );
    assert!(
        text.contains("\ntime    ") && text.contains("\nenergy  "),
        "{text}"
    );
    assert!(
        !text.contains('{') && !text.contains("CoreConfig"),
        "{text}"
    );
    let o = run(&[
        "estimate",
        "op",
        &spec,
        "--vector",
        "sofmax",
        "--elements",
        "8",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("softmax"), "{}", stderr(&o));
}

/// `archplace explain DIR` says why the winner wins from the folder's files alone: what
/// limits it, the chips it beat with what limits them and what differs, and its
/// neighbours along each axis — the same explanation the run put in `result.json` and its
/// summary.
#[test]
fn explain_says_why_the_winner_wins() {
    let _gate = crate::util::shared();
    let (dir, path) = temp_spec("explain.toml", &eight_layers("explain", true));
    let out = dir.path().join("out");
    let o = run(&[
        "run",
        path.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary = stdout(&o);
    let o = run(&["explain", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for needle in [
        "why: tiny is limited by",
        "differs in: ",
        "sensitivity (neighbours of the winner",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
        assert!(summary.contains(needle), "{needle}: {summary}");
    }
    assert!(
        text.contains("next best (") || text.contains("near-tie ("),
        "{text}"
    );
    let o = run(&["explain", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let result = read_json(&out.join("result.json"));
    assert_eq!(e, result["explanation"]);
    let rivals = e["rivals"].as_array().unwrap();
    assert!(!rivals.is_empty());
    for r in rivals {
        let rel = r["relative_to_best"].as_f64().unwrap();
        assert!(rel > 0.0 && rel <= 1.0, "{r}");
    }
    // The reference model reports memory times: the chip's share is named by the busier of
    // its compute and its HBM bandwidth, with the HBM's busy fraction.
    for l in e["best"].as_array().unwrap() {
        let f = l["hbm_busy_fraction"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&f), "{l}");
        let r = l["resource"].as_str().unwrap();
        assert!(!r.contains("compute and HBM"), "{l}");
        if r.starts_with("the chip") {
            let want = if f >= 0.5 { "HBM bandwidth" } else { "compute" };
            assert!(r.ends_with(want), "{l}");
        }
    }
    assert!(text.contains("of the chip's time"), "{text}");
    // Every axis the space varies has the winner's neighbours (the search was exhaustive).
    let axes: Vec<&str> = e["sensitivities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["axis"].as_str().unwrap())
        .collect();
    for axis in ["tensor_cores", "vector_cores", "width", "depth"] {
        assert!(axes.contains(&axis), "{axis}: {axes:?}");
    }
    // A folder without results is an error with the path.
    let o = run(&["explain", dir.path().to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("result.json"), "{}", stderr(&o));
}

/// `archplace model --preset NAME` shows a preset without a spec, with its parameters in
/// all and per token; `--preset list` lists every preset; an unknown one is refused with
/// the list.
#[test]
fn model_shows_a_preset_and_lists_them_all() {
    let _gate = crate::util::shared();
    let o = run(&["model", "--preset", "llama3-70b"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains(
            "llama3-70b — 70,553,706,496 parameters in all, 70,553,706,496 active per token"
        ),
        "{text}"
    );
    let o = run(&["model", "--preset", "list", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 17, "{rows:?}");
    let mixtral = rows.iter().find(|r| r["preset"] == "mixtral-8x7b").unwrap();
    assert_eq!(mixtral["parameters_total"], 46_702_792_704u64, "{mixtral}");
    assert_eq!(mixtral["parameters_active"], 12_879_925_248u64, "{mixtral}");
    let l405 = rows.iter().find(|r| r["preset"] == "llama3-405b").unwrap();
    assert_eq!(l405["parameters_total"], 405_853_388_800u64, "{l405}");
    assert_eq!(l405["seq_len"], 8192, "{l405}");
    let o = run(&["model", "--preset", "llama4"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no model preset `llama4`; presets: bert-large"),
        "{}",
        stderr(&o)
    );
}

/// `archplace model --ops` lists a block's operators in words with FLOPs and bytes, and the
/// tensors kept for the backward pass, which add up to the block's stash.
#[test]
fn model_lists_a_blocks_operators_and_what_it_keeps() {
    let _gate = crate::util::shared();
    let spec = root().join("config/specs/custom-tiny.toml");
    let spec = spec.to_str().unwrap();
    let o = run(&["model", spec, "--ops"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("GEMM 1024×768×512 (0.8 GFLOP)"), "{text}");
    assert!(text.contains("silu of 1,441,792 elements"), "{text}");
    assert!(
        text.contains("kept for the backward pass: 30.75 MiB per micro-batch"),
        "{text}"
    );
    let o = run(&["model", spec, "--ops", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let plain = run(&["model", spec, "--json"]);
    let p: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    for (ops, report) in v.as_array().unwrap().iter().zip(p.as_array().unwrap()) {
        let kept: u64 = ops["kept_for_backward"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(kept, report["layers"][1]["stash_bytes"].as_u64().unwrap());
        let flops: f64 = ops["operators"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["flops"].as_f64().unwrap())
            .sum();
        let want = report["layers"][1]["forward_matmul_flops"]
            .as_f64()
            .unwrap();
        assert!((flops - want).abs() <= 1e-9 * want, "{flops} {want}");
    }
}

/// `archplace validate --json` on the spec with a mistake of every kind: one run reports
/// each planted mistake at its line (the plugin host's own words for the unknown cost model
/// and the bad parameter), and nothing else.
#[test]
fn validate_reports_every_planted_spec_mistake_in_one_run() {
    let _gate = crate::util::shared();
    let spec = root().join("tests/fixtures/spec/many-mistakes.toml");
    assert_reports_planted_mistakes(&[], &spec);
}

/// An estimate spec with fifteen mistakes, among them a misspelt key and a value of the
/// wrong kind in its model: every one reported in one run — the [plan]'s widths, stages,
/// expert and context parallelism against the model's shape too — each at its line, with
/// the nearest valid word where a word was misspelt.
#[test]
fn validate_reports_every_planted_plan_mistake_in_one_run() {
    let _gate = crate::util::shared();
    let spec = root().join("tests/fixtures/spec/plan-mistakes.toml");
    assert_reports_planted_mistakes(&[], &spec);
}

/// The same for a daemon config with a mistake of every kind: values that cannot be read
/// (unknown keys with a did-you-mean, wrong types) and the rules between the values that
/// could, with snippets, in one run.
#[test]
fn validate_reports_every_planted_config_mistake_in_one_run() {
    let _gate = crate::util::shared();
    let config = root().join("tests/fixtures/config/many-mistakes.toml");
    assert_reports_planted_mistakes(&["--config"], &config);
    let o = run(&["validate", "--config", config.to_str().unwrap()]);
    let err = stderr(&o);
    assert!(err.contains("^^^^^^^^^^"), "snippets: {err}");
    assert!(err.contains("17 error(s)"), "{err}");
}

/// `archplace calibrate` writes a calibration file; `estimate --calibration` applies a
/// shipped one and reports the step with its interval and the calibration's values; a
/// calibration for another version of the plugin is refused with both named; ranges a
/// spec declares give an interval that brackets the estimate.
#[test]
fn calibrate_writes_a_calibration_and_estimate_applies_it_with_an_interval() {
    let _gate = crate::util::shared();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("a100-2022.calibration.toml");
    let measurements = root().join("tests/fixtures/validation/measurements-a100-2022.toml");
    let o = run(&[
        "calibrate",
        measurements.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    let c = archplace_spec::calibration::Calibration::parse(&text).unwrap();
    assert_eq!(c.plugin.name, "gpu-like");
    assert_eq!(c.draws.len(), 200);
    assert!(
        stdout(&o).contains("Korthikanti et al. 2022, Table 5"),
        "{}",
        stdout(&o)
    );

    let spec = root().join("config/specs/estimate-a100.toml");
    let shipped = root().join("calibrations/a100-megatron-2021.toml");
    let o = run(&[
        "estimate",
        spec.to_str().unwrap(),
        "--calibration",
        shipped.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let step = j["step_seconds"].as_f64().unwrap();
    let [lo, hi] = [0, 1].map(|i| j["step_seconds_interval"][i].as_f64().unwrap());
    assert!(
        lo < hi && lo <= step * 1.02 && step <= hi * 1.02,
        "{lo} {step} {hi}"
    );
    assert_eq!(j["uncertainty"]["from"][0], "calibration");
    assert_eq!(
        j["calibration"]["parameters"][0]["parameter"],
        "gpu-like.matrix_efficiency"
    );
    // Calibrated, the 145.6B run is slower than uncalibrated: the A100 2021 stack is
    // slower than the presets' microbenchmarks.
    let plain = run(&["estimate", spec.to_str().unwrap(), "--json"]);
    let p: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(
        step > p["step_seconds"].as_f64().unwrap() * 1.05,
        "{step} vs {}",
        p["step_seconds"]
    );
    assert!(p.get("step_seconds_interval").is_none());

    // Made for another version: refused, both named.
    let other = dir.path().join("other.calibration.toml");
    std::fs::write(
        &other,
        text.replacen("version = \"0.1.0\"", "version = \"0.0.9\"", 1),
    )
    .unwrap();
    let o = run(&[
        "estimate",
        spec.to_str().unwrap(),
        "--calibration",
        other.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("made for latency model `gpu-like 0.0.9`") && e.contains("`gpu-like 0.1.0`"),
        "{e}"
    );

    // Declared ranges: an interval around the estimate, from the ranges.
    let ranged = dir.path().join("ranged.toml");
    std::fs::write(
        &ranged,
        std::fs::read_to_string(&spec).unwrap()
            + "\n[cost_model.uncertainty.gpu-like]\nmatrix_efficiency = [\"0.80\", \"0.92\"]\n",
    )
    .unwrap();
    let o = run(&["estimate", ranged.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let step = j["step_seconds"].as_f64().unwrap();
    let [lo, hi] = [0, 1].map(|i| j["step_seconds_interval"][i].as_f64().unwrap());
    assert!(lo < step && step < hi, "{lo} {step} {hi}");
    assert_eq!(j["uncertainty"]["from"][0], "ranges");
}

/// `archplace calibrate` on measurements the model cannot explain — each of two runs
/// measured once 50% slower than the model and once 20% faster — says so in three ways:
/// the parameters the measurements do not determine are held at the specs' values (each
/// named with its bootstrap range), the calibration does not help (left out, its
/// measurements are predicted no better than uncalibrated), and the model cannot explain
/// the measurements (the worst named); `estimate --calibration` repeats the verdicts.
#[test]
fn calibrate_says_when_it_does_not_help_and_the_model_cannot_explain() {
    let _gate = crate::util::shared();
    let dir = tempfile::tempdir().unwrap();
    let validation = root().join("tests/fixtures/validation");
    let mut text = String::from("schema_version = 1\n");
    for model in ["22b", "175b"] {
        let spec = validation.join(format!("korthikanti2022-{model}-full.toml"));
        let o = run(&["estimate", spec.to_str().unwrap(), "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let step = v["step_seconds"].as_f64().unwrap();
        for (run, times) in [(1, 1.5), (2, 0.8)] {
            text.push_str(&format!(
                "[[measurement]]\nsource = \"a trial\"\nlabel = \"{model}, run {run}\"\nspec = {:?}\nmetric = \"step_seconds\"\nvalue = {}\n",
                spec.to_str().unwrap(),
                step * times
            ));
        }
    }
    let measurements = dir.path().join("trial.toml");
    std::fs::write(&measurements, text).unwrap();
    let out = dir.path().join("trial.calibration.toml");
    let o = run(&[
        "calibrate",
        measurements.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let said = stdout(&o);
    for want in [
        "gpu-like.matrix_efficiency: the measurements do not determine it (its bootstrap 90% range was",
        "held at the specs' value",
        "warning: the calibration does not help: left out of the fit",
        "warning: the model cannot explain these measurements: fitted, they are still missed by",
        "the worst: ",
    ] {
        assert!(said.contains(want), "{want}\n{said}");
    }
    let spec = validation.join("korthikanti2022-22b-full.toml");
    let o = run(&[
        "estimate",
        spec.to_str().unwrap(),
        "--calibration",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let said = stdout(&o);
    assert!(
        said.contains("  warning: the calibration does not help")
            && said.contains("  warning: the model cannot explain these measurements"),
        "{said}"
    );
    // A shipped calibration helps and explains its measurements: no warning.
    let shipped = root().join("calibrations/a100-megatron-2022.toml");
    let o = run(&[
        "estimate",
        spec.to_str().unwrap(),
        "--calibration",
        shipped.to_str().unwrap(),
    ]);
    assert!(!stdout(&o).contains("warning:"), "{}", stdout(&o));
}

/// `scripts/measure-gpu --synthetic` (no GPU: roofline timings) writes a measurements file
/// of every kind of operator the script times on a GPU, with its spec, the machine and the
/// timings archplace does not fit, in two halves; `archplace calibrate` reads it, fits the
/// per-operator parameters and predicts each half from the other. (Not run on a GPU here:
/// CI has none.)
#[test]
fn measure_gpu_writes_a_file_calibrate_reads() {
    let _gate = crate::util::shared();
    let dir = tempfile::tempdir().unwrap();
    let o = std::process::Command::new("python3")
        .arg(root().join("scripts/measure-gpu"))
        .args(["--synthetic", "--name", "h200-test", "--out"])
        .arg(dir.path())
        .output()
        .expect("python3 runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let path = dir.path().join("h200-test.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let ms = doc["measurement"].as_array().unwrap();
    let has = |needle: &str| ms.iter().any(|m| m["op"].to_string().contains(needle));
    for needle in [
        "\"bf16\"",
        "\"fp8\"",
        "attention",
        "backward = true",
        "layer_norm",
        "rms_norm",
        "softmax",
        "gelu",
        "silu",
        "embedding",
    ] {
        assert!(has(needle), "no operator with {needle}");
    }
    assert!(
        ms.iter()
            .all(|m| m["metric"].as_str() == Some("op_seconds"))
    );
    assert!(
        doc["machine"]["gpu"]
            .as_str()
            .unwrap()
            .contains("synthetic")
    );
    assert_eq!(doc["other"].as_array().unwrap().len(), 2);
    let out = dir.path().join("h200-test.calibration.toml");
    let o = run(&[
        "calibrate",
        path.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["errors"]["measurements"], ms.len());
    let sources: Vec<&str> = j["source"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["measure-gpu half 1", "measure-gpu half 2"]);
    // Calibrated, each half is predicted from the other better than uncalibrated.
    for s in j["source"].as_array().unwrap() {
        let u = s["uncalibrated"]["mean_percent"].as_f64().unwrap();
        let o = s["other_sources"]["mean_percent"].as_f64().unwrap();
        assert!(o < u, "{s}");
    }
}

/// A search whose spec declares ranges reports, for its best chips, their throughput
/// intervals and the probability that each is the best (summing to 1), in `result.json`
/// and the summary; the ranges cost a bounded number of candidate evaluations.
#[test]
fn a_search_with_ranges_reports_each_best_chips_odds() {
    let _gate = crate::util::shared();
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("ranged.toml");
    std::fs::write(
        &spec,
        std::fs::read_to_string(root().join("config/specs/gpu-like.toml")).unwrap()
            + "\n[cost_model.uncertainty.gpu-like]\nmatrix_efficiency = [\"0.6\", \"0.8\"]\nlaunch_overhead = [\"2 us\", \"6 us\"]\n",
    )
    .unwrap();
    let out = dir.path().join("r");
    let o = run(&[
        "run",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout(&o).contains("uncertainty (90% intervals, 1000 draws from ranges"),
        "{}",
        stdout(&o)
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    let u = &r["uncertainty"];
    let chips = u["chips"].as_array().unwrap();
    assert_eq!(chips.len(), 5);
    let total: f64 = chips
        .iter()
        .map(|c| c["best_probability"].as_f64().unwrap())
        .sum();
    assert!((total - 1.0).abs() < 1e-9, "{total}");
    assert_eq!(
        chips[0]["configuration"], r["best"]["configuration"],
        "the search's best first"
    );
    for c in chips {
        let t = c["mean_throughput_samples_per_second"].as_f64().unwrap();
        let [lo, hi] = [0, 1].map(|i| c["throughput_interval"][i].as_f64().unwrap());
        // GEMMs from 0.6 to 0.8 of peak around 0.7: the interval brackets the point.
        assert!(lo < t && t < hi, "{c}");
    }
    // Two parameters vary: each chip evaluated once per parameter and at its two ends.
    assert_eq!(u["evaluations"], 5 * 2 + 2 * 5);
}

/// `archplace stacks` lists the shipped profiles with their defaults, calibrations (and
/// their errors) and sources. `estimate` of the Llama 3 70B example with `stack =
/// "megatron-core"` records the stack, applies the stack's H100 calibration with its
/// interval — the numbers of `--calibration calibrations/nvidia-2024-2026.toml` — and the
/// FSDP example with `stack = "pytorch-fsdp"` runs its kernels one at a time under the
/// stack's H100 calibration (`pytorch-fsdp-2023`).
#[test]
fn stacks_are_listed_and_a_stack_applies_its_defaults_and_calibration() {
    let _gate = crate::util::shared();
    let o = run(&["stacks"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for name in ["megatron-core", "pytorch-fsdp", "deepspeed"] {
        assert!(text.contains(&format!("{name} — ")), "{text}");
    }
    assert!(text.contains("calibration nvidia-2024-2026 for b200, gb200, h100, h200: 30 runs"));
    let o = run(&["stacks", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 3);
    assert!(rows[0]["calibrations"]["h100"]["errors"]["leave_one_out"]["mean_percent"].is_f64());

    let plugins = plugin_dir();
    let estimate = |text: &str, extra: &[&str]| -> serde_json::Value {
        let (_dir, spec) = temp_spec("stack.toml", text);
        let spec = spec.display().to_string();
        let mut args = vec!["--plugin-dir", &plugins, "estimate", &spec, "--json"];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let base =
        std::fs::read_to_string(root().join("config/specs/estimate-llama3-70b-h100.toml")).unwrap();
    let stacked = estimate(
        &base.replace("[training]\n", "[training]\nstack = \"megatron-core\"\n"),
        &[],
    );
    assert_eq!(stacked["stack"], "megatron-core");
    assert!(
        stacked["calibration"]["path"]
            .as_str()
            .unwrap()
            .starts_with("nvidia-2024-2026"),
        "{}",
        stacked["calibration"]
    );
    let shipped = root().join("calibrations/nvidia-2024-2026.toml");
    let by_file = estimate(&base, &["--calibration", shipped.to_str().unwrap()]);
    assert_eq!(stacked["step_seconds"], by_file["step_seconds"]);
    assert_eq!(
        stacked["step_seconds_interval"],
        by_file["step_seconds_interval"]
    );
    assert!(by_file.get("stack").is_none());

    let fsdp =
        std::fs::read_to_string(root().join("config/specs/estimate-llama3-8b-fsdp-h100.toml"))
            .unwrap()
            .replace("[training]\n", "[training]\nstack = \"pytorch-fsdp\"\n");
    let v = estimate(&fsdp, &[]);
    assert_eq!(v["stack"], "pytorch-fsdp");
    assert_eq!(v["execution"]["operators"], "sequential");
    assert!(
        v["calibration"]["path"]
            .as_str()
            .unwrap()
            .starts_with("pytorch-fsdp-2023"),
        "{}",
        v["calibration"]
    );
    // The step is made while its interval's exact points are evaluated on other threads
    // (one per fitted factor, then the two ends): the same digits on every run, around it.
    let again = estimate(&fsdp, &[]);
    assert_eq!(v["step_seconds"], again["step_seconds"]);
    assert_eq!(v["step_seconds_interval"], again["step_seconds_interval"]);
    let fitted = v["calibration"]["parameters"].as_array().unwrap().len();
    assert_eq!(v["uncertainty"]["evaluations"], fitted + 2);
    assert_eq!(v["uncertainty"]["draws"], 1000);
    let step = v["step_seconds"].as_f64().unwrap();
    let [lo, hi] = [0, 1].map(|i| v["step_seconds_interval"][i].as_f64().unwrap());
    assert!(lo < step && step < hi, "{lo} {step} {hi}");
}

/// An area budget beyond what the area model sizes is refused, located, with both numbers:
/// `gpu-like` declares its range (`max_area`, its reticle: 858 mm²) and cannot size the
/// space's larger chips, so a 1,600 mm² budget would leave them out in silence and search
/// nothing between its largest chip and the budget. Within its range the same spec passes;
/// a model that declares no range (the reference's) is refused when it could not size some
/// of the space and sized nothing as large as the budget; a budget above a space it sizes
/// whole only does not bind.
#[test]
fn an_area_budget_beyond_the_area_models_range_is_refused_with_both_numbers() {
    let _gate = crate::util::shared();
    let resolved = run(&["validate", "--print-resolved"]);
    assert!(resolved.status.success(), "{resolved:?}");
    // The default spec resolved, its area budget (a reference configuration) replaced.
    let resolved = stdout(&resolved);
    let (head, tail) = resolved
        .split_once("[search.area_budget.reference_config]")
        .expect("the default budget is a reference configuration");
    let rest = tail.split_once("\n[").map_or("", |(_, r)| r);
    let with = |area: &str, budget: &str| {
        format!("{head}\n[{rest}")
            .replace("area = \"reference\"", &format!("area = \"{area}\""))
            .replace(
                "[search]\n",
                &format!("[search]\narea_budget = \"{budget}\"\n"),
            )
    };
    let validate = |text: &str| {
        let (_dir, spec) = temp_spec("budget.toml", text);
        run(&[
            "validate",
            "--plugin-dir",
            &plugin_dir(),
            spec.to_str().unwrap(),
        ])
    };
    let beyond = with("gpu-like", "1600 mm2");
    let o = validate(&beyond);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = stderr(&o);
    for part in [
        "the area budget, 1,600 mm², is beyond the range of the area model `gpu-like`",
        "it sizes chips up to 858.0 mm² (its `max_area`)",
        "field: search.area_budget",
        "lower `area_budget` to at most 858.0 mm²",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
    let line = err
        .lines()
        .find(|l| l.contains("budget.toml:"))
        .expect("located");
    let at = beyond
        .lines()
        .position(|l| l.starts_with("area_budget"))
        .unwrap();
    assert!(
        line.contains(&format!("budget.toml:{}:15", at + 1)),
        "at the budget's value: {line}\n{err}"
    );
    for (area, budget) in [("gpu-like", "858 mm2"), ("reference", "1600 mm2")] {
        let o = validate(&with(area, budget));
        assert!(o.status.success(), "{area} {budget}: {}", stderr(&o));
    }
    // The reference's tables end at 4 MiB PE buffers: 512×512 arrays are outside them.
    let unpriced = with("reference", "100000 mm2")
        .replace("width = [", "width = [512, ")
        .replace("depth = [", "depth = [512, ");
    let o = validate(&unpriced);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = stderr(&o);
    assert!(
        err.contains("the largest chip it sizes in this space is")
            && err.contains("configurations are outside its domain"),
        "{err}"
    );
}

/// The `[accelerator]` `run` prints for `archplace estimate` is complete: with the chip's
/// peak (2 FLOPs a MAC a cycle at the latency model's clock), so that the pasted plan's
/// estimate gives the step time the search found and its MFU.
#[test]
fn the_printed_accelerator_has_its_peak_and_the_pasted_plan_an_mfu() {
    let _gate = crate::util::shared();
    let (dir, spec) = temp_spec("tiny.toml", TINY);
    let out = dir.path().join("out");
    let o = run(&[
        "run",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let printed = stdout(&o);
    let block: Vec<&str> = printed
        .lines()
        .skip_while(|l| !l.contains("for `archplace estimate --mip`"))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .map(str::trim)
        .collect();
    let block = block.join("\n");
    let result = read_json(&out.join("result.json"));
    let chip = &result["best"]["configuration"];
    let macs = ["tensor_cores", "width", "depth"]
        .iter()
        .map(|k| chip[k].as_f64().unwrap())
        .product::<f64>();
    // The reference model's default clock, 1.05 GHz.
    let peak = 2.0 * macs * 1.05e9;
    assert!(
        block.contains(&format!("peak_flops = \"{peak} FLOP/s\"")),
        "{block}"
    );
    // Pasted into the spec (its [search] gone): the search's step time, and an MFU.
    let text = TINY.split("[search]").next().unwrap().to_string() + &block + "\n";
    let (_d, pasted) = temp_spec("pasted.toml", &text);
    let o = run(&["estimate", pasted.to_str().unwrap(), "--mip", "--json"]);
    assert!(o.status.success(), "{}\n{text}", stderr(&o));
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        e["step_seconds"].as_f64(),
        result["best"]["models"][0]["time_per_batch_seconds"].as_f64(),
        "{e}"
    );
    let mfu = e["model_flops_utilisation"].as_f64().expect("an MFU");
    assert!(mfu > 0.0 && mfu < 1.0, "{mfu}");
}
