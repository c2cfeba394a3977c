//! The shard counts the sharded engine takes, checked where a tool reads `--shards`.
//!
//! Every tool that runs a workload through the sharded engine (`loadgen`, the `bench` binaries)
//! takes a shard count; one parser keeps them all refusing the same counts with the same words.

/// The most shards the sharded engine takes: `kcache::sharded::DeltaFifo::new` clamps any
/// larger count to 2^16.
pub const MAX_SHARDS: usize = 1 << 16;

/// Parses a `--shards` argument: a power of two from 1 to [`MAX_SHARDS`]. The engine would
/// quietly round any other count (0 to 1, 3 to 4, 2^17 down to 2^16), and the run reported
/// would then not be the one asked for.
///
/// ```
/// use workloads::parse_shards;
/// assert_eq!(parse_shards("64"), Ok(64));
/// assert!(parse_shards("0").is_err());
/// assert!(parse_shards("12").is_err());
/// ```
pub fn parse_shards(s: &str) -> Result<usize, String> {
    let wrong = || format!("--shards must be a power of two between 1 and {MAX_SHARDS}");
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("{} (got {s:?}, not a number)", wrong()))?;
    if n.is_power_of_two() && n <= MAX_SHARDS {
        Ok(n)
    } else {
        Err(wrong())
    }
}
