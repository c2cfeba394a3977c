//! What a run measures: latency and its timeline, memory, the allocator's bytes, CPU, the machine,
//! and the huge-page setting that would stall a run (layer 1 of the crate docs' table).

pub mod allocator;
pub mod cpu;
pub mod latency;
pub mod machine;
pub mod rss;
pub mod thp;
pub mod timeline;
