//! The processes jobs run in (a child of `planning.rs`): jobs that
//! registered with one process key (`RegisterJobRequest.process`, e.g.
//! `tensile-worker --job ... --job ...`) share its device memory outside
//! their storages (one CUDA context, one caching allocator), so the base is
//! the process's, counted once: one admitted job of the process, its
//! carrier, is planned with it (inside its peak, so inside admission, the
//! joint plan's budget and the ledger of plans in force), and its siblings
//! with none. A job admitted while no job of its process is admitted
//! becomes the carrier; when the carrier leaves or goes back to the queue,
//! the next admitted job of its process (the lowest id) takes the base over
//! and is re-planned with it. A measured base any job of the process
//! reports is folded into the process's ([`Base::observe`]) and planned
//! with the carrier. Jobs without a key are each a process of their own,
//! with a base of their own, as before.

use std::collections::{BTreeMap, BTreeSet};

use tensile_planner::JobId;
use tracing::{info, warn};

use super::{NewJob, Planner};
use crate::base::{Base, BaseSource};
use crate::state::Shared;

/// One process's jobs and base.
#[derive(Debug)]
pub(super) struct Process {
    /// The process's base: the first job's registered (or the profile's),
    /// raised by a larger one registered later, replaced by measurements.
    base: Base,
    /// Its registered jobs, queued or admitted.
    jobs: BTreeSet<u64>,
    /// The admitted job whose plans count the base.
    carrier: Option<u64>,
}

/// Every process with a key, and each job's key.
#[derive(Debug, Default)]
pub(super) struct Processes {
    by_key: BTreeMap<String, Process>,
    of_job: BTreeMap<u64, String>,
}

impl Processes {
    fn of(&self, id: u64) -> Option<&Process> {
        self.by_key.get(self.of_job.get(&id)?)
    }

    fn of_mut(&mut self, id: u64) -> Option<&mut Process> {
        self.by_key.get_mut(self.of_job.get(&id)?)
    }
}

impl Planner {
    /// A job registered: it joins its process (made with its base when it
    /// is the first). A larger base registered by a later job raises the
    /// process's until one is measured; the carrier is re-planned with it
    /// (unless a joint plan is in flight: its re-planner, which comes back
    /// in place of this one, would not have it; the process's jobs register
    /// one base as a rule, and a measurement corrects the rest).
    pub(super) fn join_process(&mut self, job: &NewJob) {
        let Some(key) = &job.process else { return };
        self.processes.of_job.insert(job.id, key.clone());
        let p = self
            .processes
            .by_key
            .entry(key.clone())
            .or_insert_with(|| Process {
                base: job.base.clone(),
                jobs: BTreeSet::new(),
                carrier: None,
            });
        p.jobs.insert(job.id);
        if let Some(c) = p.carrier {
            self.shared.job_mut(job.id, |j| j.base_job = c);
        }
        let raise = !self.in_flight
            && p.base.source() != BaseSource::Measured
            && job.base.source() == BaseSource::Registered
            && job.base.bytes() > p.base.bytes();
        if raise {
            p.base = job.base.clone();
            if let Some(c) = p.carrier {
                let base = p.base.clone();
                self.plan_base(c, base);
            }
        }
    }

    /// Queued job `job` as admission counts it: with its process's base
    /// when no other job of its process carries it, else with none; its
    /// status says so.
    pub(super) fn carry(processes: &Processes, shared: &Shared, job: &mut NewJob) {
        let Some(p) = processes.of(job.id) else {
            return;
        };
        let working_set = job.lower_bound.saturating_sub(job.base.bytes());
        job.base = match p.carrier {
            Some(c) if c != job.id => Base::new(0, BaseSource::Process),
            _ => p.base.clone(),
        };
        job.settings.base_bytes = job.base.bytes();
        job.lower_bound = working_set.saturating_add(job.base.bytes());
        let (bytes, source, lower_bound) = (job.base.bytes(), job.base.source(), job.lower_bound);
        shared.job_mut(job.id, |j| {
            j.base_bytes = bytes;
            j.base_source = source;
            j.lower_bound = lower_bound;
        });
    }

    /// Job `id` was admitted (as [`Planner::carry`] counted it): it
    /// carries its process's base if no other job does.
    pub(super) fn admitted_in_process(&mut self, id: u64) {
        let Some(p) = self.processes.of_mut(id) else {
            return;
        };
        if p.carrier.is_none() {
            p.carrier = Some(id);
            let jobs: Vec<u64> = p.jobs.iter().copied().collect();
            self.show_base_job(&jobs, id);
        }
    }

    /// Job `id` is no longer admitted (`left`: it left the scheduler too):
    /// if it carried its process's base, the next admitted job of the
    /// process takes it over and is re-planned with it.
    pub(super) fn leave_process(&mut self, id: u64, left: bool) {
        let admitted: Vec<u64> = self.admitted.keys().copied().collect();
        let Some(p) = self.processes.of_mut(id) else {
            return;
        };
        if left {
            p.jobs.remove(&id);
        }
        if p.carrier != Some(id) {
            return;
        }
        let next = p
            .jobs
            .iter()
            .copied()
            .find(|j| *j != id && admitted.contains(j));
        p.carrier = next;
        let base = p.base.clone();
        let jobs: Vec<u64> = p.jobs.iter().copied().collect();
        if left && p.jobs.is_empty() {
            if let Some(key) = self.processes.of_job.remove(&id) {
                self.processes.by_key.remove(&key);
            }
        } else if left {
            self.processes.of_job.remove(&id);
        }
        self.show_base_job(&jobs, next.unwrap_or(0));
        if let Some(next) = next {
            info!(
                job = next,
                from = id,
                base_bytes = base.bytes(),
                "the job takes its process's base over from a job that left"
            );
            self.plan_base(next, base);
        }
    }

    /// Forgets a job that left while queued.
    pub(super) fn forget_queued(&mut self, id: u64) {
        self.leave_process(id, true);
    }

    /// Folds a report's measured base into the process of job `id`; the
    /// carrier and its new base when it is to be planned with (`None`: no
    /// key, or no change, or no carrier).
    pub(super) fn observe_process_base(&mut self, id: u64, measured: u64) -> Option<(u64, u64)> {
        let p = self.processes.of_mut(id)?;
        let bytes = p.base.observe(measured)?;
        Some((p.carrier?, bytes))
    }

    /// Whether job `id` registered with a process key.
    pub(super) fn in_process(&self, id: u64) -> bool {
        self.processes.of_job.contains_key(&id)
    }

    /// Admitted job `id` is planned with `base` from now on: the
    /// re-planner, its lower bound and need, its status. True when it
    /// changed.
    pub(super) fn plan_base(&mut self, id: u64, base: Base) -> bool {
        let (bytes, source) = (base.bytes(), base.source());
        let Some(adm) = self.admitted.get_mut(&id) else {
            return false;
        };
        let was = adm.base.bytes();
        // A job admitted during a joint plan joins the re-planner when it
        // is back, with its settings as admitted.
        if let Some(late) = self.late.iter_mut().find(|j| j.id == id) {
            late.settings.base_bytes = bytes;
        } else if let Err(e) = self.replanner.set_base_bytes(JobId(id), bytes) {
            warn!(job = id, "cannot plan the base: {e}");
            return false;
        }
        adm.base = base;
        adm.lower_bound = adm.working_set.saturating_add(bytes);
        // What the planner reached for it moves with its base.
        adm.need = adm
            .need
            .saturating_sub(was)
            .saturating_add(bytes)
            .max(adm.lower_bound);
        let lower_bound = adm.lower_bound;
        self.shared.job_mut(id, |j| {
            j.base_bytes = bytes;
            j.base_source = source;
            j.lower_bound = lower_bound;
        });
        true
    }

    /// Status: which job of `jobs` counts their process's base.
    fn show_base_job(&self, jobs: &[u64], carrier: u64) {
        for &j in jobs {
            self.shared.job_mut(j, |job| job.base_job = carrier);
        }
    }
}
