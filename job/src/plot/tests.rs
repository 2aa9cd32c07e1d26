#![allow(clippy::unwrap_used)]

use super::pareto::frontier;
use super::*;
use archplace_engine::search::{Evaluated, ModelPlan, StageReport};
use archplace_engine::space::REFERENCE_CONFIG;
use archplace_plugin_sdk::AcceleratorConfig;

/// The texts of an SVG document, after checking that it parses as XML with an `svg` root.
pub fn svg_texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.tag_name().name() == "text")
        .map(|n| n.text().unwrap_or("").to_string())
        .collect()
}

fn chip(tensor_cores: u32) -> AcceleratorConfig {
    AcceleratorConfig {
        tensor_cores,
        ..REFERENCE_CONFIG
    }
}

fn candidate(index: usize, config: AcceleratorConfig, area_mm2: f64, t: Option<f64>) -> Evaluated {
    Evaluated {
        index,
        config,
        area_um2: area_mm2 * 1e6,
        bucket: 0,
        mean_throughput_samples_per_second: t,
        hbm_bytes: t.map(|_| 32 << 30),
        plans: Vec::new(),
        failure: t.is_none().then(|| "does not fit".to_string()),
        node_size: None,
        domains: Vec::new(),
    }
}

#[test]
fn the_frontier_keeps_only_candidates_no_smaller_one_beats() {
    let pts = [
        (100.0, 5.0),
        (120.0, 4.0), // beaten by a smaller, faster one
        (150.0, 7.0),
        (150.0, 6.0), // same area, slower
        (90.0, 5.0),  // as fast and smaller than (100, 5)
        (200.0, 7.0), // not faster than (150, 7)
        (210.0, 9.0),
    ];
    assert_eq!(
        frontier(&pts),
        vec![(90.0, 5.0), (150.0, 7.0), (210.0, 9.0)]
    );
    assert!(frontier(&[]).is_empty());
}

#[test]
fn pareto_svg_is_valid_and_labels_axes_best_reference_and_frontier() {
    let explored = vec![
        candidate(0, REFERENCE_CONFIG, 278.8, Some(10.0)),
        candidate(1, chip(4), 200.0, Some(12.0)),
        candidate(2, chip(2), 150.0, Some(8.0)),
        candidate(3, chip(1), 120.0, None),
    ];
    let svg = pareto_svg(&ParetoInput {
        title: "unit",
        explored: &explored,
        best: Some(1),
        reference: Some((REFERENCE_CONFIG, Some(278.8e6))),
        budget_um2: 278.8e6,
        colour_by: None,
    })
    .unwrap();
    let texts = svg_texts(&svg).join("\n");
    for want in [
        "chip area (mm²)",
        "throughput, mean over the models (samples/s)",
        "best: 4 TC 128×128, 2 VC ×128, 128 MiB — 200.0 mm², 12.0000 samples/s",
        "reference configuration: 8 TC 128×128, 2 VC ×128, 128 MiB — 278.8 mm², 10.0000 samples/s",
        "Pareto frontier (2 candidates)",
        "1 that fit no plan are not shown",
        "area budget (278.8 mm²)",
    ] {
        assert!(texts.contains(want), "missing {want:?} in\n{texts}");
    }
    // Three evaluated points, two frontier points, the best's two circles.
    assert!(svg.matches("<circle").count() >= 3 + 2 + 2, "{svg}");
}

#[test]
fn pareto_svg_draws_a_search_where_nothing_fits_or_the_reference_is_unknown() {
    let explored = vec![candidate(0, chip(2), 150.0, None)];
    let svg = pareto_svg(&ParetoInput {
        title: "nothing fits",
        explored: &explored,
        best: None,
        reference: Some((REFERENCE_CONFIG, None)),
        budget_um2: 300e6,
        colour_by: None,
    })
    .unwrap();
    let texts = svg_texts(&svg).join("\n");
    assert!(texts.contains("chip area (mm²)"), "{texts}");
    assert!(!texts.contains("best:"), "{texts}");
}

fn stage(first: &str, last: &str, layers: usize, seconds: f64, gib: f64) -> StageReport {
    StageReport {
        first_layer: first.into(),
        last_layer: last.into(),
        layers,
        devices: 8,
        load_seconds: seconds,
        memory_bytes: gib * (1u64 << 30) as f64,
    }
}

fn plan(stages: Vec<StageReport>) -> ModelPlan {
    ModelPlan {
        model: "bert-large".into(),
        plan: serde_json::from_value(serde_json::json!({
            "micro_batch": 4, "activation_recomputation": true, "recomputation": "full",
            "tensor_parallel": 2, "data_parallel": 4, "pipeline_stages": stages.len(),
            "stage_layers": [12, 12],
        }))
        .expect("a plan's flat keys"),
        time_per_batch_seconds: 1.5,
        gradient_all_reduce_seconds: 0.25,
        throughput_samples_per_second: 2730.0,
        throughput_tokens_per_second: 2730.0 * 512.0,
        stages,
        hbm_busy_seconds: None,
        time: archplace_engine::step::TimeBreakdown {
            forward_seconds: 0.3,
            backward_seconds: 0.6,
            recomputation_seconds: 0.3,
            pipeline_bubble_seconds: 0.05,
            data_parallel_communication_seconds: 0.25,
            ..Default::default()
        },
        memory_bytes: archplace_engine::step::MemoryBreakdown {
            weights: 2.0 * (1u64 << 30) as f64,
            gradients: 4.0 * (1u64 << 30) as f64,
            optimizer: 12.0 * (1u64 << 30) as f64,
            activations: 2.5 * (1u64 << 30) as f64,
            total: 20.5 * (1u64 << 30) as f64,
        },
        limiting: "backward".into(),
        layers: Vec::new(),
        baseline: None,
        pipeline_schedule: None,
        one_f_one_b_throughput_samples_per_second: None,
    }
}

#[test]
fn placement_svg_shows_stages_layers_devices_time_and_memory_against_hbm() {
    let p = plan(vec![
        stage("embedding", "block 11", 13, 0.012, 20.5),
        stage("block 12", "head", 13, 0.011, 19.0),
    ]);
    let svg = placement_svg("unit", "8 TC 128×128", &[p], 32 << 30).unwrap();
    let texts = svg_texts(&svg).join("\n");
    for want in [
        "bert-large: 2 pipeline stages, t = 2 (tensor), d = 4 (data) — 64 devices",
        "stage 1",
        "embedding – block 11",
        "block 12 – head",
        "13 layers",
        "8 × 4 = 32 devices",
        "time (ms)",
        "memory (GiB)",
        "HBM limit 32 GiB",
        "HBM 32 GiB",
        "backward 40%",
        "limited by backward",
        "20.5 GiB = weights 2.0 + gradients 4.0 + optimizer 12.0 + activations 2.5",
    ] {
        assert!(texts.contains(want), "missing {want:?} in\n{texts}");
    }
}

#[test]
fn placement_svg_of_many_stages_and_of_no_plan_is_still_valid() {
    let stages = (0..96)
        .map(|i| stage(&format!("block {i}"), &format!("block {i}"), 1, 0.001, 1.0))
        .collect();
    let svg = placement_svg("many", "chip", &[plan(stages)], 80 << 30).unwrap();
    let texts = svg_texts(&svg).join("\n");
    assert!(
        texts.contains("96 stages from block 0 to block 95"),
        "{texts}"
    );
    let svg = placement_svg("none", "no chip", &[], 0).unwrap();
    assert!(svg_texts(&svg).join("\n").contains("no plan"));
}

/// A million evaluated candidates draw no more dots than the picture has cells for: the
/// plot's size does not grow with the search, and the legend still counts them
/// all.
#[test]
fn pareto_svg_of_a_huge_search_stays_small() {
    let n = 1_000_000;
    let explored: Vec<Evaluated> = (0..n)
        .map(|i| {
            let area = 100.0 + (i % 1000) as f64 * 0.2;
            let t = 1.0 + ((i * 7919) % 10_007) as f64 / 1000.0;
            candidate(i, chip(2), area, Some(t))
        })
        .collect();
    let svg = pareto_svg(&ParetoInput {
        title: "huge",
        explored: &explored,
        best: Some(0),
        reference: None,
        budget_um2: 300e6,
        colour_by: None,
    })
    .unwrap();
    let dots = svg.matches("<circle").count();
    assert!(dots <= 300 * 200 + 100, "{dots} dots");
    assert!(svg.len() < 16 << 20, "{} bytes", svg.len());
    assert!(
        svg_texts(&svg)
            .join("\n")
            .contains("evaluated candidates (1000000"),
        "the legend counts every candidate"
    );
}

/// Coloured by an axis, each value is a series of its own with its count in the legend,
/// in one colour each; the buffer's values are sizes.
#[test]
fn pareto_svg_colours_points_by_an_axis() {
    let explored = vec![
        candidate(0, REFERENCE_CONFIG, 278.8, Some(10.0)),
        candidate(1, chip(4), 200.0, Some(12.0)),
        candidate(2, chip(4), 210.0, Some(11.0)),
        candidate(3, chip(2), 150.0, Some(8.0)),
        candidate(4, chip(1), 120.0, None),
    ];
    let svg = |axis| {
        pareto_svg(&ParetoInput {
            title: "coloured",
            explored: &explored,
            best: Some(1),
            reference: None,
            budget_um2: 300e6,
            colour_by: Some(axis),
        })
        .unwrap()
    };
    let texts = svg_texts(&svg(archplace_engine::space::ChipAxis::TensorCores)).join("\n");
    for want in [
        "tensor_cores 2 (1 candidates)",
        "tensor_cores 4 (2 candidates)",
        "tensor_cores 8 (1 candidates; 1 that fit no plan are not shown)",
    ] {
        assert!(texts.contains(want), "missing {want:?} in\n{texts}");
    }
    assert!(!texts.contains("evaluated candidates"), "{texts}");
    let texts = svg_texts(&svg(archplace_engine::space::ChipAxis::Buffer)).join("\n");
    assert!(texts.contains("buffer 128 MiB (4 candidates"), "{texts}");
}
