//! Progress of a bench on stderr: a bar on a terminal (indicatif), and
//! otherwise, for logs, a line every 5% of the runs.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress of the bench on stderr: a bar on a terminal (indicatif), and
/// otherwise, for logs, a line every 5% of the simulations.
pub(crate) struct Progress {
    pub(crate) bar: ProgressBar,
    pub(crate) total: u64,
    done: AtomicU64,
    /// The count at the last logged line (no terminal only).
    logged: Mutex<u64>,
}

impl Progress {
    pub(crate) fn new(total: usize) -> Progress {
        let total = total as u64;
        // indicatif hides the bar itself when stderr is not a terminal.
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "[{bar:30}] {pos}/{len} {elapsed:>4} eta {eta:>4} {wide_msg}",
        ) {
            bar.set_style(style.progress_chars("#>."));
        }
        Progress {
            bar,
            total,
            done: AtomicU64::new(0),
            logged: Mutex::new(0),
        }
    }

    pub(crate) fn tick(&self, what: &str) {
        // A count that is an upper bound (bench paper runs ours at a
        // baseline's peak only where both ran) never passes it.
        let k = (self.done.fetch_add(1, Ordering::Relaxed) + 1).min(self.total);
        self.bar.set_position(k);
        self.bar.set_message(what.to_string());
        if self.bar.is_hidden()
            && let Ok(mut logged) = self.logged.lock()
        {
            let step = (self.total / 20).max(1);
            if k >= *logged + step || k == self.total {
                *logged = k;
                let secs = self.bar.elapsed().as_secs_f64();
                // The runs left at the mean pace so far.
                let eta = secs / k as f64 * (self.total - k) as f64;
                eprintln!("{k}/{} {secs:>5.0}s eta {eta:>5.0}s {what}", self.total);
            }
        }
    }
}
