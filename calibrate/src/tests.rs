//! Calibration end to end on the `gpu-like` component (built by `scripts/build-plugins`):
//! measurements made with known parameter values are fitted back to those values, and a
//! calibration made for another plugin or version is refused.

// Fixture files are read whole, as tests do.
#![allow(clippy::disallowed_methods)]

use crate::{Options, Problem, fit, measurements};
use archplace_cost_port::ParameterRef;
use archplace_plugin_host::HostOptions;
use archplace_plugin_host::testing::target;
use archplace_spec::calibration::{self, Calibration};
use std::path::Path;

fn host() -> archplace_plugin_host::Host {
    archplace_plugin_host::Host::new(HostOptions {
        plugin_dirs: vec![target().join("plugins")],
        no_memo: true,
        ..HostOptions::default()
    })
    .expect("a host over target/plugins")
}

fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The spec of one published A100 run, with the GPU-like model's values for the
/// parameters `values` instead of the preset's.
fn spec_text(values: &[(&str, &str)]) -> String {
    let text = std::fs::read_to_string(
        root().join("tests/fixtures/validation/korthikanti2022-22b-full.toml"),
    )
    .unwrap();
    let extra: String = values
        .iter()
        .map(|(k, v)| format!("{k} = \"{v}\"\n"))
        .collect();
    text.replace(
        "[cost_model.parameters.gpu-like]\n",
        &format!("[cost_model.parameters.gpu-like]\n{extra}"),
    )
}

/// Measurements "made" with matrix_efficiency 0.70, memory_efficiency 0.75 and a launch
/// overhead of 9 µs (the preset's are 0.859, 0.883 and 4 µs): GEMMs, vector operations of
/// several sizes and two steps, each measured as the model with those values predicts it;
/// the fit recovers the three values within 0.5%, and its in-sample and cross-validated
/// errors are near zero.
#[test]
fn fitting_measurements_made_with_known_values_gives_those_values_back() {
    let host = host();
    let truth = [
        ("matrix_efficiency", "0.70"),
        ("memory_efficiency", "0.75"),
        ("launch_overhead", "9 us"),
    ];
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("known.toml"), spec_text(&truth)).unwrap();
    std::fs::write(dir.path().join("preset.toml"), spec_text(&[])).unwrap();
    // What the model with the known values says, for each operator and step.
    let ops = [
        "gemm = [8192, 8192, 8192]",
        "gemm = [2048, 6144, 6144]",
        "gemm = [512, 1024, 1024]",
        "vector = \"layer_norm\"\nelements = 100000000\nrow = 6144",
        "vector = \"gelu\"\nelements = 50000000",
        "vector = \"add\"\nelements = 1000",
        "vector = \"softmax\"\nelements = 4000\nrow = 1000",
    ];
    let mut known = String::from("schema_version = 1\n");
    for (i, op) in ops.iter().enumerate() {
        known.push_str(&format!(
            "[[measurement]]\nsource = \"synthetic operators\"\nlabel = \"op {i}\"\nspec = \"known.toml\"\nmetric = \"step_seconds\"\nvalue = 1.0\n[measurement.op]\n{op}\n"
        ));
    }
    known.push_str("[[measurement]]\nsource = \"synthetic steps\"\nlabel = \"step\"\nspec = \"known.toml\"\nmetric = \"step_seconds\"\nvalue = 1.0\n");
    known.push_str("[[measurement]]\nsource = \"synthetic steps\"\nlabel = \"step, micro-batch 2\"\nspec = \"known.toml\"\noverrides = { \"plan.micro_batch\" = 2 }\nmetric = \"step_seconds\"\nvalue = 1.0\n");
    // Op measurements need metric op_seconds.
    let known = known.replacen(
        "metric = \"step_seconds\"\nvalue = 1.0\n[measurement.op]",
        "metric = \"op_seconds\"\nvalue = 1.0\n[measurement.op]",
        usize::MAX,
    );
    std::fs::write(dir.path().join("known-measurements.toml"), &known).unwrap();
    let loaded = measurements::load(&dir.path().join("known-measurements.toml")).unwrap();
    let fit_names: Vec<String> = truth.iter().map(|(n, _)| format!("gpu-like.{n}")).collect();
    let made = Problem::new(&host, &loaded.measurements, Some(&fit_names)).unwrap();
    // The measured figures: the known model's predictions.
    let measured: Vec<f64> = made.uncalibrated_seconds.clone();

    // The same measurements of the preset's spec, with those figures.
    let mut text = known.replace("spec = \"known.toml\"", "spec = \"preset.toml\"");
    let mut k = 0;
    text = text
        .split("value = 1.0")
        .enumerate()
        .map(|(i, part)| {
            if i == 0 {
                part.to_string()
            } else {
                k += 1;
                format!("value = {:e}{part}", measured[k - 1])
            }
        })
        .collect();
    let path = dir.path().join("measurements.toml");
    std::fs::write(&path, &text).unwrap();
    let loaded = measurements::load(&path).unwrap();
    let problem = Problem::new(&host, &loaded.measurements, Some(&fit_names)).unwrap();
    let f = fit::fit(
        &problem,
        Options {
            bootstrap: 20,
            ..Options::default()
        },
        &|_| {},
    )
    .unwrap();
    for ((name, value), (p, factor)) in truth.iter().zip(problem.parameters.iter().zip(&f.factors))
    {
        let want: f64 = value.trim_end_matches(" us").parse().unwrap();
        let base = problem.base[0][&p.parameter];
        let got = base * factor;
        assert!(
            (got / want - 1.0).abs() < 0.005,
            "{name}: fitted {got}, made with {want} (from {base})"
        );
    }
    for (what, r) in [
        ("in-sample", &f.in_sample),
        ("leave-one-out", &f.leave_one_out),
    ] {
        let worst = r.iter().fold(0.0_f64, |m, x| m.max(x.abs()));
        assert!(worst < 0.01, "{what}: a residual of {worst}");
    }
    assert!(f.warnings.is_empty(), "{:?}", f.warnings);
}

/// A calibration for another plugin, or another version of this one, is refused with both
/// named; the one it was made for is applied, and moves the parameter as it says.
#[test]
fn a_calibration_for_another_plugin_or_version_is_refused() {
    let host = host();
    let spec = archplace_spec::parse(&spec_text(&[]), "spec.toml").unwrap();
    let models = archplace_spec::resolve_cost_models(&spec, &host, Default::default()).unwrap();
    let version = models.latency.info().version;
    let calibration = |name: &str, version: &str| {
        Calibration::parse(&format!(
            "format = \"archplace-calibration\"\nformat_version = 1\ndraws = []\n[plugin]\nname = \"{name}\"\nversion = \"{version}\"\n[[parameters]]\nparameter = \"gpu-like.matrix_efficiency\"\nfactor = 0.5\nlower = 0.3\nupper = 1.0\n"
        ))
        .unwrap()
    };
    for (name, v) in [("reference", version.as_str()), ("gpu-like", "9.9.9")] {
        let e = calibration::apply(&spec, &models, &calibration(name, v), "c.toml", None, &host)
            .err()
            .expect("refused");
        let text = e.to_string();
        assert!(
            text.contains(&format!("made for latency model `{name} {v}`"))
                && text.contains(&format!("`gpu-like {version}`")),
            "{text}"
        );
    }
    let (calibrated, m) = calibration::apply(
        &spec,
        &models,
        &calibration("gpu-like", &version),
        "c.toml",
        None,
        &host,
    )
    .unwrap();
    let before = calibration::configured(&spec, models.latency.as_ref());
    let after = calibration::configured(&calibrated, m.latency.as_ref());
    let p = ParameterRef::new("gpu-like", "matrix_efficiency");
    assert!(
        (after[&p] - 0.5 * before[&p]).abs() < 1e-9,
        "{before:?} → {after:?}"
    );
}

/// A measurements file with problems is refused with every one of them: an unknown key
/// (located, with its line), and, once it reads, each measurement's own problem named
/// with its number and source.
#[test]
fn a_bad_measurements_file_is_refused_with_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.toml"), spec_text(&[])).unwrap();
    let path = dir.path().join("m.toml");
    std::fs::write(
        &path,
        "schema_version = 1\n[[measurement]]\nsource = \"a\"\nspec = \"spec.toml\"\nmetric = \"step_seconds\"\nvalu = 3.0\n",
    )
    .unwrap();
    let e = measurements::load(&path)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("m.toml:6") && e.contains("valu"), "{e}");
    std::fs::write(
        &path,
        "schema_version = 1\n\
         [[measurement]]\nsource = \"a\"\nspec = \"spec.toml\"\nmetric = \"tflops_per_device\"\nvalue = 150\n\
         [[measurement]]\nsource = \"b\"\nspec = \"nonesuch.toml\"\nmetric = \"step_seconds\"\nvalue = 1\n\
         [[measurement]]\nsource = \"c\"\nspec = \"spec.toml\"\nmetric = \"step_seconds\"\nvalue = -1\n\
         [[measurement]]\nsource = \"d\"\nspec = \"spec.toml\"\nmetric = \"op_seconds\"\nvalue = 1e-3\n[measurement.op]\ngemm = [0, 8, 8]\n",
    )
    .unwrap();
    let e = measurements::load(&path)
        .err()
        .expect("refused")
        .to_string();
    for says in [
        "measurement 1 (a): metric tflops_per_device needs `flop_convention`",
        "measurement 2 (b): cannot read",
        "measurement 3 (c): value -1 is not a positive number",
        "measurement 4 (d): `gemm` is [m, n, k] or [batch, m, n, k]",
    ] {
        assert!(e.contains(says), "{says}\n{e}");
    }
}

/// A parameter that moves and then stops mattering is reported as such, not as one that
/// stayed at the specs' values: llm-foundry's H100 runs fitted with the InfiniBand
/// efficiency but not NVLink's move it until FSDP's gathers hide behind computation in
/// every run (docs/calibration.md, "What llm-foundry's runs ask for").
#[test]
fn a_parameter_that_moved_until_nothing_depended_on_it_says_so() {
    let host = host();
    let dir = root().join("tests/fixtures/validation");
    let text = std::fs::read_to_string(dir.join("measurements-pytorch-fsdp-2023.toml")).unwrap();
    // The specs by absolute path, from a copy in a temporary folder.
    let text = text.replace("spec = \"", &format!("spec = \"{}/", dir.display()));
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("measurements.toml");
    std::fs::write(&path, text).unwrap();
    // llm-foundry's runs only: the file's fms-fsdp runs, on 12.5 GB/s a GPU between nodes,
    // determine the InfiniBand efficiency.
    let foundry: Vec<_> = measurements::load(&path)
        .unwrap()
        .measurements
        .into_iter()
        .filter(|m| m.source.starts_with("llm-foundry"))
        .collect();
    assert_eq!(foundry.len(), 18, "llm-foundry's two H100 tables");
    let names = [
        "gpu-like.matrix_efficiency",
        "gpu-like.attention_efficiency",
        "cluster.inter_node_efficiency",
    ]
    .map(String::from);
    let problem = Problem::new(&host, &foundry, Some(&names)).unwrap();
    let (factors, warning) = fitted_with_warning(&problem, "cluster.inter_node_efficiency");
    let inter = factors[2];
    assert!(
        (inter - 1.0).abs() > 0.05
            && warning.contains("at its fitted factor")
            && !warning.contains("stays at the specs' values"),
        "factor {inter}: {warning}"
    );
}

/// Fits `problem` (a small bootstrap) and returns the factors and the warning about
/// `parameter`, which must be there.
fn fitted_with_warning(problem: &Problem<'_>, parameter: &str) -> (Vec<f64>, String) {
    let f = fit::fit(
        problem,
        Options {
            bootstrap: 10,
            ..Options::default()
        },
        &|_| {},
    )
    .unwrap();
    let warning = f
        .warnings
        .iter()
        .find(|w| w.starts_with(parameter))
        .unwrap_or_else(|| panic!("no warning about {parameter}: {:?}", f.warnings))
        .clone();
    (f.factors, warning)
}

/// A parameter whose cost hides behind others at the specs' value but shows below it is
/// held there, and the warning says it shows at the lower bound (so a user can start it
/// lower): FSDP's gathers and reduce-scatters for MPT-13B on 64 H100s, hidden at their full
/// rate beside an attention kernel as slow as llm-foundry's Triton one.
#[test]
fn a_parameter_hidden_at_the_specs_value_but_not_below_says_so() {
    let host = host();
    let dir = root().join("tests/fixtures/validation");
    let tmp = tempfile::tempdir().unwrap();
    let spec = std::fs::read_to_string(dir.join("foundry-mpt-13b-2048-64.toml"))
        .unwrap()
        .replace(
            "[cost_model.parameters.gpu-like]\n",
            "[cost_model.parameters.gpu-like]\nattention_efficiency = 0.17\nattention_tile_overhead = 3.8\n",
        );
    std::fs::write(tmp.path().join("run.toml"), spec).unwrap();
    let path = tmp.path().join("measurements.toml");
    std::fs::write(
        &path,
        "schema_version = 1\n[[measurement]]\nsource = \"llm-foundry MPT benchmarks, H100 80GB BF16\"\nlabel = \"MPT-13b, 2048 tokens, 64 GPUs\"\nspec = \"run.toml\"\nmetric = \"step_seconds\"\nvalue = 0.853308\n",
    )
    .unwrap();
    let loaded = measurements::load(&path).unwrap();
    let names = ["cluster.overlap_efficiency".to_string()];
    let problem = Problem::new(&host, &loaded.measurements, Some(&names)).unwrap();
    let (factors, warning) = fitted_with_warning(&problem, "cluster.overlap_efficiency");
    assert!(
        factors[0] == 1.0 && warning.contains("at its lower bound (0.10 times them)"),
        "factor {}: {warning}",
        factors[0]
    );
}
