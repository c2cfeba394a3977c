//! `loadgen`: replays ops traces and synthetic watch events through kcache's engines.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(2);
}
