//! How runs are made: one row of a run as data and the one dispatch that runs it (here or in a
//! child), the one capacity search and the sweep over key counts (layer 2).

pub mod capacity_search;
pub mod run_spec;
pub mod scale_sweep;
