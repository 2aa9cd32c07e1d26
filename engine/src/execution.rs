//! How the software that trains the model lets a layer's operators share the chip.
//!
//! The layer schedule's own semantics are a dataflow accelerator's (the reference's):
//! operators on different cores run at the same time, and tensor-parallel collectives use
//! the network while the cores compute. Frameworks do not always allow that: Megatron-LM
//! on GPUs issues one kernel at a time on one stream, each kernel spread over the whole
//! chip, and waits for every tensor-parallel collective before the next kernel that
//! follows it. [`Execution`] says which: a choice of the training plan, an input of the
//! search (`crate::operators::restrict` turns a layer's scheduling instance into one that
//! allows only that).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whether a layer's operators may run at the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperatorExecution {
    /// Operators on different cores overlap (a dataflow accelerator; the reference's
    /// semantics).
    #[default]
    Concurrent,
    /// One operator at a time, each on all the cores of its type (eager frameworks with one
    /// stream, such as Megatron-LM and PyTorch on GPUs).
    Sequential,
}

impl OperatorExecution {
    pub const ALL: [OperatorExecution; 2] =
        [OperatorExecution::Concurrent, OperatorExecution::Sequential];

    pub fn name(self) -> &'static str {
        match self {
            OperatorExecution::Concurrent => "concurrent",
            OperatorExecution::Sequential => "sequential",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }
}

/// How a layer runs: operator concurrency and whether tensor-parallel collectives may
/// overlap computation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Execution {
    pub operators: OperatorExecution,
    /// Tensor-parallel collectives overlap independent computation (off by default: the
    /// collective runs alone, as Megatron-LM runs it without its overlap options). With
    /// sequential operators this is Transformer Engine's overlap (Megatron-LM's
    /// `--tp-comm-overlap`): besides overlapping what the graph lets them, sequence
    /// parallelism's all-gathers and reduce-scatters are pipelined with the GEMM they feed
    /// or drain (`crate::operators::pipelined_exposure`).
    pub tensor_parallel_overlap: bool,
}

impl Execution {
    /// The reference's semantics: everything that can overlap does.
    pub const DATAFLOW: Execution = Execution {
        operators: OperatorExecution::Concurrent,
        tensor_parallel_overlap: true,
    };

    /// Whether operators run on all cores only (no single-core durations are needed).
    pub fn all_cores_only(self) -> bool {
        self.operators == OperatorExecution::Sequential
    }
}
