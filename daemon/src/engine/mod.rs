//! The search engine. It does no I/O and knows nothing of the service around it: it takes
//! validated inputs and cost-model traits, so tests drive it directly.

pub mod estimate;
pub mod layer;
pub mod model;
pub mod placement;
pub mod schedule;
pub mod search;
pub mod space;
pub mod training;
