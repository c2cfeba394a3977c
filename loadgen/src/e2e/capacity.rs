//! `loadgen e2e --find-capacity`: the highest served rate each client keeps up with.
//!
//! The rule is the one `loadgen capacity` applies to the engines (docs/workloads.md,
//! "Capacity"), carried over the wire: a probe keeps up when the server publishes on schedule
//! (its churn takes at most 1% longer than planned), the client's lag p99 from publication to
//! handler stays within the limit, and its cache ends equal to the server's. The search doubles
//! the rate from `--rate` until a probe fails (halving first if `--rate` already fails), then
//! bisects between the last pass and the first failure. Every probe is a fresh server and a
//! fresh client process with `rate × --probe-seconds` events.
//!
//! At the first failure above the capacity it names the limit from the two processes' CPU
//! time: the server, when it fell behind its schedule; the client, when its process used most
//! of a core over the churn (decoding JSON and applying to its cache); otherwise neither
//! process was saturated and the lag came from between them (loopback HTTP, the two
//! processes and the churn contending for the machine's cores).

use serde::Serialize;

use super::ClientReport;

/// A probe keeps its schedule when the churn lasted at most this much longer than planned.
const SCHEDULE_SLACK: f64 = 1.01;
/// A client process using this share of a core over the churn is the limit.
const SATURATED: f64 = 0.85;
/// The search stops bisecting when the bracket is this narrow (fail ÷ pass).
const BRACKET: f64 = 1.08;
/// At most this many doublings up, or halvings down, from `--rate`.
const MAX_STEPS: usize = 8;

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

/// The highest rate that kept up, if any did.
fn best_pass(probes: &[Probe]) -> Option<f64> {
    probes
        .iter()
        .filter(|p| p.passed())
        .map(|p| p.rate)
        .max_by(f64::total_cmp)
}

/// The rates to probe: the next one after `probes`, or `None` when the search is done.
pub fn next_rate(start: f64, probes: &[Probe]) -> Option<f64> {
    let best_pass = best_pass(probes);
    let lowest_fail = probes
        .iter()
        .filter(|p| !p.passed() && best_pass.is_none_or(|b| p.rate > b))
        .map(|p| p.rate)
        .fold(None, |low: Option<f64>, r| {
            Some(low.map_or(r, |l| l.min(r)))
        });
    match (best_pass, lowest_fail) {
        (None, None) => Some(start),
        // Nothing kept up yet: halve, a bounded number of times.
        (None, Some(fail)) => (probes.len() < MAX_STEPS).then_some(fail / 2.0),
        // Nothing failed yet: double, a bounded number of times.
        (Some(pass), None) => (probes.len() < MAX_STEPS).then_some(pass * 2.0),
        (Some(pass), Some(fail)) => (fail / pass > BRACKET).then(|| (pass * fail).sqrt()),
    }
}

impl Search {
    /// The search's outcome from its probes.
    pub fn from_probes(client: &'static str, probes: Vec<Probe>) -> Self {
        let capacity = best_pass(&probes);
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
        assert_eq!(next_rate(50_000.0, &[]), Some(50_000.0));
        let mut probes = vec![probe(50_000.0, true)];
        assert_eq!(next_rate(50_000.0, &probes), Some(100_000.0));
        probes.push(probe(100_000.0, true));
        probes.push(probe(200_000.0, false));
        let mid = next_rate(50_000.0, &probes).unwrap();
        assert!((mid - 141_421.0).abs() < 1.0, "{mid}");
        probes.push(probe(mid, true));
        probes.push(probe(170_000.0, false));
        probes.push(probe(160_000.0, false));
        probes.push(probe(150_000.0, true));
        // 160k ÷ 150k is inside the bracket: done.
        assert_eq!(next_rate(50_000.0, &probes), None);
        let search = Search::from_probes("kcache", probes);
        assert_eq!(search.capacity, Some(150_000.0));
        assert!(search.limit.unwrap().starts_with("between the processes"));
    }

    #[test]
    fn the_search_halves_when_the_start_fails_and_gives_up_in_bounded_steps() {
        let mut probes = vec![probe(80_000.0, false)];
        assert_eq!(next_rate(80_000.0, &probes), Some(40_000.0));
        while let Some(rate) = next_rate(80_000.0, &probes) {
            probes.push(probe(rate, false));
        }
        assert_eq!(probes.len(), MAX_STEPS);
        let search = Search::from_probes("kube-rs", probes);
        assert_eq!(search.capacity, None);
        assert!(search.limit.is_some());
    }
}
