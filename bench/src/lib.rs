//! Helpers shared by kcache's benchmarks.
