//! Operators on the chip: a layer's operator graph priced by the latency model
//! ([`mod@estimate`]) and turned into a scheduling instance ([`mod@instance`]) restricted to what
//! the framework allows ([`mod@restrict`]). Above the model graphs and the scheduler, below
//! placement, the step model and the search.

// In their order: each imports only those before it (a tidy test checks it); one per
// group, as rustfmt would sort consecutive declarations.
pub mod estimate;

pub mod restrict;

pub mod instance;

pub use estimate::{OpSet, estimate, estimate_all};
pub use instance::{instance, instance_with, pipelined_exposure, skeleton, tasks_with};
pub use restrict::restrict;
