//! `loadgen capacity`: the highest offered rate an engine keeps up with (docs/workloads.md,
//! "Capacity"), with the latency curve that leads to it; the search itself is
//! [`capacity_search`](crate::runner::capacity_search).

use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use crate::engines::{EngineArgs, EngineChoice};
use crate::harness::informer_handlers::InformerArgs;
use crate::measure::machine::{command_line, Machine};
use crate::pipelines::through_informer::Through;
use crate::reports::capacity_report::shown;
use crate::reports::report::{finish, refuse, write_json};
use crate::result::RunResult;
use crate::runner::capacity_search::{
    check_workload, measure_engine, Curve, Job, ProbeSize, SearchPlan, DEFAULT_P99_LIMIT_MS,
    LONG_PROBE_SECS, MIN_PROBE_EVENTS,
};
use crate::ui::Ui;
use workloads::{Workload, WorkloadSpec};

/// Arguments of `loadgen capacity`.
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityArgs {
    /// Which workload: w1 (steady churn), w2 (hot keys) or w5 (slow handlers). W3's relists and
    /// W4's direct writes have no per-event schedule or queue latency.
    #[arg(long, value_parser = crate::args::parse_workload)]
    pub workload: Workload,
    /// Which engine(s).
    #[arg(long, value_enum, default_value = "all")]
    pub engine: EngineChoice,
    /// The p99 enqueue-to-pop latency a probe may reach and still pass, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_P99_LIMIT_MS)]
    pub p99_ms: f64,
    /// Keys. Default: the workload's own. Every probe also paces the initial population of
    /// one add per key, so a probe lasts at least keys / rate.
    #[arg(long)]
    pub keys: Option<usize>,
    /// Most churn events per probe. Default: the workload's own E (5,000,000).
    #[arg(long)]
    pub events: Option<usize>,
    /// Target length of each probe in seconds: events = rate × this − keys, at least 16,000
    /// and at most --events.
    #[arg(long, default_value_t = 2.0)]
    pub probe_secs: f64,
    /// The first rate tried, in events per second.
    #[arg(long, default_value_t = 50_000)]
    pub start_rate: u64,
    /// The lowest rate tried (when even --start-rate fails). A probe paces the keys' initial
    /// adds too, so its longest is (keys + 16,000) / this: 11.6 s for W1.
    #[arg(long, default_value_t = 10_000)]
    pub min_rate: u64,
    /// The highest rate tried: passing here ends the search ("at least").
    #[arg(long, default_value_t = 20_000_000)]
    pub max_rate: u64,
    /// Bisection stops when the first failing rate is within this many percent above the
    /// capacity.
    #[arg(long, default_value_t = 5.0)]
    pub precision: f64,
    /// Tries per rate: a rate fails only when every try fails (a shared machine's noise can
    /// fail a probe, never pass one).
    #[arg(long, default_value_t = 2)]
    pub tries: usize,
    /// Probes per engine at most, tries included.
    #[arg(long, default_value_t = 24)]
    pub max_probes: usize,
    /// The seed and the engine's shards, consumers and handler cost.
    #[command(flatten)]
    pub engine_args: EngineArgs,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw the latency curve (p50 and p99 against offered rate, with the p99 limit) as SVG here.
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Run every probe in this process instead of a child process each (peak memory is then
    /// understated for all but the first probe).
    #[arg(long)]
    pub in_process: bool,
    /// How the events reach the engine: `queue` (the engine bare) or `informer` (written into
    /// an in-memory API server and heard by `--handlers` handlers through the reflector and a
    /// shared informer; latency is from the write to the first handler).
    #[arg(long, value_enum, default_value = "queue")]
    pub through: Through,
    /// The informer path's handlers (`--through informer`).
    #[command(flatten)]
    pub informer: InformerArgs,
}

/// Refuses a p99 limit that is not a positive number of milliseconds.
pub fn check_p99_limit(ms: f64) -> Result<(), String> {
    if ms.is_finite() && ms > 0.0 {
        Ok(())
    } else {
        Err(format!(
            "--p99-ms must be a positive number of milliseconds (got {ms})"
        ))
    }
}

impl CapacityArgs {
    /// The measurement these arguments ask for, or why they make none.
    pub fn job(&self) -> Result<Job, String> {
        check_workload(self.workload)?;
        check_p99_limit(self.p99_ms)?;
        if !(self.probe_secs.is_finite() && self.probe_secs > 0.0 && self.probe_secs <= 600.0) {
            return Err(format!(
                "--probe-secs must be above 0 and at most 600 (got {})",
                self.probe_secs
            ));
        }
        let mut spec = WorkloadSpec::new(self.workload).seed(self.engine_args.seed);
        if let Some(keys) = self.keys {
            spec = spec.keys(keys);
        }
        if spec.keys == 0 {
            return Err("--keys must be at least 1".to_string());
        }
        let max_events = self.events.unwrap_or(self.workload.default_events());
        if max_events == 0 {
            return Err("--events must be at least 1".to_string());
        }
        let plan = SearchPlan {
            start: self.start_rate,
            min: self.min_rate,
            max: self.max_rate,
            factor: 2.0,
            precision: self.precision / 100.0,
            tries: self.tries,
            max_probes: self.max_probes,
        };
        plan.check()?;
        Ok(Job {
            spec,
            cfg: self.engine_args.config(self.workload),
            plan,
            size: ProbeSize {
                secs: self.probe_secs,
                min_events: MIN_PROBE_EVENTS,
                max_events,
            },
            p99_limit_ms: self.p99_ms,
            in_process: self.in_process,
            informer: (self.through == Through::Informer).then(|| self.informer.config()),
        })
    }
}

/// The JSON `capacity --json` writes.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityReport {
    /// Where it ran.
    pub machine: Machine,
    /// The command line that produced it.
    pub command: String,
    /// One curve per engine.
    pub capacity: Vec<Curve>,
}

/// Runs `loadgen capacity`.
pub fn main(args: CapacityArgs) -> ExitCode {
    let job = match args.job() {
        Ok(job) => job,
        Err(e) => return refuse("capacity", e),
    };
    let ui = Ui::detect();
    let longest = job.longest_probe_secs();
    if longest > LONG_PROBE_SECS {
        ui.note(&format!(
            "note: a probe at --min-rate {} lasts up to {longest:.0} s (the {} initial adds are \
             paced too); raise --min-rate or lower --keys for a shorter worst case",
            args.min_rate, job.spec.keys
        ));
    }
    let mut curves = Vec::new();
    for engine in args.engine.engines() {
        match measure_engine(&job, engine, ui) {
            Ok(curve) => curves.push(curve),
            Err(e) => return refuse("capacity", e),
        }
    }
    let results: Vec<RunResult> = curves.iter().flat_map(Curve::results).cloned().collect();
    finish("capacity", &shown(&curves), &results, || {
        if let Some(path) = &args.chart {
            crate::reports::chart::capacity_svg(&curves, path).map_err(|e| e.to_string())?;
            ui.note(&format!("wrote {}", path.display()));
        }
        if let Some(path) = &args.json {
            let report = CapacityReport {
                machine: Machine::detect(),
                command: command_line(),
                capacity: curves.clone(),
            };
            write_json(path, &report).map_err(|e| e.to_string())?;
            ui.note(&format!("wrote {}", path.display()));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::EngineKind;
    use crate::reports::capacity_report::claim;
    use crate::result::LatencyUs;
    use crate::runner::capacity_search::*;

    fn plan() -> SearchPlan {
        SearchPlan {
            start: 1_000,
            min: 100,
            max: 10_000_000,
            factor: 2.0,
            precision: 0.05,
            tries: 1,
            max_probes: 60,
        }
    }

    /// A probe whose data is the try's number, passing as `passes` says.
    fn run(plan: &SearchPlan, mut passes: impl FnMut(u64, usize) -> bool) -> Search<usize> {
        let mut n = 0;
        search::<_, ()>(plan, |rate| {
            n += 1;
            Ok((passes(rate, n), n))
        })
        .expect("fake probes never fail")
    }

    /// Whatever the probe did: the capacity passed, everything settled below passed, and the
    /// failing rate failed every try.
    fn assert_consistent(found: &Search<usize>, plan: &SearchPlan) {
        assert!(found.attempts.len() <= plan.max_probes);
        if let Some(c) = found.capacity {
            assert!(found.attempts.iter().any(|a| a.rate == c && a.passed));
        }
        if let Some(f) = found.failing {
            assert!(found
                .attempts
                .iter()
                .filter(|a| a.rate == f)
                .all(|a| !a.passed));
            assert!(found.capacity.is_none_or(|c| c < f));
        }
    }

    #[test]
    fn a_monotone_probe_is_bracketed_within_the_precision() {
        let p = plan();
        let found = run(&p, |rate, _| rate <= 123_456);
        assert_eq!(found.bound, Bound::Bracketed);
        let (c, f) = (found.capacity.unwrap(), found.failing.unwrap());
        assert!(c <= 123_456 && f > 123_456, "{c} {f}");
        assert!(f as f64 <= c as f64 * 1.05, "{c} {f}");
        assert_consistent(&found, &p);
        // Sweep 1k..128k (8 probes), then about log2(ln 2 / ln 1.05) ≈ 4 bisections.
        assert!(found.attempts.len() <= 14, "{}", found.attempts.len());
        assert_eq!(found.failed_at_or_below_capacity(), 0);
        assert_eq!(found.at_capacity().map(|a| a.rate), Some(c));
    }

    #[test]
    fn a_failing_start_sweeps_down() {
        let p = plan();
        let found = run(&p, |rate, _| rate <= 300);
        assert_eq!(found.bound, Bound::Bracketed);
        assert_eq!(found.attempts[0].rate, 1_000);
        assert!(found.capacity.unwrap() <= 300 && found.failing.unwrap() > 300);
        assert_consistent(&found, &p);
    }

    #[test]
    fn noisy_failures_are_absorbed_by_a_second_try() {
        // Every third try fails whatever the rate (another process took the core); below
        // 200,000 the other tries pass.
        let p = SearchPlan { tries: 2, ..plan() };
        let found = run(&p, |rate, n| rate <= 200_000 && n % 3 != 0);
        assert_eq!(found.bound, Bound::Bracketed);
        let c = found.capacity.unwrap();
        assert!(c <= 200_000 && c as f64 * 1.05 >= 200_000.0, "{c}");
        assert!(
            found.failed_at_or_below_capacity() > 0,
            "the noise is reported"
        );
        assert_consistent(&found, &p);
    }

    #[test]
    fn a_non_monotone_probe_still_ends_on_a_passing_rate_below_a_failing_one() {
        // Passes below 50k and again in a band 400k..600k: the sweep stops at the first
        // failure (64k) and never reports the band.
        let p = plan();
        let found = run(&p, |rate, _| {
            rate <= 50_000 || (400_000..600_000).contains(&rate)
        });
        assert_eq!(found.bound, Bound::Bracketed);
        let c = found.capacity.unwrap();
        assert!(c <= 50_000 && found.failing.unwrap() <= 64_000, "{c}");
        assert_consistent(&found, &p);

        // Pseudo-random pass/fail: the search ends, within budget, consistent.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let found = run(&p, |_, _| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % 3 != 0
        });
        assert_consistent(&found, &p);
    }

    #[test]
    fn nothing_passing_sweeps_down_to_the_minimum_and_says_so() {
        let p = plan();
        let found = run(&p, |_, _| false);
        assert_eq!(found.bound, Bound::NothingPassed);
        assert_eq!(found.capacity, None);
        assert_eq!(found.attempts.last().map(|a| a.rate), Some(100));
        assert_eq!(found.attempts.len(), 5, "1000, 500, 250, 125, 100");
    }

    #[test]
    fn everything_passing_stops_at_the_cap() {
        let p = SearchPlan {
            max: 100_000,
            ..plan()
        };
        let found = run(&p, |_, _| true);
        assert_eq!(found.bound, Bound::Cap);
        assert_eq!(found.capacity, Some(100_000));
        let rates: Vec<u64> = found.attempts.iter().map(|a| a.rate).collect();
        assert_eq!(
            rates,
            [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 100_000]
        );
    }

    #[test]
    fn the_probe_budget_ends_a_search_with_what_passed_so_far() {
        let p = SearchPlan {
            max_probes: 4,
            ..plan()
        };
        let found = run(&p, |rate, _| rate <= 123_456);
        assert_eq!(found.bound, Bound::ProbeLimit);
        assert_eq!(found.attempts.len(), 4);
        assert_eq!(found.capacity, Some(8_000));
    }

    #[test]
    fn a_probe_error_ends_the_search_with_it() {
        let err = search::<(), _>(&plan(), |rate| {
            if rate > 4_000 {
                Err("child failed")
            } else {
                Ok((true, ()))
            }
        });
        assert_eq!(err.unwrap_err(), "child failed");
    }

    #[test]
    fn plans_that_cannot_search_are_refused() {
        assert!(plan().check().is_ok());
        for bad in [
            SearchPlan { min: 0, ..plan() },
            SearchPlan {
                min: 10,
                max: 5,
                ..plan()
            },
            SearchPlan {
                precision: 0.0,
                ..plan()
            },
            SearchPlan {
                factor: 1.0,
                ..plan()
            },
            SearchPlan { tries: 0, ..plan() },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn probe_sizes_follow_the_rate_within_bounds() {
        let size = ProbeSize {
            secs: 2.0,
            min_events: 16_000,
            max_events: 5_000_000,
        };
        assert_eq!(size.events(1_000_000, 100_000), 1_900_000);
        assert_eq!(size.events(10_000, 100_000), 16_000);
        assert_eq!(size.events(100_000_000, 100_000), 5_000_000);
        let tiny = ProbeSize {
            max_events: 500,
            ..size
        };
        assert_eq!(tiny.events(10_000, 100), 500, "the cap wins over the floor");
    }

    fn paced(kept_up: bool, p99_us: f64, verdict_ok: bool) -> RunResult {
        RunResult {
            engine: "sharded".into(),
            workload: "w1".into(),
            keys: 1_000,
            events: 100_000,
            wall_s: 1.0,
            events_per_s: 100_000.0,
            pops: 1,
            deltas_per_pop: Some(1.0),
            latency_us: LatencyUs {
                p50: Some(10.0),
                p99: Some(p99_us),
                p999: Some(p99_us),
            },
            peak_rss_bytes: Some(1 << 20),
            peak_rss_source: Some("hwm".into()),
            threads: 1,
            shards: Some(16),
            deltas: 100_000,
            offered_rate: Some(100_000),
            producer_lag_ms: Some(if kept_up { 0.1 } else { 50.0 }),
            kept_up: Some(kept_up),
            verdict: if verdict_ok { "ok" } else { "FAIL: lost" }.into(),
            failures: if verdict_ok {
                vec![]
            } else {
                vec!["lost".into()]
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_probe_fails_each_rule_of_the_definition_on_its_own() {
        assert!(failed_rules(&paced(true, 9_999.0, true), 10.0).is_empty());
        let behind = failed_rules(&paced(false, 100.0, true), 10.0);
        assert_eq!(behind.len(), 1);
        assert!(
            behind[0].contains("producer fell behind") && behind[0].contains("1.000 s"),
            "{behind:?}"
        );
        let slow = failed_rules(&paced(true, 10_001.0, true), 10.0);
        assert_eq!(slow, ["p99 10.00 ms > 10 ms"]);
        assert_eq!(
            failed_rules(&paced(true, 10.0, false), 10.0),
            ["FAIL: lost"]
        );
        assert_eq!(failed_rules(&paced(false, 20_000.0, false), 10.0).len(), 3);
    }

    fn job(args: &[&str]) -> Result<Job, String> {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            capacity: CapacityArgs,
        }
        let cli = Cli::try_parse_from(std::iter::once("capacity").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.capacity.job()
    }

    #[test]
    fn the_defaults_keep_every_w1_probe_short_and_w2_gets_a_warning() {
        let w1 = job(&["--workload", "w1"]).unwrap();
        assert_eq!(w1.p99_limit_ms, 10.0);
        assert_eq!(
            (w1.plan.start, w1.plan.min, w1.plan.tries),
            (50_000, 10_000, 2)
        );
        assert!((w1.longest_probe_secs() - 11.6).abs() < 1e-9);
        assert_eq!(w1.size.events(1_000_000, w1.spec.keys), 1_900_000);
        let w2 = job(&["--workload", "w2"]).unwrap();
        assert!(w2.longest_probe_secs() > LONG_PROBE_SECS);
        let w5 = job(&["--workload", "w5", "--consumers", "3"]).unwrap();
        assert_eq!(w5.cfg.consumers, 3);
        assert_eq!(w5.cfg.handler_cost, std::time::Duration::from_micros(2));
        assert!(job(&["--workload", "w3"])
            .unwrap_err()
            .contains("w3's relists"));
        assert!(job(&["--workload", "w1", "--precision", "0"]).is_err());
    }

    fn curve(engine: EngineKind, capacity: u64) -> Curve {
        let p = SearchPlan {
            start: 10_000,
            ..plan()
        };
        let found = search::<_, ()>(&p, |rate| {
            let passed = rate <= capacity;
            let result = paced(passed, 100.0, true);
            Ok((
                passed,
                Probe {
                    failed_rules: failed_rules(&result, 10.0),
                    result,
                },
            ))
        })
        .unwrap();
        Curve::new(engine, "w1", 10.0, found)
    }

    #[test]
    fn the_claim_names_kcache_and_the_reference() {
        let curves = [
            curve(EngineKind::Reference, 400_000),
            curve(EngineKind::Sharded, 1_500_000),
        ];
        let claim = claim(&curves).unwrap();
        assert!(
            claim.starts_with("kcache absorbs 1.4")
                && claim.contains("events/s on W1 at p99 ≤ 10 ms (reference: 3"),
            "{claim}"
        );
        let alone = crate::reports::capacity_report::claim(&curves[..1]).unwrap();
        assert!(
            alone.starts_with("kcache's reference engine absorbs"),
            "{alone}"
        );
        let text = shown(&curves);
        assert!(text.contains("FAIL: producer fell behind"), "{text}");
        assert!(text.contains("failed at"), "{text}");
        assert_eq!(
            curves[1].at_capacity.as_ref().unwrap().peak_rss_bytes,
            Some(1 << 20)
        );
    }
}
