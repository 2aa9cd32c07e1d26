//! What `archplace estimate` does with a spec, from its cost models to the explained step:
//! the cost models resolved, the calibration applied (the file given, else the spec's or
//! its stack's), the step estimated (with its timeline when asked), and the interval the
//! calibration's draws put around it. The CLI and every other front end (the Python
//! package) call [`fn@estimate`] and print or convert what it returns, so that they cannot
//! disagree on a number.

use crate::calibrated::{self, Applied, StepInterval};
use crate::estimate::{self, EstimateDoc};
use archplace_cost_port::CostModelSource;
use archplace_engine::step::timeline::{Timeline, estimate_step_timeline};
use archplace_engine::step::{StepError, StepInput, StepReport, estimate_step};
use archplace_spec::calibration::CalibrationError;
use archplace_spec::{Diagnostic, EstimateSpecError, Scheduling, Spec};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// How to estimate.
#[derive(Debug, Clone, Copy)]
pub struct EstimateOptions<'a> {
    /// A calibration file to apply instead of the spec's `[cost_model] calibration` (and
    /// of its stack's).
    pub calibration: Option<&'a Path>,
    /// How the layers are scheduled: the list schedule (`estimate`'s default) or as the
    /// search does (`--mip`).
    pub scheduling: Scheduling,
    /// Also draw the step's timeline.
    pub timeline: bool,
}

impl Default for EstimateOptions<'_> {
    fn default() -> Self {
        EstimateOptions {
            calibration: None,
            scheduling: Scheduling::ListSchedule,
            timeline: false,
        }
    }
}

/// Why a spec could not be estimated at all (a plan that cannot run is an answer, not an
/// error: [`Estimated::result`]).
#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    /// The spec's cost models: each problem located in the spec.
    #[error("{} error(s) in the spec's cost models", .0.len())]
    CostModel(Vec<Diagnostic>),
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
    /// The spec has no single model and `[plan]` to estimate.
    #[error(transparent)]
    Spec(#[from] EstimateSpecError),
    /// The latency model failed on one of the step's operators.
    #[error("the latency model failed: {0}")]
    LatencyModel(String),
}

/// One spec's step, estimated: the spec with its calibration applied, the step's input,
/// the answer (or why the plan cannot run), the calibration and the interval.
#[derive(Debug)]
pub struct Estimated {
    /// The spec as estimated: calibrated, when a calibration applies.
    pub spec: Spec,
    pub input: StepInput,
    /// The latency model's name and version.
    pub latency_model: String,
    /// The step, or why the plan cannot run on the chip (it does not fit, or cannot be
    /// laid out).
    pub result: Result<StepReport, StepError>,
    pub applied: Option<Applied>,
    /// The step's interval under the calibration's draws and the spec's declared ranges.
    pub interval: Option<StepInterval>,
    /// The step's timeline, when asked for and the plan runs.
    pub timeline: Option<Timeline>,
}

/// Estimates the step of `written` (a spec with one model and a `[plan]`), its cost models
/// from `source`.
pub fn estimate(
    written: &Spec,
    source: &dyn CostModelSource,
    options: EstimateOptions<'_>,
) -> Result<Estimated, EstimateError> {
    let written_models =
        archplace_spec::resolve_cost_models(written, source, Arc::new(AtomicBool::new(false)))
            .map_err(EstimateError::CostModel)?;
    let (spec, models, applied) = calibrated::apply(
        written.clone(),
        written_models.clone(),
        options.calibration,
        source,
    )?;
    let input = spec.step_input(options.scheduling)?;
    let info = models.latency.info();
    let latency_model = format!("{} {}", info.name, info.version);
    // The step, made while the interval's exact points are evaluated beside it.
    let point = || {
        let (result, timeline) = if options.timeline {
            match estimate_step_timeline(&input, models.latency.as_ref()) {
                Ok((r, t)) => (Ok(r), Some(t)),
                Err(e) => (Err(e), None),
            }
        } else {
            (estimate_step(&input, models.latency.as_ref()), None)
        };
        let step = result
            .as_ref()
            .ok()
            .map(|r| (r.step_seconds, r.tokens_per_second_per_device));
        ((result, timeline), step)
    };
    let ((result, timeline), interval) = calibrated::step_with_interval(
        written,
        &written_models,
        applied.as_ref(),
        source,
        options.scheduling,
        point,
    )?;
    if let Err(StepError::CostModel(e)) = &result {
        return Err(EstimateError::LatencyModel(e.to_string()));
    }
    Ok(Estimated {
        spec,
        input,
        latency_model,
        result,
        applied,
        interval,
        timeline,
    })
}

impl Estimated {
    /// `estimate --json`'s document.
    pub fn document(&self) -> EstimateDoc<'_> {
        estimate::document(&self.spec, &self.input, &self.latency_model, &self.result)
            .with_uncertainty(self.applied.as_ref(), self.interval.as_ref())
    }

    /// `estimate`'s text: the stack, the explained step, the calibration and the interval
    /// — or the plan and why it cannot run.
    pub fn render(&self) -> String {
        let mut parts = Vec::new();
        if let Some(stack) = &self.spec.stack {
            parts.push(format!(
                "stack: {stack} (its defaults for the [training] keys and cost-model parameters the spec leaves out)"
            ));
        }
        match &self.result {
            Ok(r) => {
                parts.push(estimate::render(&self.input, &self.latency_model, r));
                if let Some(a) = &self.applied {
                    parts.push(estimate::render_calibration(a));
                }
                if let Some(i) = &self.interval {
                    parts.push(estimate::render_interval(i));
                }
            }
            Err(e) => {
                parts.push(format!(
                    "{}\nplan: {}",
                    self.input.model.name,
                    estimate::describe_plan(&self.input)
                ));
                parts.push(format!("cannot run: {e}"));
            }
        }
        parts.join("\n")
    }

    /// Whether the plan runs on the chip.
    pub fn feasible(&self) -> bool {
        self.result.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use archplace_cost_port::NativeModels;

    /// GPT-3 175B on 1,024 A100-like chips, the reference latency model (linked natively).
    const SPEC: &str = r#"
schema_version = 1
name = "gpt3"

[[models]]
preset = "gpt3-175b"

[training]
global_batch = 1024
optimizer = "adam"

[cluster]
devices = 1024
link_bandwidth = "25 GB/s"

[accelerator]
tensor_cores = 108
vector_cores = 108
width = 32
depth = 32
buffer = "40 MiB"
hbm = "80 GiB"

[plan]
tensor_parallel = 8
pipeline_parallel = 16
data_parallel = 8
micro_batch = 1
recomputation = "full"
"#;

    fn spec(text: &str) -> Spec {
        archplace_spec::parse(text, "gpt3.toml").expect("a valid spec")
    }

    /// Uncalibrated, the orchestration adds nothing to the step model: the same report as
    /// the engine's on the spec's own input, in the document and the text.
    #[test]
    fn an_uncalibrated_estimate_is_the_engines_step() {
        let s = spec(SPEC);
        let e = estimate(&s, &NativeModels, EstimateOptions::default()).unwrap();
        let models = archplace_spec::resolve_cost_models(
            &s,
            &NativeModels,
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap();
        let input = s.step_input(Scheduling::ListSchedule).unwrap();
        let direct = estimate_step(&input, models.latency.as_ref()).unwrap();
        let r = e.result.as_ref().unwrap();
        assert_eq!(r, &direct);
        assert!(e.feasible() && e.applied.is_none() && e.interval.is_none());
        assert!(e.timeline.is_none());
        let doc = serde_json::to_value(e.document()).unwrap();
        assert_eq!(doc["step_seconds"].as_f64(), Some(direct.step_seconds));
        assert_eq!(doc["feasible"], serde_json::Value::Bool(true));
        let text = e.render();
        assert!(text.starts_with("gpt3-175b"), "{text}");
        assert!(text.contains("step time") && !text.contains("calibration"));
        // Asked for, the timeline comes with the same step.
        let with = EstimateOptions {
            timeline: true,
            ..EstimateOptions::default()
        };
        let t = estimate(&s, &NativeModels, with).unwrap();
        assert!(t.timeline.is_some());
        assert_eq!(t.result.unwrap().step_seconds, direct.step_seconds);
    }

    /// A plan that does not fit is an answer (what and why), not an error.
    #[test]
    fn a_plan_that_cannot_run_is_an_answer() {
        let s = spec(&SPEC.replace("hbm = \"80 GiB\"", "hbm = \"1 GiB\""));
        let e = estimate(&s, &NativeModels, EstimateOptions::default()).unwrap();
        assert!(!e.feasible());
        let text = e.render();
        assert!(
            text.contains("plan: ") && text.contains("cannot run: "),
            "{text}"
        );
        let doc = serde_json::to_value(e.document()).unwrap();
        assert_eq!(doc["feasible"], serde_json::Value::Bool(false));
    }

    /// What stops an estimate, each its own error: the cost models (located in the spec),
    /// the calibration file, a spec without a plan.
    #[test]
    fn what_cannot_be_estimated_says_why() {
        let s = spec(&format!(
            "{SPEC}\n[cost_model]\narea = \"reference\"\nlatency = \"gpu-like\"\n"
        ));
        match estimate(&s, &NativeModels, EstimateOptions::default()) {
            Err(EstimateError::CostModel(d)) => {
                assert!(!d.is_empty());
                assert!(d.iter().any(|d| d.message.contains("gpu-like")), "{d:?}");
            }
            other => panic!("{other:?}"),
        }
        let missing = Path::new("no-such-calibration.toml");
        let options = EstimateOptions {
            calibration: Some(missing),
            ..EstimateOptions::default()
        };
        let e = estimate(&spec(SPEC), &NativeModels, options).unwrap_err();
        assert!(matches!(e, EstimateError::Calibration(_)), "{e:?}");
        assert!(e.to_string().contains("no-such-calibration.toml"), "{e}");
        let no_plan = SPEC.split("[accelerator]").next().unwrap();
        let e = estimate(&spec(no_plan), &NativeModels, EstimateOptions::default()).unwrap_err();
        assert!(matches!(e, EstimateError::Spec(_)), "{e:?}");
    }
}
