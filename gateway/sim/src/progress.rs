//! The progress display of `meridian sim`: one bar per replayed policy on a terminal's stderr.
//!
//! The replays only store their count of finished jobs in an atomic counter; a separate thread
//! reads the counters a few times a second and moves the bars ([`ReplayProgress::update`]), so
//! drawing never touches the replay's hot loop.

use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::policy::Policy;

/// Redraws per second at most; the counters are polled about as often.
const REFRESH_HZ: u8 = 5;
/// One line per policy: name, bar, percent, finished jobs and `done` once all are. The bar
/// takes what the terminal width leaves; every other field has a fixed width, so the bars of
/// all policies line up and no line wraps on a narrow terminal.
const TEMPLATE: &str = "{prefix:<14} [{wide_bar}] {percent:>3}%  {human_pos:>9}/{human_len} jobs  {msg:4}";

/// One progress bar per policy, drawn together.
pub struct ReplayProgress {
    multi: MultiProgress,
    bars: Vec<ProgressBar>,
}

impl ReplayProgress {
    /// Bars for `policies`, each out of `jobs`, drawn on stderr when `draw` is true (stderr is a
    /// terminal) and kept hidden otherwise, so CI logs get no control characters.
    pub fn new(policies: &[Policy], jobs: u64, draw: bool) -> Self {
        let target = if draw { ProgressDrawTarget::stderr_with_hz(REFRESH_HZ) } else { ProgressDrawTarget::hidden() };
        let multi = MultiProgress::with_draw_target(target);
        // The template is a constant: this falls back only if indicatif ever stops accepting it.
        let style = ProgressStyle::with_template(TEMPLATE)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("#>.");
        let bars = policies
            .iter()
            .map(|policy| {
                let bar = multi.add(ProgressBar::new(jobs).with_style(style.clone()));
                bar.set_prefix(policy.name());
                bar
            })
            .collect();
        ReplayProgress { multi, bars }
    }

    /// Moves each bar to its policy's counter (finished jobs, in `policies` order) and marks
    /// the policies whose every job has finished.
    pub fn update(&self, counters: &[AtomicU64]) {
        for (bar, counter) in self.bars.iter().zip(counters) {
            let done = counter.load(Ordering::Relaxed);
            if done != bar.position() {
                bar.set_position(done);
            }
            if bar.length().is_some_and(|jobs| done >= jobs) && bar.message().is_empty() {
                bar.set_message("done");
            }
        }
    }

    /// Erases the bars at once, leaving the terminal as it was before the replay.
    pub fn clear(&self) {
        // Errors here only mean the terminal went away; there is nothing left to erase then.
        let _ = self.multi.clear();
        // Nothing more may be drawn: finishing the bars one by one would redraw the others.
        self.multi.set_draw_target(ProgressDrawTarget::hidden());
        for bar in &self.bars {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn positions(progress: &ReplayProgress) -> Vec<u64> {
        progress.bars.iter().map(ProgressBar::position).collect()
    }

    fn messages(progress: &ReplayProgress) -> Vec<String> {
        progress.bars.iter().map(ProgressBar::message).collect()
    }

    #[test]
    fn bars_follow_the_counters_and_say_done_when_every_job_finished() {
        let policies = [Policy::Meridian, Policy::HomeOnly];
        let progress = ReplayProgress::new(&policies, 10, false);
        let counters = [AtomicU64::new(0), AtomicU64::new(0)];
        progress.update(&counters);
        assert_eq!(positions(&progress), [0, 0]);

        counters[0].store(4, Ordering::Relaxed);
        counters[1].store(10, Ordering::Relaxed);
        progress.update(&counters);
        assert_eq!(positions(&progress), [4, 10]);
        assert_eq!(messages(&progress), ["", "done"]);

        counters[0].store(10, Ordering::Relaxed);
        progress.update(&counters);
        assert_eq!(messages(&progress), ["done", "done"]);
        progress.clear();
    }

    #[test]
    fn bars_are_named_after_their_policies() {
        let progress = ReplayProgress::new(&Policy::ALL, 3, false);
        let names: Vec<String> = progress.bars.iter().map(ProgressBar::prefix).collect();
        assert_eq!(names, Policy::ALL.map(|p| p.name().to_owned()));
    }
}
