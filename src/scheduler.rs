//! The embedded scheduler: where roles sit ([`placement`]), what is resident on each device and the
//! offload/reload orders that time-share devices between phases ([`ledger`], [`host_copy`]), and the
//! sample-level rollout policy with its staleness bound α ([`rollout`]). [`sim`] runs the same
//! rollout policy against simulated devices, for benchmarks at device counts this machine lacks.
//!
//! Nothing here knows about the store or a front-end; pipelines turn what it reports into events.

pub mod host_copy;
pub mod ledger;
pub mod placement;
pub mod rollout;
pub mod sim;

pub use crate::names::{DeviceReading, Direction, Phase, Transfer};
pub use ledger::Ledger;
pub use placement::{Placement, PlacementError};
pub use rollout::{ReadyGroup, RolloutPolicy, RolloutStats, SampleScheduler};
