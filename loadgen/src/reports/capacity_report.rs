//! The capacity search's results as tables and as the one sentence a capacity tester wants.

use std::fmt::Write as _;

use crate::engines::EngineKind;
use crate::reports::report::{aligned, header};
use crate::runner::capacity_search::{trim_number, Bound, Curve};
use crate::units::{mib, si};

/// The sentence a capacity tester wants: "kcache absorbs N events/s on W1 at p99 ≤ 10 ms
/// (reference: M)". kcache is its sharded engine; with the reference alone, it is named.
pub fn claim(curves: &[Curve]) -> Option<String> {
    let find = |e: EngineKind| curves.iter().find(|c| c.engine == e.name());
    let lead = find(EngineKind::Sharded).or_else(|| find(EngineKind::Reference))?;
    let who = if lead.engine == EngineKind::Sharded.name() {
        "kcache"
    } else {
        "kcache's reference engine"
    };
    let mut s = format!(
        "{who} absorbs {} events/s on {} at p99 ≤ {} ms",
        lead.capacity_text(),
        lead.workload.to_uppercase(),
        trim_number(lead.p99_limit_ms)
    );
    if lead.engine == EngineKind::Sharded.name() {
        if let Some(reference) = find(EngineKind::Reference) {
            let _ = write!(s, " (reference: {})", reference.capacity_text());
        }
    }
    Some(s)
}

/// The capacity table: one row per engine and workload.
pub fn summary_rows(curves: &[Curve]) -> Vec<Vec<String>> {
    let mut rows = header(&[
        "engine",
        "workload",
        "capacity/s",
        "p50 µs",
        "p99 µs",
        "p999 µs",
        "+RSS MiB",
        "probes",
        "search",
    ]);
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    for c in curves {
        let at = c.at_capacity.as_ref();
        let search = match (c.bound, c.failing_rate) {
            (Bound::Bracketed, Some(f)) => format!("failed at {}", si(f as f64)),
            (Bound::Cap, _) => "passed up to --max-rate".to_string(),
            (Bound::NothingPassed, _) => "nothing passed".to_string(),
            (Bound::ProbeLimit, _) => "probe limit reached".to_string(),
            (Bound::Bracketed, None) => String::new(),
        };
        rows.push(vec![
            c.engine.clone(),
            c.workload.clone(),
            c.capacity_text(),
            opt(at.and_then(|a| a.latency_us.p50)),
            opt(at.and_then(|a| a.latency_us.p99)),
            opt(at.and_then(|a| a.latency_us.p999)),
            at.and_then(|a| a.peak_rss_bytes)
                .map_or_else(|| "-".to_string(), mib),
            c.probes.len().to_string(),
            search,
        ]);
    }
    rows
}

/// Every probe: one row each, in the order made.
pub fn probe_rows(curves: &[Curve]) -> Vec<Vec<String>> {
    let mut rows = header(&[
        "engine", "workload", "rate/s", "kept up", "lag ms", "p50 µs", "p99 µs", "+RSS MiB",
        "result",
    ]);
    let opt = |v: Option<f64>, digits: usize| {
        v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
    };
    for c in curves {
        for p in &c.probes {
            let r = &p.data.result;
            rows.push(vec![
                c.engine.clone(),
                c.workload.clone(),
                si(p.rate as f64),
                r.kept_up
                    .map_or("-", |k| if k { "yes" } else { "no" })
                    .to_string(),
                opt(r.producer_lag_ms, 2),
                opt(r.latency_us.p50, 1),
                opt(r.latency_us.p99, 1),
                r.peak_rss_bytes.map_or_else(|| "-".to_string(), mib),
                if p.passed {
                    "pass".to_string()
                } else {
                    format!("FAIL: {}", p.data.failed_rules.join("; "))
                },
            ]);
        }
    }
    rows
}

/// What `capacity` prints on stdout: every probe, the capacities, and the sentence.
pub fn shown(curves: &[Curve]) -> String {
    let mut out = aligned(&probe_rows(curves));
    out.push('\n');
    out.push_str(&aligned(&summary_rows(curves)));
    if let Some(claim) = claim(curves) {
        let _ = writeln!(out, "\n{claim}");
    }
    out
}
