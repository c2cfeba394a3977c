//! Progress on stderr: indicatif bars when stderr is a terminal, plain lines otherwise (logs,
//! CI, pipes), nothing at all in tests.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::progress::Progress;

/// Where progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ui {
    /// Bars on a terminal.
    Bars,
    /// One line when a phase starts and one when it ends.
    Lines,
    /// Nothing.
    Quiet,
}

impl Ui {
    /// Bars if stderr is a terminal, else plain lines.
    pub fn detect() -> Self {
        if std::io::stderr().is_terminal() {
            Ui::Bars
        } else {
            Ui::Lines
        }
    }

    /// Starts a phase of `total` steps (0: unknown).
    pub fn phase(self, label: impl Into<String>, total: u64) -> Phase {
        let label = label.into();
        let bar = match self {
            Ui::Bars => {
                // An unknown length gets a spinner; a known one a bar with rate and ETA.
                let (length, style) = if total == 0 {
                    let style = ProgressStyle::with_template("{spinner} {msg:28} {elapsed}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner());
                    (None, style)
                } else {
                    let style = ProgressStyle::with_template(
                        "{msg:28} [{bar:40}] {pos:>9}/{len:9} {per_sec:>12} {eta:>4}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
                    (Some(total), style)
                };
                let bar = ProgressBar::with_draw_target(length, ProgressDrawTarget::stderr());
                bar.set_style(style);
                bar.set_message(label.clone());
                bar.enable_steady_tick(Duration::from_millis(200));
                Some(bar)
            }
            Ui::Lines => {
                eprintln!("{label} ...");
                None
            }
            Ui::Quiet => None,
        };
        Phase {
            ui: self,
            label,
            bar,
            start: Instant::now(),
        }
    }

    /// A line of its own (a warning, a summary).
    pub fn note(self, message: &str) {
        if self != Ui::Quiet {
            eprintln!("{message}");
        }
    }
}

/// A running phase; report progress through [`Progress`], end it with [`Phase::finish`].
#[derive(Debug)]
pub struct Phase {
    ui: Ui,
    label: String,
    bar: Option<ProgressBar>,
    start: Instant,
}

impl Phase {
    /// Ends the phase, leaving one line `label: summary (N.NN s)`.
    pub fn finish(self, summary: &str) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.ui != Ui::Quiet {
            let secs = self.start.elapsed().as_secs_f64();
            eprintln!("{}: {summary} ({secs:.2} s)", self.label);
        }
    }
}

impl Phase {
    /// Moves the phase to `done` steps and leaves `line` above the bar (a line of its own
    /// without bars), for phases whose steps are worth a line each: `capacity`'s probes.
    pub fn step(&self, done: u64, line: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(done);
                bar.println(line);
            }
            None if self.ui != Ui::Quiet => eprintln!("{line}"),
            None => {}
        }
    }
}

impl Progress for Phase {
    fn set(&self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
    }
}
