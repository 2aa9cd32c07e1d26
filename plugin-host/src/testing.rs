//! Fixtures for tests of code that hosts plugins (cargo feature `testing`): where
//! `scripts/build-plugins` put the components, a host over them, random operators.

use crate::{Host, HostOptions};
use archplace_plugin_sdk::testing::Rng;
use archplace_plugin_sdk::{Direction, FusedOp, Gemm, Op, OpKind, VectorKind};
use std::path::PathBuf;

/// The workspace's `target/` folder, where `scripts/build-plugins` installs components.
pub fn target() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// A built component: `plugins/<name>/<name>.wasm` or `plugin-fixtures/<name>.wasm`.
pub fn component(name: &str) -> PathBuf {
    let installed = target().join(format!("plugins/{name}/{name}.wasm"));
    let fixture = target().join(format!("plugin-fixtures/{name}.wasm"));
    for p in [installed, fixture] {
        if p.is_file() {
            return p;
        }
    }
    panic!("the `{name}` component is not built: run scripts/build-plugins (scripts/test does)");
}

/// A host over the built plugins (`target/plugins`) with default limits and no disk cache.
pub fn host() -> Host {
    Host::new(HostOptions {
        plugin_dirs: vec![target().join("plugins")],
        ..HostOptions::default()
    })
    .expect("a host over target/plugins")
}

/// Random operators of every kind, on the shapes the engine produces.
pub fn random_ops(rng: &mut Rng, n: usize) -> Vec<Op> {
    let dims = [1u64, 8, 64, 96, 128, 512, 1024, 2048, 4096, 12288, 50257];
    let pick = |rng: &mut Rng| dims[rng.below(dims.len() as u64) as usize];
    (0..n)
        .map(|_| {
            let direction = if rng.below(2) == 0 {
                Direction::Forward
            } else {
                Direction::Backward
            };
            let kind = match rng.below(3) {
                0 => OpKind::Gemm(Gemm {
                    batch: pick(rng),
                    m: pick(rng),
                    n: pick(rng),
                    k: pick(rng),
                }),
                1 => OpKind::Vector {
                    kind: VectorKind::ALL[rng.below(VectorKind::ALL.len() as u64) as usize],
                    elements: pick(rng) * pick(rng),
                    row: pick(rng),
                },
                _ => OpKind::AllReduce {
                    bytes: pick(rng) * pick(rng) * 2,
                    group: 1 + rng.below(8) as u32,
                    link_bytes_per_second: 1 + rng.below(1 << 36),
                },
            };
            let fused = if matches!(kind, OpKind::Gemm(_)) && rng.below(3) == 0 {
                vec![FusedOp {
                    kind: VectorKind::Gelu,
                    elements: pick(rng) * pick(rng),
                }]
            } else {
                vec![]
            };
            Op {
                kind,
                direction,
                fused,
                element: archplace_plugin_sdk::ElementType::Bf16,
            }
        })
        .collect()
}
