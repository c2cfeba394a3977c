//! What a person reads: run tables and JSON, charts, the capacity, sweep and soak reports
//! (layer 3).

pub mod capacity_report;
pub mod chart;
pub mod report;
pub mod scale_report;
pub mod soak_report;
