//! What drives a run: the producer and consumers of a bare run, pacing to an offered rate, W4's
//! readers, the in-memory API server's feed, the handlers a run registers on the informer, and
//! a run in a child process of its own (layer 2).

pub mod driver;
pub mod informer_handlers;
pub mod isolate;
pub mod pacing;
pub mod readers;
pub mod server_feed;
