//! What the process holds on the device beyond its jobs' storages (the
//! CUDA context, the libraries' handles and workspaces, the caching
//! allocator's slack), measured, for the base the scheduler plans each job
//! with ([`BaseMeter`]).
//!
//! The measure: the device memory the process uses (NVML's figure for this
//! pid, [`DeviceUsage`]) less the most bytes its jobs' storages held at
//! once over a window that holds a whole iteration of every job. The
//! caching allocator keeps what it reserved, so the process's figure is
//! the high water of the window; the storages' peak is what the plans
//! count; the rest is what they must count beside it.
//!
//! When: after every job of the process has run [`WARMUP`] iterations, the
//! allocator's cache is given back ([`DeviceUsage::release_cache`]) and
//! the first window opens; each window closes with a measurement, and the
//! next opens at once. A plan switch (any job's) gives the cache back and
//! opens a new window too: the memory a former plan reserved would
//! otherwise count as the base of the new one, and a re-plan that lowers a
//! job's storages would raise its measured base by as much, round after
//! round. Until the first measurement, and where the process's memory
//! cannot be read (the CPU, NVML missing or failing, said once), a job
//! reports no base (0).
//!
//! Jobs that share the process (`tensile-worker --copies N` or `--job`
//! repeated) pay its base once: each reports the process's whole figure,
//! and the scheduler, to which they registered as jobs of this one process
//! (`RegisterJobRequest.process`), counts it once for all of them (with
//! one of them; when that one's iterations are over, another takes it
//! over).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tensile_swap_executor::ProcessMemory;

/// Iterations every job of the process runs before the first measurement:
/// the first iterations load the libraries' kernels and workspaces, and
/// the first plans may still change.
pub const WARMUP: usize = 3;

/// The device memory the process uses, as the driver counts it.
pub trait DeviceUsage: Send + Sync {
    /// Device bytes the process uses now.
    fn used_bytes(&self) -> Result<u64, String>;
    /// Gives the allocator's cached memory (held by no tensor) back to the
    /// device.
    fn release_cache(&self) -> Result<(), String> {
        Ok(())
    }
}

/// This process's device memory on CUDA device `ordinal`, through NVML,
/// with the CUDA caching allocator's cache to give back; why not, when
/// NVML or the device cannot be found.
pub fn process_usage(ordinal: usize) -> Result<Box<dyn DeviceUsage>, String> {
    let nvml = ProcessMemory::open(ordinal).map_err(|e| e.to_string())?;
    Ok(Box::new(Nvml(nvml)))
}

/// [`DeviceUsage`] through NVML and libtorch's caching allocator.
struct Nvml(ProcessMemory);

impl DeviceUsage for Nvml {
    fn used_bytes(&self) -> Result<u64, String> {
        self.0.used_bytes().map_err(|e| e.to_string())
    }

    fn release_cache(&self) -> Result<(), String> {
        tensile_kernels::cuda_empty_cache().map_err(|e| e.to_string())
    }
}

/// Where the measurements stand.
#[derive(Debug)]
struct State {
    /// Iterations each job has ended.
    done: Vec<usize>,
    /// Jobs that have left (their iterations are over): no longer waited
    /// for.
    left: Vec<bool>,
    /// The window open, once the warm-up is over: iterations each job
    /// ended in it, and the job at whose iteration's end it opened (which
    /// needs one more end for a whole iteration in it; the others two).
    window: Option<(Vec<usize>, Option<usize>)>,
    /// The process's base, last measured.
    measured: Option<u64>,
    /// The process's memory cannot be read: nothing is measured.
    off: bool,
}

/// The base of one process, measured for its jobs; shared by them (each
/// a worker, each on a thread of its own).
pub struct BaseMeter {
    usage: Option<Box<dyn DeviceUsage>>,
    jobs: usize,
    /// Device bytes all the jobs' storages hold now, and the most they
    /// held at once since the window opened.
    held: AtomicU64,
    peak: AtomicU64,
    state: Mutex<State>,
    say: Box<dyn Fn(&str) + Send + Sync>,
}

impl std::fmt::Debug for BaseMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaseMeter")
            .field("jobs", &self.jobs)
            .field("state", &*self.lock())
            .finish_non_exhaustive()
    }
}

impl BaseMeter {
    /// A meter for the `jobs` jobs of a process whose device memory
    /// `usage` reads; when it cannot (`Err`: why), the meter says so once
    /// through `say` and measures nothing.
    pub fn new(
        usage: Result<Box<dyn DeviceUsage>, String>,
        jobs: usize,
        say: impl Fn(&str) + Send + Sync + 'static,
    ) -> BaseMeter {
        let jobs = jobs.max(1);
        let (usage, off) = match usage {
            Ok(u) => (Some(u), false),
            Err(why) => {
                say(&not_measured(&why));
                (None, true)
            }
        };
        BaseMeter {
            usage,
            jobs,
            held: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            state: Mutex::new(State {
                done: vec![0; jobs],
                left: vec![false; jobs],
                window: None,
                measured: None,
                off,
            }),
            say: Box::new(say),
        }
    }

    /// A meter that measures nothing, silently (the CPU: no device memory
    /// outside the storages to plan).
    pub fn off(jobs: usize) -> BaseMeter {
        let meter = BaseMeter::new(Err(String::new()), jobs, |_| {});
        meter.lock().off = true;
        meter
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every field is replaced whole: a panic elsewhere cannot leave
        // one half-updated.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A job's storages now hold `bytes` more.
    pub fn grew(&self, bytes: u64) {
        let now = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// A job's storages now hold `bytes` fewer.
    pub fn shrank(&self, bytes: u64) {
        // Never below 0, whatever the order of the jobs' calls.
        let _ = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                Some(h.saturating_sub(bytes))
            });
    }

    /// Job `job` ended an iteration: measures when the window is whole,
    /// and returns the process's base as last measured, the whole of it
    /// (`None`: not measured yet, or not measurable).
    pub fn iteration_done(&self, job: usize) -> Option<u64> {
        let mut s = self.lock();
        if job >= self.jobs || s.off {
            return None;
        }
        s.done[job] += 1;
        match &mut s.window {
            None => {
                let warm = (0..self.jobs).all(|k| s.left[k] || s.done[k] >= WARMUP);
                if warm {
                    self.open(&mut s, Some(job), true);
                }
            }
            Some((ends, _)) => ends[job] += 1,
        }
        if let Some((ends, opener)) = &s.window {
            let whole = (0..self.jobs)
                .all(|k| s.left[k] || ends[k] >= if Some(k) == *opener { 1 } else { 2 });
            if whole {
                self.measure(&mut s);
                if !s.off {
                    self.open(&mut s, Some(job), false);
                }
            }
        }
        s.measured
    }

    /// Job `job` switched plans at its iteration's end: the cache the
    /// former plans reserved goes back, and a new window opens (the
    /// measured base stays until the next measurement).
    pub fn plan_switched(&self, job: usize) {
        let mut s = self.lock();
        if s.off || s.window.is_none() {
            // Still warming up: the warm-up's end gives the cache back.
            return;
        }
        self.open(&mut s, Some(job), true);
    }

    /// Job `job`'s iterations are over: its storages are gone, and the
    /// others no longer wait for it.
    pub fn left(&self, job: usize, held: u64) {
        self.shrank(held);
        let mut s = self.lock();
        if let Some(l) = s.left.get_mut(job) {
            *l = true;
        }
    }

    /// Opens a window at `opener`'s iteration end, giving the cache back
    /// first when `release`.
    fn open(&self, s: &mut State, opener: Option<usize>, release: bool) {
        if release
            && let Some(u) = &self.usage
            && let Err(why) = u.release_cache()
        {
            self.stop(
                s,
                &format!("giving the allocator's cache back failed: {why}"),
            );
            return;
        }
        self.peak
            .store(self.held.load(Ordering::Relaxed), Ordering::Relaxed);
        s.window = Some((vec![0; self.jobs], opener));
    }

    /// Closes the window with a measurement.
    fn measure(&self, s: &mut State) {
        let Some(u) = &self.usage else {
            return;
        };
        match u.used_bytes() {
            Ok(used) => {
                let storages = self.peak.load(Ordering::Relaxed);
                s.measured = Some(used.saturating_sub(storages)).filter(|&b| b > 0);
            }
            Err(why) => self.stop(s, &format!("reading it failed: {why}")),
        }
    }

    /// Measures nothing from now on, and says why (once).
    fn stop(&self, s: &mut State, why: &str) {
        s.off = true;
        s.window = None;
        s.measured = None;
        (self.say)(&not_measured(why));
    }
}

fn not_measured(why: &str) -> String {
    format!(
        "the device memory this process holds outside its storages cannot be measured ({why}): its jobs report their base as not measured, and the scheduler plans them with the device profile's or --base-mb"
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A process whose device memory is what the test sets.
    #[derive(Default)]
    struct Fake {
        used: AtomicU64,
        releases: AtomicUsize,
        fail: std::sync::atomic::AtomicBool,
    }

    impl DeviceUsage for Arc<Fake> {
        fn used_bytes(&self) -> Result<u64, String> {
            if self.fail.load(Ordering::Relaxed) {
                return Err("NVML went away".into());
            }
            Ok(self.used.load(Ordering::Relaxed))
        }
        fn release_cache(&self) -> Result<(), String> {
            self.releases.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    fn meter(jobs: usize) -> (BaseMeter, Arc<Fake>, Arc<Mutex<Vec<String>>>) {
        let fake = Arc::new(Fake::default());
        let said = Arc::new(Mutex::new(Vec::new()));
        let log = said.clone();
        let m = BaseMeter::new(Ok(Box::new(fake.clone())), jobs, move |s| {
            log.lock().unwrap_or_else(|p| p.into_inner()).push(s.into())
        });
        (m, fake, said)
    }

    const MB: u64 = 1_000_000;

    #[test]
    fn one_job_measures_after_its_warm_up_the_process_less_its_storages_peak() {
        let (m, fake, said) = meter(1);
        fake.used.store(3000 * MB, Ordering::Relaxed);
        // The warm-up: nothing measured, then the cache goes back.
        for _ in 0..WARMUP {
            m.grew(2500 * MB);
            m.shrank(2500 * MB);
            assert_eq!(m.iteration_done(0), None);
        }
        assert_eq!(fake.releases.load(Ordering::Relaxed), 1);
        // A whole iteration in the window: its storages peaked at 2100 MB
        // while the process used 3000.
        m.grew(2100 * MB);
        m.shrank(2100 * MB);
        assert_eq!(m.iteration_done(0), Some(900 * MB));
        // Every later report carries the newest measurement.
        m.grew(2000 * MB);
        fake.used.store(3100 * MB, Ordering::Relaxed);
        assert_eq!(m.iteration_done(0), Some(1100 * MB));
        // A plan switch gives the cache back and opens a new window.
        m.plan_switched(0);
        assert_eq!(fake.releases.load(Ordering::Relaxed), 2);
        m.shrank(500 * MB);
        fake.used.store(2500 * MB, Ordering::Relaxed);
        // The new window's peak: the 2000 MB held when it opened.
        assert_eq!(m.iteration_done(0), Some(500 * MB));
        assert!(said.lock().unwrap().is_empty());
    }

    #[test]
    fn jobs_of_one_process_report_one_base_over_their_joint_peak() {
        let (m, fake, _) = meter(2);
        for _ in 0..WARMUP {
            assert_eq!(m.iteration_done(0), None);
            assert_eq!(m.iteration_done(1), None);
        }
        // The window opened at job 1's end. Their storages peak at 1500 MB
        // together (1000 + 500 at once), never 2000 (their own peaks
        // added up), and the process uses 2700 MB.
        fake.used.store(2700 * MB, Ordering::Relaxed);
        m.grew(1000 * MB);
        m.grew(500 * MB);
        m.shrank(1000 * MB);
        m.grew(1000 * MB);
        m.shrank(1000 * MB);
        assert_eq!(m.iteration_done(0), None);
        assert_eq!(m.iteration_done(1), None, "job 0 has one end in it");
        // Job 0's second end: a whole iteration of each in the window.
        // The process's 1200 MB: one base over their joint peak (1500
        // MB), not two over their own.
        assert_eq!(m.iteration_done(0), Some(1200 * MB));
        // Each reports the process's whole base (the scheduler counts it
        // once for the process).
        assert_eq!(m.iteration_done(1), Some(1200 * MB));
        // A job that has left is not waited for: the window's peak still
        // has job 1's 500 MB.
        m.left(1, 500 * MB);
        fake.used.store(2000 * MB, Ordering::Relaxed);
        assert_eq!(m.iteration_done(0), Some(1500 * MB));
        m.grew(1000 * MB);
        assert_eq!(m.iteration_done(0), Some(1000 * MB));
    }

    #[test]
    fn a_process_that_cannot_be_read_says_so_once_and_reports_nothing() {
        let said = Arc::new(Mutex::new(Vec::<String>::new()));
        let log = said.clone();
        let m = BaseMeter::new(Err("no libnvidia-ml.so.1".into()), 1, move |s| {
            log.lock().unwrap().push(s.into())
        });
        for _ in 0..2 * WARMUP {
            assert_eq!(m.iteration_done(0), None);
        }
        let said = said.lock().unwrap().clone();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("no libnvidia-ml.so.1"), "{said:?}");
        // A reading that fails later: said once, and no figure from then.
        let (m, fake, said) = meter(1);
        fake.used.store(100 * MB, Ordering::Relaxed);
        for _ in 0..=WARMUP {
            m.iteration_done(0);
        }
        assert_eq!(m.iteration_done(0), Some(100 * MB));
        fake.fail.store(true, Ordering::Relaxed);
        for _ in 0..3 {
            assert_eq!(m.iteration_done(0), None);
        }
        let said = said.lock().unwrap().clone();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("NVML went away"), "{said:?}");
        // The CPU: silent, nothing.
        let m = BaseMeter::off(2);
        for _ in 0..2 * WARMUP {
            assert_eq!(m.iteration_done(1), None);
        }
    }
}
