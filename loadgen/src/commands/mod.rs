//! One module per `loadgen` command, each over the floors below (see the crate docs); no command
//! imports another.

pub mod capacity;
pub mod child;
#[cfg(feature = "wire")]
pub mod churn;
pub mod compare;
#[cfg(feature = "wire")]
pub mod e2e;
pub mod ops;
pub mod replay;
pub mod run;
pub mod scale;
#[cfg(feature = "wire")]
pub mod soak;
pub mod workqueue;
