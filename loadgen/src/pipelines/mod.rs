//! What a run goes through beyond the bare queue: the informer, the harness floor, the
//! controllers (W6, W7), the saturated workqueue (W8) and the workqueue round trip (layer 2).

pub mod bare;
pub mod controller_informer;
pub mod controller_loop;
pub mod controller_resync;
pub mod harness_floor;
pub mod priority_scheduling;
pub mod through_informer;
pub mod wq_round_trip;
