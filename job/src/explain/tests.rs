use super::*;
use archplace_engine::pipeline::PipelineSchedule;
use archplace_engine::search::ModelPlan;
use archplace_engine::step::{MemoryBreakdown, TimeBreakdown};

fn conf(tensor_cores: u32, buffer_mib: u64, area_mm2: f64) -> Configuration {
    let mut chip = archplace_engine::space::REFERENCE_CONFIG;
    chip.tensor_cores = tensor_cores;
    chip.buffer_bytes = buffer_mib << 20;
    Configuration { chip, area_mm2 }
}

fn plan(forward: f64, data_parallel_seconds: f64, memory_gib: f64) -> ModelPlan {
    let time = TimeBreakdown {
        forward_seconds: forward,
        backward_seconds: 2.0 * forward,
        data_parallel_communication_seconds: data_parallel_seconds,
        ..TimeBreakdown::default()
    };
    ModelPlan {
        model: "m".into(),
        plan: serde_json::from_value(serde_json::json!({
            "micro_batch": 1, "activation_recomputation": false, "tensor_parallel": 1,
            "data_parallel": 8, "pipeline_stages": 2, "stage_layers": [2, 2],
        }))
        .expect("a plan's flat keys"),
        throughput_samples_per_second: 256.0 / time.total(),
        time_per_batch_seconds: time.total(),
        time,
        hbm_busy_seconds: None,
        memory_bytes: MemoryBreakdown {
            total: memory_gib * (1u64 << 30) as f64,
            ..MemoryBreakdown::default()
        },
        limiting: time.limiting().into(),
        gradient_all_reduce_seconds: data_parallel_seconds,
        throughput_tokens_per_second: 0.0,
        stages: Vec::new(),
        layers: Vec::new(),
        baseline: None,
        pipeline_schedule: None,
        one_f_one_b_throughput_samples_per_second: None,
    }
}

fn line(index: usize, c: Configuration, p: Option<ModelPlan>) -> ExploredLine {
    ExploredLine {
        index,
        configuration: c,
        bucket: 0,
        mean_throughput_samples_per_second: p.as_ref().map(|p| p.throughput_samples_per_second),
        hbm_bytes: p.as_ref().map(|_| 16 << 30),
        plans: p.into_iter().collect(),
        failure: None,
        node_size: None,
        domains: Vec::new(),
    }
}

/// The largest share names the resource; HBM binds at 90% full.
#[test]
fn a_plan_is_limited_by_its_largest_share_and_by_a_full_hbm() {
    let l = limit(&plan(0.1, 0.5, 8.0), 16 << 30, None);
    assert_eq!(l.resource, "data-parallel network");
    assert!((l.share - 0.5 / 0.8).abs() < 1e-12);
    assert!(!l.hbm_bound);
    assert!((l.hbm_fraction - 0.5).abs() < 1e-12);
    let l = limit(&plan(0.3, 0.1, 15.0), 16 << 30, None);
    assert_eq!(l.resource, CHIP);
    assert!(l.hbm_bound);
    assert_eq!(l.hbm_busy_fraction, None);
}

/// With the operators' memory times (interface 1.1) the chip's share is its HBM bandwidth
/// when the HBM is busy at least half the chip's time, else its compute.
#[test]
fn the_chip_is_limited_by_its_hbm_bandwidth_or_its_compute() {
    let mut p = plan(0.3, 0.1, 8.0);
    // The chip's time is forward 0.3 + backward 0.6.
    p.hbm_busy_seconds = Some(0.6);
    let l = limit(&p, 16 << 30, None);
    assert_eq!(l.resource, CHIP_HBM);
    assert!((l.hbm_busy_fraction.unwrap() - 0.6 / 0.9).abs() < 1e-12);
    assert!(
        words(&l).contains("HBM busy 67% of the chip's time"),
        "{}",
        words(&l)
    );
    p.hbm_busy_seconds = Some(0.3);
    let l = limit(&p, 16 << 30, None);
    assert_eq!(l.resource, CHIP_COMPUTE);
    assert!((l.share - 0.9 / 1.0).abs() < 1e-12);
}

/// A network resource names the tier its group's traffic crosses: the data-parallel group
/// of t × d = 8 ranks stays inside a node of 8, the same group over nodes of 4 does not,
/// and a one-tier network says so.
#[test]
fn a_network_limit_names_its_tier() {
    let tier = |gb: f64| Tier {
        bytes_per_second: gb * 1e9,
        latency_seconds: 0.0,
    };
    let mut net = Network {
        node_size: 8,
        host_bytes_per_second: None,
        overlap_efficiency: 1.0,
        intra_node: tier(300.0),
        inter_node: tier(25.0),
    };
    let p = plan(0.1, 0.5, 8.0);
    let l = limit(&p, 16 << 30, Some(&net));
    assert_eq!(
        l.resource,
        "data-parallel network (inside a node, 300 GB/s)"
    );
    net.node_size = 4;
    let l = limit(&p, 16 << 30, Some(&net));
    assert_eq!(l.resource, "data-parallel network (between nodes, 25 GB/s)");
    let l = limit(&p, 16 << 30, Some(&Network::flat(50e9)));
    assert_eq!(l.resource, "data-parallel network (one tier, 50 GB/s)");
}

/// Differences name the axes, the plan choices and the time parts that moved most.
#[test]
fn differences_name_axes_choices_and_time() {
    let a = plan(0.1, 0.05, 4.0);
    let mut b = plan(0.1, 0.127, 4.0);
    b.plan.step.data_parallel = 4;
    let d = differences(
        (&conf(4, 32, 100.0), 16 << 30, std::slice::from_ref(&a)),
        (&conf(8, 32, 180.0), 16 << 30, std::slice::from_ref(&b)),
    );
    assert_eq!(
        d,
        [
            "tensor_cores 4 → 8",
            "m: d 8 → 4",
            "m per batch: data-parallel communication +77.0 ms",
        ]
    );
}

/// The nearest smaller and larger value along each axis, other axes equal; chips that
/// differ in two axes are no one's neighbours.
#[test]
fn sensitivities_are_the_nearest_neighbours_along_each_axis() {
    let best = conf(4, 32, 100.0);
    let top = plan(0.1, 0.05, 4.0).throughput_samples_per_second;
    let explored = [
        line(0, conf(8, 32, 180.0), Some(plan(0.1, 0.1, 4.0))),
        line(1, conf(16, 32, 300.0), Some(plan(0.05, 0.1, 4.0))),
        line(2, conf(2, 32, 60.0), None),
        line(3, conf(4, 64, 110.0), Some(plan(0.1, 0.05, 4.0))),
        line(4, conf(8, 64, 190.0), Some(plan(0.01, 0.01, 4.0))),
    ];
    let s = sensitivities(&best, top, &explored);
    let tc = s.iter().find(|s| s.axis == "tensor_cores").unwrap();
    assert_eq!(tc.value, 4);
    assert_eq!(tc.neighbours.len(), 2);
    assert_eq!(tc.neighbours[0], (2, None));
    assert_eq!(tc.neighbours[1].0, 8);
    assert!((tc.neighbours[1].1.unwrap() - 0.35 / 0.4).abs() < 1e-12);
    let buffer = s.iter().find(|s| s.axis == "buffer_bytes").unwrap();
    assert_eq!(buffer.neighbours, [(64 << 20, Some(1.0))]);
    assert!(s.iter().all(|s| s.axis != "width"));
    let text = render(&Explanation {
        best: vec![limit(&plan(0.1, 0.05, 4.0), 16 << 30, None)],
        rivals: Vec::new(),
        sensitivities: s,
        schedules: vec![("gpt3".into(), PipelineSchedule::ZeroBubble, 0.125)],
    });
    assert!(
        text.contains("schedule: gpt3 runs zero-bubble (zero-bubble ZB-H1 (Qi et al. 2024)), +12.5% throughput over its best 1F1B plan"),
        "{text}"
    );
    assert!(
        text.contains("tensor_cores 4: 2 does not fit, 8 -12.5%"),
        "{text}"
    );
    assert!(text.contains("buffer 32 MiB: 64 MiB +0.0%"), "{text}");
}
