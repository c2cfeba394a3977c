//! One module per `loadgen` command, each over the floors below (see the crate docs); no command
//! imports another.

pub mod capacity;
pub mod compare;
pub mod ops;
pub mod replay;
pub mod run;
pub mod scale;
pub mod workqueue;
