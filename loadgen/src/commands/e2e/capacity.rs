//! `loadgen e2e --find-capacity`: the highest served rate each client keeps up with.
//!
//! The rule is the one `loadgen capacity` applies to the engines (docs/workloads.md,
//! "Capacity"), carried over the wire: a probe keeps up when the server publishes on schedule
//! (its churn takes at most 1% longer than planned), the client's lag p99 from publication to
//! handler stays within the limit, and its cache ends equal to the server's. The search is the
//! engines' own ([`capacity_search::search`], with [`plan`]): it doubles the rate from `--rate`
//! until a probe fails (halving first if `--rate` already fails), then bisects between the last
//! pass and the first failure. Every probe is a fresh server and a fresh client process with
//! `rate × --probe-seconds` events.
//!
//! At the first failure above the capacity it names the limit from the two processes' CPU
//! time: the server, when it fell behind its schedule; the client, when its process used most
//! of a core over the churn (decoding JSON and applying to its cache); otherwise neither
//! process was saturated and the lag came from between them (loopback HTTP, the two
//! processes and the churn contending for the machine's cores).

use serde::Serialize;

use super::ClientReport;
use crate::runner::capacity_search::{self, SearchPlan};

/// A probe keeps its schedule when the churn lasted at most this much longer than planned.
const SCHEDULE_SLACK: f64 = 1.01;
/// A client process using this share of a core over the churn is the limit.
const SATURATED: f64 = 0.85;
/// The search stops bisecting when the bracket is this narrow (fail ÷ pass − 1).
const PRECISION: f64 = 0.08;
/// At most this many doublings up, or halvings down, from `--rate`.
const MAX_STEPS: u32 = 8;

/// The search of a client starting at `start` events/s: doubling (or halving) at most
/// [`MAX_STEPS`] times, then bisecting to within [`PRECISION`]; one try per rate (each probe
/// is already a whole run of its own).
pub fn plan(start: f64) -> SearchPlan {
    let start = start.max(1.0) as u64;
    SearchPlan {
        start,
        min: (start >> MAX_STEPS).max(1),
        max: start.saturating_mul(1 << MAX_STEPS),
        factor: 2.0,
        precision: PRECISION,
        tries: 1,
        max_probes: 2 * MAX_STEPS as usize + 8,
    }
}

/// One probe of one client.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// Offered rate, events per second.
    pub rate: f64,
    /// Churn events served.
    pub events: usize,
    /// The rules it failed; empty when it kept up.
    pub failed: Vec<String>,
    /// What the client did.
    pub report: ClientReport,
}

impl Probe {
    /// Judges `report` of a probe at `rate` with `events` events against `max_lag_ms`.
    pub fn judge(rate: f64, events: usize, max_lag_ms: f64, report: ClientReport) -> Self {
        let mut failed = Vec::new();
        let planned = events as f64 / rate;
        if report.churn_seconds > planned * SCHEDULE_SLACK {
            failed.push(format!(
                "server behind schedule: {:.2} s for {planned:.2} s planned",
                report.churn_seconds
            ));
        }
        let p99_ms = report.lag_us.1 as f64 / 1e3;
        if p99_ms > max_lag_ms {
            failed.push(format!("lag p99 {p99_ms:.1} ms > {max_lag_ms} ms"));
        }
        if !report.ok {
            failed.push(format!(
                "cache differs: {} pods served, {} cached",
                report.pods.0, report.pods.1
            ));
        }
        Probe {
            rate,
            events,
            failed,
            report,
        }
    }

    /// Whether it kept up.
    pub fn passed(&self) -> bool {
        self.failed.is_empty()
    }

    /// What limited it, read from the two processes' CPU time.
    pub fn limit(&self) -> String {
        let r = &self.report;
        let seconds = r.churn_seconds.max(1e-9);
        let share = |cpu: Option<f64>| cpu.map(|c| c / seconds);
        if self.failed.iter().any(|f| f.starts_with("server")) {
            return format!(
                "the server: it fell behind its schedule ({} of a core serialising and \
                 publishing)",
                percent(share(r.server_cpu_seconds))
            );
        }
        match share(r.client_cpu_seconds) {
            Some(s) if s >= SATURATED => format!(
                "the client: {} of a core decoding and applying to its cache",
                percent(Some(s))
            ),
            client => format!(
                "between the processes: neither saturated a core (client {}, server {}); \
                 loopback HTTP and the two processes sharing the cores",
                percent(client),
                percent(share(r.server_cpu_seconds))
            ),
        }
    }
}

fn percent(share: Option<f64>) -> String {
    share.map_or("n/a".to_owned(), |s| format!("{:.0}%", s * 100.0))
}

/// One client's search.
#[derive(Debug, Clone, Serialize)]
pub struct Search {
    /// `kcache` or `kube-rs`.
    pub client: &'static str,
    /// The highest rate that kept up; `None` when none did.
    pub capacity: Option<f64>,
    /// What limited the lowest failing probe above the capacity.
    pub limit: Option<String>,
    /// Every probe, in the order made.
    pub probes: Vec<Probe>,
}

impl Search {
    /// The outcome of `client`'s search.
    pub fn of(client: &'static str, search: capacity_search::Search<Probe>) -> Self {
        let probes: Vec<Probe> = search.attempts.into_iter().map(|a| a.data).collect();
        Self::from_probes(client, probes)
    }

    /// The search's outcome from its probes.
    pub fn from_probes(client: &'static str, probes: Vec<Probe>) -> Self {
        let capacity = probes
            .iter()
            .filter(|p| p.passed())
            .map(|p| p.rate)
            .max_by(f64::total_cmp);
        let limit = probes
            .iter()
            .filter(|p| !p.passed() && capacity.is_none_or(|c| p.rate > c))
            .min_by(|a, b| a.rate.total_cmp(&b.rate))
            .map(Probe::limit);
        Search {
            client,
            capacity,
            limit,
            probes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(churn_seconds: f64, lag_p99_us: u64, client_cpu: f64, ok: bool) -> ClientReport {
        ClientReport {
            client: "kcache",
            received: 1,
            applied: 1,
            churn_seconds,
            lag_us: (1, lag_p99_us, lag_p99_us),
            peak_bytes: None,
            bytes_per_pod: None,
            client_cpu_seconds: Some(client_cpu),
            client_sync_cpu_seconds: None,
            server_cpu_seconds: Some(0.5),
            client_cpu_us_per_event: None,
            server_cpu_us_per_event: None,
            settle_seconds: 0.0,
            ok,
            pods: (10, if ok { 10 } else { 9 }),
        }
    }

    fn probe(rate: f64, pass: bool) -> Probe {
        let lag = if pass { 1_000 } else { 50_000 };
        let seconds = 10_000.0 / rate;
        // A tenth of a core: neither process saturated.
        Probe::judge(
            rate,
            10_000,
            10.0,
            report(seconds, lag, 0.1 * seconds, true),
        )
    }

    #[test]
    fn a_probe_fails_each_rule_it_breaks_and_names_the_limit() {
        let on_time = Probe::judge(1_000.0, 10_000, 10.0, report(10.05, 9_000, 9.5, true));
        assert!(on_time.passed(), "{:?}", on_time.failed);

        let late = Probe::judge(1_000.0, 10_000, 10.0, report(10.2, 9_000, 2.0, true));
        assert_eq!(late.failed.len(), 1);
        assert!(late.limit().starts_with("the server"), "{}", late.limit());

        let slow_client = Probe::judge(1_000.0, 10_000, 10.0, report(10.0, 20_000, 9.5, false));
        assert_eq!(slow_client.failed.len(), 2, "{:?}", slow_client.failed);
        assert!(slow_client.limit().starts_with("the client: 95%"));

        let idle = Probe::judge(1_000.0, 10_000, 10.0, report(10.0, 20_000, 1.0, true));
        assert!(idle.limit().starts_with("between the processes"));
    }

    #[test]
    fn the_search_doubles_then_bisects_then_stops() {
        // A client that keeps up to 150k events/s.
        let found = capacity_search::search(&plan(50_000.0), |rate| {
            let probe = probe(rate as f64, rate <= 150_000);
            Ok::<_, ()>((probe.passed(), probe))
        })
        .unwrap();
        let rates: Vec<u64> = found.attempts.iter().map(|a| a.rate).collect();
        assert_eq!(
            &rates[..3],
            [50_000, 100_000, 200_000],
            "doubles to a failure"
        );
        let search = Search::of("kcache", found);
        let capacity = search.capacity.unwrap();
        assert!((139_000.0..=150_000.0).contains(&capacity), "{capacity}");
        assert!(search.limit.unwrap().starts_with("between the processes"));
    }

    #[test]
    fn the_search_halves_when_the_start_fails_and_gives_up_in_bounded_steps() {
        let found = capacity_search::search(&plan(80_000.0), |rate| {
            let probe = probe(rate as f64, false);
            Ok::<_, ()>((probe.passed(), probe))
        })
        .unwrap();
        let rates: Vec<u64> = found.attempts.iter().map(|a| a.rate).collect();
        assert_eq!(&rates[..2], [80_000, 40_000], "halves");
        assert_eq!(
            rates.len(),
            MAX_STEPS as usize + 1,
            "down to start ÷ 2^MAX_STEPS"
        );
        let search = Search::of("kube-rs", found);
        assert_eq!(search.capacity, None);
        assert!(search.limit.is_some());
    }
}
