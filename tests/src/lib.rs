//! Shared helpers for kcache's cross-crate tests.
