//! archplace against published end-to-end Megatron-LM training runs on A100 GPUs,
//! Megatron-Core Mixture-of-Experts runs on H100s and NVIDIA's FP8 runs (NeMo,
//! Megatron-Bridge) on H100, B200 and GB200s.
//!
//! Every measurement of the three measurements files in `tests/fixtures/validation/`
//! (`measurements-*.toml`) is a spec next to it and a published figure: `archplace
//! estimate --json` (the real binary, the real `gpu-like` WebAssembly plugin) gives ours.
//! The test renders the comparison as the table of `docs/validation.md`, then calibrates
//! on each file (`archplace calibrate`) and renders each source's errors uncalibrated,
//! calibrated in-sample, left out and predicted from the other sources as its second
//! table; it fails when the document disagrees (`UPDATE_EXPECT=1` rewrites it), when a
//! shipped calibration (`calibrations/`) is not what its command makes today, and when a
//! source's errors pass the bounds below — what archplace reaches today, so that a change
//! that makes it worse fails, whatever it fixes elsewhere.

use crate::util::root;
use serde::Deserialize;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// docs/validation.md holds the tables of two tests, each of which reads it, splices its
/// own in and (with `UPDATE_EXPECT`) writes it back: one at a time, or the later writer
/// puts back the other's old tables.
static DOCUMENT: Mutex<()> = Mutex::new(());

#[derive(Debug, Deserialize)]
struct Measurements {
    measurement: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    spec: String,
    source: String,
    label: String,
    metric: Metric,
    flop_convention: Option<String>,
    value: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Metric {
    /// Seconds per iteration.
    StepSeconds,
    /// TeraFLOP/s per GPU: with `flop_convention = "hardware"` recomputation included
    /// (the source's own count); `"model"`: model FLOPs with attention's scores counted
    /// unmasked, no recomputation (Megatron-LM's MFU convention, which NeMo 24.x's tables
    /// use).
    TflopsPerDevice,
    /// Tokens per second per GPU (no FLOP convention).
    TokensPerSecondPerDevice,
}

/// The measurements files, each the measurements of one calibration in `calibrations/`.
const FILES: [(&str, &str); 6] = [
    ("measurements-a100-2021.toml", "a100-megatron-2021.toml"),
    ("measurements-a100-2022.toml", "a100-megatron-2022.toml"),
    ("measurements-deepspeed-a100.toml", "deepspeed-a100.toml"),
    (
        "measurements-nvidia-2024-2026.toml",
        "nvidia-2024-2026.toml",
    ),
    (
        "measurements-pytorch-fsdp-2023.toml",
        "pytorch-fsdp-2023.toml",
    ),
    (
        "measurements-pytorch-fsdp-a100.toml",
        "pytorch-fsdp-a100.toml",
    ),
];

/// The software stack each measurements file's runs ran (`[training] stack`): its
/// profile's defaults, for the runs' GPU generation, are what the runs' specs write, and
/// the calibration it names for that generation is fitted on them.
const STACK_OF: [(&str, &str); 6] = [
    ("measurements-a100-2021.toml", "megatron-core"),
    ("measurements-a100-2022.toml", "megatron-core"),
    ("measurements-deepspeed-a100.toml", "deepspeed"),
    ("measurements-nvidia-2024-2026.toml", "megatron-core"),
    ("measurements-pytorch-fsdp-2023.toml", "pytorch-fsdp"),
    ("measurements-pytorch-fsdp-a100.toml", "pytorch-fsdp"),
];

/// Bounds per source on the mean and the largest absolute relative error: what archplace
/// reaches (docs/validation.md), not the target (5% mean, 10% largest).
const BOUNDS: [(&str, f64, f64); 14] = [
    ("DeepSpeed MT-NLG 530B, DGX A100", 0.31, 0.33),
    // With the network its README states (400 Gb/s a node): 13B's HSDP all-reduce at one
    // sequence a GPU is exposed, as measured (18.3% (34.2%) on the A100 preset's network).
    ("PyTorch/IBM fms-fsdp Llama 2, 128 A100 80GB", 0.11, 0.23),
    (
        "PyTorch/IBM fms-fsdp Llama 2, 128 A100 80GB (March 2024)",
        0.17,
        0.22,
    ),
    ("PyTorch/IBM fms-fsdp Llama 2, 96 H100 80GB", 0.35, 0.39),
    ("llm-foundry MPT benchmarks, A100 80GB (RoCE)", 0.29, 0.43),
    ("llm-foundry MPT benchmarks, H100 80GB BF16", 0.45, 0.605),
    (
        "llm-foundry MPT benchmarks, H100 80GB BF16 (Large Scale, >= 128 GPUs)",
        0.38,
        0.53,
    ),
    ("Korthikanti et al. 2022, Table 5", 0.070, 0.090),
    ("Narayanan et al. 2021, Table 1", 0.165, 0.235),
    // Qwen3-235B-A22B on its own plan (3 virtual stages a device, not plain 1F1B): 53%
    // fast uncalibrated, where the plain-1F1B approximation's larger bubble had hidden 9
    // points of it.
    ("Megatron MoE model zoo, H100", 0.43, 0.54),
    ("Megatron-Core MoE guide (MCore v0.9), H100", 0.41, 0.41),
    ("NeMo 24.07 performance summary, DGX-H100", 0.52, 0.76),
    ("NeMo long-sequence table, DGX-H100", 0.78, 0.87),
    ("Megatron-Bridge 25.11 performance summary", 0.39, 0.49),
];

struct Row<'a> {
    case: &'a Case,
    ours: f64,
    error: f64,
}

impl<'a> Row<'a> {
    /// `case` against archplace's figure `ours`.
    fn of(case: &'a Case, ours: f64) -> Row<'a> {
        Row {
            case,
            ours,
            error: (ours - case.value) / case.value,
        }
    }
}

fn estimate(spec: &Path) -> serde_json::Value {
    estimate_with(spec, None)
}

/// `estimate --json` of `spec`, with `calibration` applied when given.
fn estimate_with(spec: &Path, calibration: Option<&Path>) -> serde_json::Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_archplace"));
    cmd.args(["estimate", "--json"]);
    if let Some(c) = calibration {
        cmd.arg("--calibration").arg(c);
    }
    let out = cmd
        .arg(spec)
        .env("ARCHPLACE_CACHE_DIR", root().join("target/test-cache"))
        .env("XDG_DATA_HOME", root().join("target/test-data"))
        .env_remove("ARCHPLACE_PLUGIN_DIRS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        spec.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The figure of `case`'s metric in `estimate --json`'s answer `j`.
fn ours(case: &Case, j: &serde_json::Value) -> f64 {
    match (case.metric, case.flop_convention.as_deref()) {
        (Metric::StepSeconds, _) => j["step_seconds"].as_f64().unwrap(),
        (Metric::TflopsPerDevice, Some("model")) => {
            j["model_flops_per_second_per_device"].as_f64().unwrap() / 1e12
        }
        (Metric::TflopsPerDevice, _) => {
            j["hardware_flops_per_second_per_device"].as_f64().unwrap() / 1e12
        }
        (Metric::TokensPerSecondPerDevice, _) => {
            j["tokens_per_second_per_device"].as_f64().unwrap()
        }
    }
}

/// The 90% interval `estimate --json` gives for `case`'s metric: the step's, the
/// tokens', or the FLOP rate's (which goes as the step's inverse); `None` without a
/// calibration with draws.
fn interval(case: &Case, j: &serde_json::Value) -> Option<(f64, f64)> {
    let ends = |key: &str| {
        let v = j.get(key)?.as_array()?;
        Some((v.first()?.as_f64()?, v.get(1)?.as_f64()?))
    };
    match case.metric {
        Metric::StepSeconds => ends("step_seconds_interval"),
        Metric::TokensPerSecondPerDevice => ends("tokens_per_second_per_device_interval"),
        Metric::TflopsPerDevice => {
            let (lo, hi) = ends("step_seconds_interval")?;
            let (step, rate) = (j["step_seconds"].as_f64()?, ours(case, j));
            Some((rate * step / hi, rate * step / lo))
        }
    }
}

/// Runs, mean and largest absolute relative error of the rows `keep` selects.
fn errors(rows: &[Row<'_>], keep: impl Fn(&Row<'_>) -> bool) -> (usize, f64, f64) {
    let e: Vec<f64> = rows
        .iter()
        .filter(|r| keep(r))
        .map(|r| r.error.abs())
        .collect();
    let mean = e.iter().sum::<f64>() / e.len() as f64;
    (e.len(), mean, e.iter().copied().fold(0.0, f64::max))
}

fn render(rows: &[Row<'_>]) -> String {
    let mut t = String::from(
        "| source | run | metric | published | archplace | error |\n\
         |---|---|---|--:|--:|--:|\n",
    );
    for r in rows {
        let (metric, digits) = match (r.case.metric, r.case.flop_convention.as_deref()) {
            (Metric::StepSeconds, _) => ("s per iteration", 2),
            (Metric::TflopsPerDevice, Some("model")) => ("model TFLOP/s per GPU", 0),
            (Metric::TflopsPerDevice, _) => ("TFLOP/s per GPU", 1),
            (Metric::TokensPerSecondPerDevice, _) => ("tokens/s per GPU", 0),
        };
        t.push_str(&format!(
            "| {} | {} | {metric} | {:.digits$} | {:.digits$} | {:+.1}% |\n",
            r.case.source,
            r.case.label,
            r.case.value,
            r.ours,
            100.0 * r.error
        ));
    }
    t.push('\n');
    for (source, _, _) in BOUNDS {
        let (n, mean, max) = errors(rows, |r| r.case.source == source);
        t.push_str(&format!(
            "{source}: {n} runs, mean absolute error {:.1}%, largest {:.1}%.\n",
            100.0 * mean,
            100.0 * max
        ));
    }
    let (n, mean, max) = errors(rows, |_| true);
    t.push_str(&format!(
        "All {n} runs: mean absolute error {:.1}%, largest {:.1}%.\n",
        100.0 * mean,
        100.0 * max
    ));
    t
}

const START: &str = "<!-- validation-table: generated by tests/validation.rs -->\n";
const CAL_START: &str = "<!-- calibration-table: generated by tests/validation.rs -->\n";
const CAL_END: &str = "<!-- end of calibration-table -->";

/// Bounds on each source's leave-one-out error (mean, largest, percent) once calibrated on
/// its measurements file: the target (3%, 6%) for the two A100 sources, what
/// archplace reaches today for the others.
const CALIBRATED_BOUNDS: [(&str, (f64, f64)); 14] = [
    ("DeepSpeed MT-NLG 530B, DGX A100", (3.0, 6.0)),
    ("PyTorch/IBM fms-fsdp Llama 2, 128 A100 80GB", (9.0, 12.0)),
    (
        "PyTorch/IBM fms-fsdp Llama 2, 128 A100 80GB (March 2024)",
        (4.5, 7.0),
    ),
    ("PyTorch/IBM fms-fsdp Llama 2, 96 H100 80GB", (5.5, 10.0)),
    // fms-fsdp's runs in the same fits pull the GEMM ceiling and the overlap's rate their
    // way: llm-foundry's leave-one-out was 9.3% (20.8%) on A100 and 8.8% (17.0%) on H100
    // while the fits had only them and the February A100 table.
    ("llm-foundry MPT benchmarks, A100 80GB (RoCE)", (10.0, 22.5)),
    ("llm-foundry MPT benchmarks, H100 80GB BF16", (10.0, 17.5)),
    (
        "llm-foundry MPT benchmarks, H100 80GB BF16 (Large Scale, >= 128 GPUs)",
        (9.0, 19.0),
    ),
    ("Korthikanti et al. 2022, Table 5", (3.0, 6.0)),
    ("Narayanan et al. 2021, Table 1", (3.0, 6.0)),
    // Qwen3-235B-A22B priced on its own plan (see BOUNDS) is 10% fast calibrated: the cost
    // the model lacks for its 128 fine-grained experts shows now that the plain-1F1B
    // bubble no longer hides it (7.7% (9.3%) before).
    ("Megatron MoE model zoo, H100", (10.5, 11.0)),
    ("Megatron-Core MoE guide (MCore v0.9), H100", (5.5, 5.5)),
    ("NeMo 24.07 performance summary, DGX-H100", (3.5, 8.0)),
    ("NeMo long-sequence table, DGX-H100", (1.5, 3.5)),
    ("Megatron-Bridge 25.11 performance summary", (6.0, 12.0)),
];

/// What calibrating on each measurements file gives: the per-source table and errors.
struct Calibrated {
    table: String,
    sources: Vec<serde_json::Value>,
}

/// Calibrates on each measurements file as `calibrations/README.md` says (the real
/// binary), checks that the shipped calibration is what the command makes today (the
/// same factors and draws; only the date may differ), and renders each source's errors.
fn calibrations() -> Calibrated {
    let dir = tempfile::tempdir().unwrap();
    let mut table = String::from(
        "| calibration | source | runs | uncalibrated | in-sample | leave-one-out | other sources |\n\
         |---|---|--:|--:|--:|--:|--:|\n",
    );
    let mut sources = Vec::new();
    for (measurements, shipped) in FILES {
        let out = dir.path().join(shipped);
        let o = Command::new(env!("CARGO_BIN_EXE_archplace"))
            .current_dir(root())
            .args(["calibrate", "--json", "-o"])
            .arg(&out)
            .arg(format!("tests/fixtures/validation/{measurements}"))
            .env("ARCHPLACE_CACHE_DIR", root().join("target/test-cache"))
            .env("XDG_DATA_HOME", root().join("target/test-data"))
            .env_remove("ARCHPLACE_PLUGIN_DIRS")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let made: toml::Table = toml::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let kept_path = root().join("calibrations").join(shipped);
        let kept: toml::Table =
            toml::from_str(&std::fs::read_to_string(&kept_path).unwrap_or_default())
                .unwrap_or_default();
        let same = |k: &str| made.get(k) == kept.get(k);
        // The plugin by name and version: its component's hash depends on where it was
        // built (paths in its panic messages), and a calibration is applied by name and
        // version.
        let plugin = |t: &toml::Table| {
            ["name", "version"].map(|k| t.get("plugin").and_then(|p| p.get(k)).cloned())
        };
        if std::env::var_os("UPDATE_EXPECT").is_some() {
            std::fs::copy(&out, &kept_path).unwrap();
        } else {
            assert!(
                plugin(&made) == plugin(&kept)
                    && ["parameters", "draws", "errors", "source", "measurement"]
                        .iter()
                        .all(|k| same(k)),
                "calibrations/{shipped} is not what `archplace calibrate tests/fixtures/validation/{measurements}` makes today (UPDATE_EXPECT=1 rewrites it)"
            );
        }
        let pct =
            |e: &serde_json::Value| match (e["mean_percent"].as_f64(), e["max_percent"].as_f64()) {
                (Some(m), Some(x)) => format!("{m:.1}% ({x:.1}%)"),
                _ => "—".into(),
            };
        for s in summary["source"].as_array().unwrap() {
            table.push_str(&format!(
                "| `{shipped}` | {} | {} | {} | {} | {} | {} |\n",
                s["name"].as_str().unwrap(),
                s["measurements"],
                pct(&s["uncalibrated"]),
                pct(&s["in_sample"]),
                pct(&s["leave_one_out"]),
                pct(&s["other_sources"]),
            ));
            sources.push(s.clone());
        }
    }
    table.push_str("\nEach cell: mean (largest) absolute error over the source's runs.\n");
    Calibrated { table, sources }
}
const END: &str = "<!-- end of validation-table -->";
/// `doc` with what lies between its `start` and `end` markers replaced by `table`.
fn splice(doc: &str, (start, end): (&str, &str), table: &str) -> String {
    let from = doc
        .find(start)
        .unwrap_or_else(|| panic!("docs/validation.md has the marker {start:?}"))
        + start.len();
    let to = doc[from..]
        .find(end)
        .unwrap_or_else(|| panic!("and its end marker {end:?}"))
        + from;
    format!("{}{table}{}", &doc[..from], &doc[to..])
}

const STACK_START: &str = "<!-- stack-table: generated by tests/validation.rs -->\n";
const STACK_END: &str = "<!-- end of stack-table -->";

/// Each shipped calibration applied to every measurements file's runs: what a stack's
/// calibration does to the runs of its own sources (in-sample) and of the other stacks'.
fn stack_table(files: &[Measurements]) -> String {
    let dir = root().join("tests/fixtures/validation");
    let stacks = archplace_spec::stack::all_shipped();
    let mut t = String::from("| calibration | stack (GPUs) |");
    for (measurements, _) in FILES {
        t.push_str(&format!(" `{measurements}` |"));
    }
    t.push_str("\n|---|---|");
    t.push_str(&"--:|".repeat(FILES.len()));
    t.push('\n');
    for (_, shipped) in FILES {
        let path = root().join("calibrations").join(shipped);
        let name = shipped.trim_end_matches(".toml");
        let named_by: Vec<String> = stacks
            .iter()
            .filter_map(|s| {
                let gpus: Vec<&str> = s
                    .calibrations
                    .iter()
                    .filter(|(_, c)| c.as_str() == name)
                    .map(|(g, _)| g.as_str())
                    .collect();
                (!gpus.is_empty()).then(|| format!("{} ({})", s.name, gpus.join(", ")))
            })
            .collect();
        let by = if named_by.is_empty() {
            "—".to_string()
        } else {
            named_by.join("; ")
        };
        t.push_str(&format!("| `{shipped}` | {by} |"));
        for f in files {
            let rows: Vec<Row<'_>> = f
                .measurement
                .iter()
                .map(|case| {
                    let j = estimate_with(&dir.join(&case.spec), Some(&path));
                    Row::of(case, ours(case, &j))
                })
                .collect();
            let (_, mean, max) = errors(&rows, |_| true);
            t.push_str(&format!(" {:.1}% ({:.1}%) |", 100.0 * mean, 100.0 * max));
        }
        t.push('\n');
    }
    t.push_str(
        "\nEach cell: mean (largest) absolute error over the file's runs with the row's calibration applied; on its own file, in-sample. Errors of each run's metric as published (tokens/s per GPU, TFLOP/s or seconds), as the comparison above; `archplace calibrate` states its errors in step time, so its in-sample figures differ where a run is published as a rate (+26.7% in tokens/s is −21.1% in time).\n",
    );
    t
}

#[test]
fn estimates_match_published_megatron_runs() {
    let _gate = crate::util::shared();
    let dir = root().join("tests/fixtures/validation");
    let files: Vec<Measurements> = FILES
        .iter()
        .map(|(f, _)| toml::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap())
        .collect();
    let rows: Vec<Row<'_>> = files
        .iter()
        .flat_map(|f| &f.measurement)
        .map(|case| Row::of(case, ours(case, &estimate(&dir.join(&case.spec)))))
        .collect();
    let table = render(&rows);

    let calibrated = calibrations();
    let stacks = stack_table(&files);
    let doc_path = root().join("docs/validation.md");
    let document = DOCUMENT.lock().unwrap_or_else(|e| e.into_inner());
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    // The document is the expected file: as it stands, with this run's tables in place.
    let current = splice(&doc, (START, END), &table);
    let current = splice(&current, (CAL_START, CAL_END), &calibrated.table);
    let current = splice(&current, (STACK_START, STACK_END), &stacks);
    expect_test::expect_file![&doc_path].assert_eq(&current);
    drop(document);

    for (source, bound) in CALIBRATED_BOUNDS {
        let e = calibrated
            .sources
            .iter()
            .find(|s| s["name"].as_str() == Some(source))
            .unwrap_or_else(|| panic!("no calibrated errors of {source}"));
        let got = |k: &str, m: &str| e[k][m].as_f64().unwrap();
        assert!(
            got("leave_one_out", "mean_percent") <= bound.0
                && got("leave_one_out", "max_percent") <= bound.1,
            "{source}: leave-one-out {e}\n{}",
            calibrated.table
        );
    }
    for (source, mean_bound, max_bound) in BOUNDS {
        let (n, mean, max) = errors(&rows, |r| r.case.source == source);
        assert!(n > 0, "no case from {source}");
        assert!(
            mean <= mean_bound && max <= max_bound,
            "{source}: mean {:.1}% (bound {:.1}%), largest {:.1}% (bound {:.1}%)\n{table}",
            100.0 * mean,
            100.0 * mean_bound,
            100.0 * max,
            100.0 * max_bound
        );
    }
}

/// A calibration's factors mean what they were fitted with, so a stack must default to
/// what its calibration's runs ran: each run of a measurements file, estimated with its
/// stack named (the profile filling the `[training]` keys its spec leaves out) and without
/// the cost-model parameters the profile gives (which it must then give as the spec wrote
/// them), takes the time it takes as its spec is written; and every calibration a profile
/// names is fitted on runs of that stack. (Megatron-Core's profile once gave Megatron-LM's
/// A100 runs of 2021–2022, which its A100 calibration is fitted on, Transformer Engine's TP
/// overlap: 2–24% shorter steps than the runs its factors were fitted with.)
#[test]
fn stacks_default_to_what_their_calibrations_runs_ran() {
    let _gate = crate::util::shared();
    let dir = root().join("tests/fixtures/validation");
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_archplace"))
        .args(["stacks", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let profiles: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let profile = |name: &str| {
        profiles
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()
            .clone()
    };
    // The cost-model parameters a profile gives a spec of `generation`, as the lines a spec
    // writes them in (`fused_epilogues = false`).
    let parameter_lines = |p: &serde_json::Value, generation: &str| -> Vec<String> {
        let tables = [
            &p["generations"][generation]["parameters"],
            &p["parameters"],
        ];
        tables
            .iter()
            .filter_map(|t| t.as_object())
            .flat_map(|per_plugin| per_plugin.values())
            .filter_map(|values| values.as_object())
            .flat_map(|values| values.iter().map(|(k, v)| format!("{k} = {v}\n")))
            .collect()
    };
    for (file, stack) in STACK_OF {
        let (_, shipped) = FILES.iter().find(|(f, _)| *f == file).unwrap();
        let calibration = root().join("calibrations").join(shipped);
        let runs: Measurements =
            toml::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
        for case in &runs.measurement {
            let text = std::fs::read_to_string(dir.join(&case.spec)).unwrap();
            let spec: toml::Table = toml::from_str(&text).unwrap();
            let named = spec["training"].get("stack").and_then(|s| s.as_str());
            let with_stack = match named {
                Some(s) => {
                    assert_eq!(s, stack, "{}: names another stack", case.spec);
                    continue;
                }
                None => text.replacen(
                    "[training]\n",
                    &format!("[training]\nstack = \"{stack}\"\n"),
                    1,
                ),
            };
            // Without the cost-model parameters the profile gives: it must give what the
            // spec writes.
            let preset = ["cluster", "accelerator"]
                .iter()
                .find_map(|s| spec.get(*s)?.get("preset")?.as_str())
                .unwrap_or_default();
            let generation = preset.split('-').next().unwrap_or_default();
            let with_stack = parameter_lines(&profile(stack), generation)
                .iter()
                .fold(with_stack, |t, line| t.replace(line.as_str(), ""));
            let copy = scratch.path().join(&case.spec);
            std::fs::write(&copy, with_stack).unwrap();
            let step = |spec: &Path| {
                estimate_with(spec, Some(&calibration))["step_seconds"]
                    .as_f64()
                    .unwrap()
            };
            let (written, stacked) = (step(&dir.join(&case.spec)), step(&copy));
            assert!(
                (written - stacked).abs() <= 1e-9 * written,
                "{} ({file}): {written} s as written, {stacked} s with `stack = \"{stack}\"`: \
                 the profile's defaults are not what the runs of its calibration ran; \
                 write the difference into the spec (with its source) or the profile",
                case.spec
            );
        }
    }
    for profile in profiles.as_array().unwrap() {
        let name = profile["name"].as_str().unwrap();
        for (gpu, c) in profile["calibrations"].as_object().unwrap() {
            let shipped = format!("{}.toml", c["calibration"].as_str().unwrap());
            let (file, _) = FILES
                .iter()
                .find(|(_, s)| *s == shipped)
                .unwrap_or_else(|| {
                    panic!("{name} names {shipped}, which no measurements file makes")
                });
            let (_, ran) = STACK_OF.iter().find(|(f, _)| f == file).unwrap();
            assert_eq!(
                *ran, name,
                "{name} names {shipped} for {gpu}, fitted on runs of {ran}"
            );
        }
    }
}

const CHECKS_START: &str = "<!-- checks-table: generated by tests/validation.rs -->\n";
const CHECKS_END: &str = "<!-- end of checks-table -->";

/// Published runs no calibration is fitted on (`checks-*.toml` beside the measurements
/// files): each spec names its stack, so its stack's calibration is applied as a user's
/// would be.
const CHECKS: [&str; 9] = [
    "checks-torchtitan-h100.toml",
    "checks-torchtitan-a100.toml",
    "checks-torchtitan-2025.toml",
    "checks-torchao-h100.toml",
    "checks-foundry-fp8-h100.toml",
    "checks-fms-fsdp-compile.toml",
    "checks-megatron-h100.toml",
    "checks-meta-llama3.toml",
    "checks-deepspeed-a100.toml",
];

/// What archplace reaches on the checks today (mean and largest absolute error of the
/// published figure, then of each run's ratio to its table's first run; the 72 runs with
/// torchtitan's of June 2025 and torchao's float8 table, whose Float8 runs with row-wise
/// scales are the largest ratios' errors, llm-foundry's FP8 table, whose short sequences
/// are 7–20% fast, fms-fsdp's compiled table, 14–16% slow on H100, Megatron-LM's weak
/// scaling on H100, whose first run, 1.7B, is 13% fast, Meta's Llama 3 405B, 9–10% fast,
/// and BLOOM 176B, 9% slow): a change that makes them worse fails.
const CHECK_BOUNDS: (f64, f64, f64, f64) = (0.085, 0.325, 0.085, 0.24);

/// The share of the checks whose published figure the 90% interval must cover (66 of 72
/// today: the six outside are torchtitan's two shortest context-parallel runs, 22–32%
/// slow, Megatron-LM's 1.7B, 13% fast, the two 8B row-wise Float8 runs, 25–30% fast, and
/// fms-fsdp's compiled 7B on H100, 16% slow): below it, the intervals claim more than they
/// hold on runs no calibration saw.
const CHECK_COVERAGE_BOUND: f64 = 0.85;

/// The checks: every run against its published figure, and its ratio to the first run of
/// its table (what a user comparing two plans reads) against the published ratio.
#[test]
fn estimates_of_runs_no_calibration_saw() {
    let _gate = crate::util::shared();
    let dir = root().join("tests/fixtures/validation");
    let mut t = String::from(
        "| source | run | published | archplace | error | 90% interval | against the table's first run: published | archplace | error |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    let (mut absolute, mut relative) = (Vec::new(), Vec::new());
    // Runs whose published figure lies inside archplace's 90% interval, of those with one.
    let (mut inside, mut with_interval) = (0usize, 0usize);
    let files: Vec<Measurements> = CHECKS
        .iter()
        .map(|file| toml::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap())
        .collect();
    let mut estimated = Vec::new();
    for m in &files {
        let mut first: Option<(&str, f64, f64)> = None;
        for case in &m.measurement {
            let j = estimate(&dir.join(&case.spec));
            let r = Row::of(case, ours(case, &j));
            absolute.push(r.error.abs());
            // The first run of each table is what the others are compared with.
            let opens_its_table = first.is_none_or(|(s, _, _)| s != case.source);
            if opens_its_table {
                first = Some((&case.source, case.value, r.ours));
            }
            let (_, published0, ours0) = first.unwrap();
            let (p, o) = (case.value / published0, r.ours / ours0);
            let ratio = if opens_its_table {
                "— | — | —".to_string()
            } else {
                let e = (o - p) / p;
                relative.push(e.abs());
                format!("{p:.3} | {o:.3} | {:+.1}%", 100.0 * e)
            };
            let band = match interval(case, &j) {
                Some((lo, hi)) => {
                    with_interval += 1;
                    let covers = lo <= case.value && case.value <= hi;
                    inside += usize::from(covers);
                    let mark = if covers { "" } else { " (outside)" };
                    format!("{lo:.0}–{hi:.0}{mark}")
                }
                None => "—".to_string(),
            };
            t.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {:+.1}% | {band} | {ratio} |\n",
                case.source,
                case.label,
                case.value,
                r.ours,
                100.0 * r.error
            ));
            estimated.push((case, j));
        }
    }
    let stats = |v: &[f64]| {
        (
            v.iter().sum::<f64>() / v.len() as f64,
            v.iter().copied().fold(0.0, f64::max),
        )
    };
    let (mean, max) = stats(&absolute);
    let (rel_mean, rel_max) = stats(&relative);
    t.push_str(&format!(
        "\nTokens/s per GPU (Megatron-LM's table: teraFLOP/s per GPU, its model-FLOP count); {} runs: mean absolute error {:.1}%, largest {:.1}%; their {} ratios to their table's first run: mean absolute error {:.1}%, largest {:.1}%.\n",
        absolute.len(),
        100.0 * mean,
        100.0 * max,
        relative.len(),
        100.0 * rel_mean,
        100.0 * rel_max
    ));
    let coverage = inside as f64 / with_interval.max(1) as f64;
    t.push_str(&format!(
        "The published figure lies inside archplace's 90% interval (its stack's calibration's draws and model error) for {inside} of the {with_interval} runs ({:.0}%).\n",
        100.0 * coverage
    ));
    let memory = memory_table(&dir, &estimated);
    let doc_path = root().join("docs/validation.md");
    let document = DOCUMENT.lock().unwrap_or_else(|e| e.into_inner());
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let current = splice(&doc, (CHECKS_START, CHECKS_END), &t);
    let current = splice(&current, (MEMORY_START, MEMORY_END), &memory);
    expect_test::expect_file![&doc_path].assert_eq(&current);
    drop(document);
    let (b_mean, b_max, b_rel_mean, b_rel_max) = CHECK_BOUNDS;
    assert!(
        mean <= b_mean && max <= b_max && rel_mean <= b_rel_mean && rel_max <= b_rel_max,
        "the checks got worse than {CHECK_BOUNDS:?}:\n{t}"
    );
    // An interval is honest on runs no calibration saw when it covers about as many as it
    // claims: every check has one (each names a stack with a calibration for its GPU).
    assert_eq!(
        with_interval,
        absolute.len(),
        "a check without an interval:\n{t}"
    );
    assert!(
        coverage >= CHECK_COVERAGE_BOUND,
        "the 90% intervals cover {inside} of {with_interval} checks (bound {CHECK_COVERAGE_BOUND}):\n{t}"
    );
}

const MEMORY_START: &str = "<!-- memory-table: generated by tests/validation.rs -->\n";
const MEMORY_END: &str = "<!-- end of memory-table -->";

/// The checked runs' published peak memory (`checks-memory.toml`).
#[derive(Debug, Deserialize)]
struct PublishedMemory {
    run: Vec<MemoryRun>,
}

#[derive(Debug, Deserialize)]
struct MemoryRun {
    spec: String,
    gib: f64,
}

/// What archplace reaches on the published peak memory today: the mean absolute error
/// over the runs (9.1% with the eager loss's workspace and PyTorch's loss parallelism
/// under tensor parallelism; 10.3% before the latter, 26% before either); a change that
/// makes it worse fails.
const MEMORY_BOUND: f64 = 0.10;

/// The checked runs' memory against what their sources published (docs/validation.md,
/// "Checked, never fitted"), from their estimates (`estimated`: each check's spec and its
/// `estimate --json`): every run its source ran fits its GPUs' HBM here too (none
/// refused: a refusal panics), the mean absolute error stays within [`MEMORY_BOUND`], and
/// the table shows archplace's tensors beside the caching allocator's peak the source read.
fn memory_table(dir: &Path, estimated: &[(&Case, serde_json::Value)]) -> String {
    let published: PublishedMemory =
        toml::from_str(&std::fs::read_to_string(dir.join("checks-memory.toml")).unwrap()).unwrap();
    let mut t = String::from(
        "| source | run | published (GiB) | archplace (GiB) | error | HBM (GiB) |\n|---|---|--:|--:|--:|--:|\n",
    );
    let mut errors = Vec::new();
    for run in &published.run {
        let (case, j) = estimated
            .iter()
            .find(|(c, _)| c.spec == run.spec)
            .unwrap_or_else(|| panic!("{} is not a checked run", run.spec));
        let gib = |v: &serde_json::Value| v.as_f64().unwrap() / (1u64 << 30) as f64;
        let (ours, hbm) = (gib(&j["memory_bytes"]["total"]), gib(&j["hbm_bytes"]));
        assert!(
            j["feasible"].as_bool() == Some(true) && ours <= hbm,
            "{}: its source ran it in {hbm} GiB; archplace needs {ours:.1} GiB",
            run.spec
        );
        let error = (ours - run.gib) / run.gib;
        errors.push(error);
        t.push_str(&format!(
            "| {} | {} | {:.1} | {ours:.1} | {:+.1}% | {hbm:.0} |\n",
            case.source,
            case.label,
            run.gib,
            100.0 * error
        ));
    }
    let n = errors.len() as f64;
    let mean = errors.iter().sum::<f64>() / n;
    let absolute = errors.iter().map(|e| e.abs()).sum::<f64>() / n;
    assert!(
        absolute <= MEMORY_BOUND,
        "peak memory: mean absolute error {:.1}% (bound {:.1}%)\n{t}",
        100.0 * absolute,
        100.0 * MEMORY_BOUND
    );
    let (low, high) = errors
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &e| {
            (l.min(e), h.max(e))
        });
    t.push_str(&format!(
        "\n{} runs, every one estimated to fit its GPUs as it ran; archplace's figure against the published one: {:+.1}% on average, from {:+.1}% to {:+.1}%.\n",
        errors.len(),
        100.0 * mean,
        100.0 * low,
        100.0 * high
    ));
    t
}

const COVERAGE_START: &str = "<!-- coverage-table: generated by tests/validation.rs -->\n";
const COVERAGE_END: &str = "<!-- end of coverage-table -->";

/// The honesty of the intervals: each shipped calibration's measurements, each predicted
/// left out of the fit (its leave-one-out prediction, as the calibration file records
/// it) with the 90% interval `estimate --calibration` gives its spec — the bootstrap's
/// parameter draws and the model's error, drawn from the leave-one-out residuals of the
/// *other* measurements (the calibration is applied with this one's residual removed) —
/// and counted as covered when the measurement lies inside. The table in
/// docs/calibration.md ("How honest the intervals are") is this test's; every
/// calibration's coverage is at least 80%.
#[test]
fn intervals_cover_what_the_calibrations_left_out() {
    let _gate = crate::util::shared();
    let dir = root().join("tests/fixtures/validation");
    let tmp = tempfile::tempdir().unwrap();
    let mut table = String::from(
        "| calibration | runs | inside the 90% interval | median width (high / low) |\n|---|--:|--:|--:|\n",
    );
    let (mut all_in, mut all_n) = (0usize, 0usize);
    for (file, calibration) in FILES {
        let m: Measurements =
            toml::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
        let text = std::fs::read_to_string(root().join("calibrations").join(calibration)).unwrap();
        let cal: toml::Table = toml::from_str(&text).unwrap();
        let residuals = cal["measurement"].as_array().unwrap();
        assert_eq!(residuals.len(), m.measurement.len(), "{calibration}");
        let (mut inside, mut widths) = (0usize, Vec::new());
        for (i, case) in m.measurement.iter().enumerate() {
            let r = residuals[i].as_table().unwrap();
            assert_eq!(r["label"].as_str(), Some(case.label.as_str()));
            let measured = r["measured_seconds"].as_float().unwrap();
            let left_out =
                measured * (1.0 + r["leave_one_out_percent"].as_float().unwrap() / 100.0);
            // The calibration without this measurement's residual.
            let mut without = cal.clone();
            let mut rest = residuals.clone();
            rest.remove(i);
            without.insert("measurement".into(), toml::Value::Array(rest));
            let path = tmp.path().join(format!("{i}-{calibration}"));
            std::fs::write(&path, toml::to_string(&without).unwrap()).unwrap();
            let j = estimate_with(&dir.join(&case.spec), Some(&path));
            let step = j["step_seconds"].as_f64().unwrap();
            let [lo, hi] = [0, 1].map(|k| j["step_seconds_interval"][k].as_f64().unwrap());
            let (lo, hi) = (left_out * lo / step, left_out * hi / step);
            inside += usize::from(lo <= measured && measured <= hi);
            widths.push(hi / lo);
        }
        widths.sort_by(f64::total_cmp);
        let n = m.measurement.len();
        let share = inside as f64 / n as f64;
        table.push_str(&format!(
            "| `{calibration}` | {n} | {inside} ({:.0}%) | {:.2} |\n",
            100.0 * share,
            widths[n / 2]
        ));
        assert!(
            share >= 0.8,
            "{calibration}: {inside} of {n} inside\n{table}"
        );
        (all_in, all_n) = (all_in + inside, all_n + n);
    }
    table.push_str(&format!(
        "| all | {all_n} | {all_in} ({:.0}%) | |\n",
        100.0 * all_in as f64 / all_n as f64
    ));
    let doc_path = root().join("docs/calibration.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let current = splice(&doc, (COVERAGE_START, COVERAGE_END), &table);
    expect_test::expect_file![&doc_path].assert_eq(&current);
}

/// The Megatron MoE model zoo's long-context pairs for Qwen3-235B-A22B on 256 H100s
/// (`best_practice/qwen3/readme.md`): the sequence, then TFLOP/s per GPU with forced balance
/// and dropless.
const DROPLESS_PAIRS: [(&str, f64, f64); 4] = [
    ("16k", 295.0, 237.0),
    ("32k", 335.0, 277.0),
    ("64k", 368.0, 320.0),
    ("128k", 389.0, 357.0),
];

/// The dropless imbalance the Qwen3-235B-A22B row of the zoo states (`routing_imbalance`
/// in its spec) is what the zoo's own forced-balance/dropless pairs of the same model on the
/// same GPUs measure: each pair's forced-balance spec priced again with that imbalance is
/// as many times slower as its published rates say, within 3% — so the row's value is the
/// source's measurement, not a free knob, and a change to how the imbalance is priced that
/// moves it fails here.
#[test]
fn dropless_routing_costs_what_the_model_zoo_measured() {
    let _gate = crate::util::shared();
    let dir = root().join("tests/fixtures/validation");
    let calibration = root().join("calibrations/nvidia-2024-2026.toml");
    let row: toml::Value =
        toml::from_str(&std::fs::read_to_string(dir.join("moe-zoo-qwen3-235b-a22b.toml")).unwrap())
            .unwrap();
    let given = &row["models"][0]["routing_imbalance"];
    let imbalance = given
        .as_float()
        .or_else(|| given.as_integer().map(|i| i as f64))
        .unwrap();
    assert!(imbalance > 1.0, "the row is dropless: {imbalance}");
    let step = |p: &Path| {
        estimate_with(p, Some(&calibration))["step_seconds"]
            .as_f64()
            .unwrap()
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut report = String::new();
    let mut worst: f64 = 0.0;
    for (seq, forced_tflops, dropless_tflops) in DROPLESS_PAIRS {
        let spec = dir.join(format!("moe-zoo-qwen3-235b-a22b-{seq}.toml"));
        let text = std::fs::read_to_string(&spec).unwrap();
        let forced: toml::Value = toml::from_str(&text).unwrap();
        assert!(
            forced["models"][0].get("routing_imbalance").is_none(),
            "{seq}: the forced-balance run"
        );
        let dropless = tmp.path().join(format!("{seq}.toml"));
        let with = text.replacen(
            "preset = \"qwen3-235b-a22b\"\n",
            &format!("preset = \"qwen3-235b-a22b\"\nrouting_imbalance = {imbalance}\n"),
            1,
        );
        assert_ne!(with, text, "{seq}");
        std::fs::write(&dropless, with).unwrap();
        let ours = step(&dropless) / step(&spec);
        let published = forced_tflops / dropless_tflops;
        let error = ours / published - 1.0;
        worst = worst.max(error.abs());
        report += &format!(
            "{seq}: dropless over forced {ours:.3}, published {published:.3} ({:+.1}%)\n",
            100.0 * error
        );
    }
    println!("routing_imbalance = {imbalance}:\n{report}");
    assert!(worst <= 0.03, "routing_imbalance = {imbalance}:\n{report}");
}
