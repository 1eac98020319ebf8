//! A job's base: the device memory its process holds outside the job's
//! storages (the CUDA context, the libraries' workspaces, the caching
//! allocator's slack), which its plans count inside its peak, so inside
//! admission and the budget. It starts as the device profile's or the one
//! the job registered with, and a base the job measures and reports
//! replaces it when the two differ materially ([`Base::observe`]).
//!
//! Materially: by more than [`MATERIAL_SHARE`] of the base in use and at
//! least [`MATERIAL_FLOOR`]. A measurement moves from one iteration to the
//! next by the allocator's growth steps (2 MiB pages, 20 MiB segments) and
//! NVML's MiB, tens of MB; the same job under different plans measured
//! from 857 to 1022 MB on an H200 (about a tenth either way of its mean),
//! while the h100 profile's 671 MB was short of what processes held there
//! (0.9 to 1.5 GB) by a third to more than double. A re-plan costs every
//! job of the GPU a plan switch (and gated jobs their settling), so only a
//! difference of the second kind is worth one. A rise is taken at once: a
//! base planned too small lets the GPU's memory pass the budget, which no
//! guard sees (they hold the storages). A fall is taken once
//! [`FALLS_IN_A_ROW`] reports in a row show one, at the largest of them: a
//! base planned too large only leaves room unused, and a figure measured
//! just after the allocator gave its cache back can be low for a moment.

/// Where the base a job is planned with came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseSource {
    /// The device profile's `base_bytes`.
    Profile,
    /// The job's `JobSettings.base_bytes` (`tensile-worker --base-mb`).
    Registered,
    /// The job's reports (`ReportLatenciesRequest.base_bytes`).
    Measured,
    /// None of its own: another job of its process counts the process's
    /// base (`JobStatus.base_job`).
    Process,
}

impl BaseSource {
    /// The name `GetStatus` gives it (`JobStatus.base_source`).
    pub fn name(self) -> &'static str {
        match self {
            BaseSource::Profile => "profile",
            BaseSource::Registered => "registered",
            BaseSource::Measured => "measured",
            BaseSource::Process => "process",
        }
    }
}

/// The least difference between a measured base and the one in use that
/// re-plans the job: 64 MiB.
pub const MATERIAL_FLOOR: u64 = 64 << 20;
/// The share of the base in use a measured one must differ by to re-plan
/// the job, as a divisor: a tenth.
pub const MATERIAL_SHARE: u64 = 10;
/// Reports in a row whose measured base is materially below the one in use
/// before the lower base is planned.
pub const FALLS_IN_A_ROW: usize = 3;

/// Whether `measured` differs materially from `in_use` (see the module).
pub fn material(in_use: u64, measured: u64) -> bool {
    measured.abs_diff(in_use) > MATERIAL_FLOOR.max(in_use / MATERIAL_SHARE)
}

/// A job's base and the measurements that may replace it.
#[derive(Debug, Clone, PartialEq)]
pub struct Base {
    bytes: u64,
    source: BaseSource,
    /// The falls reported in a row so far.
    falls: Vec<u64>,
}

impl Base {
    pub fn new(bytes: u64, source: BaseSource) -> Base {
        Base {
            bytes,
            source,
            falls: Vec::new(),
        }
    }

    /// The base the job is planned with.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn source(&self) -> BaseSource {
        self.source
    }

    /// Folds in one report's measured base (0: not measured, which changes
    /// nothing); the job's new base when it is to be re-planned with one.
    pub fn observe(&mut self, measured: u64) -> Option<u64> {
        if measured == 0 {
            return None;
        }
        if !material(self.bytes, measured) {
            self.falls.clear();
            return None;
        }
        let new = if measured > self.bytes {
            measured
        } else {
            self.falls.push(measured);
            if self.falls.len() < FALLS_IN_A_ROW {
                return None;
            }
            self.falls.iter().copied().max().unwrap_or(measured)
        };
        self.falls.clear();
        self.bytes = new;
        self.source = BaseSource::Measured;
        Some(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    #[test]
    fn a_material_difference_is_a_tenth_of_the_base_and_at_least_64_mib() {
        // The h100 profile's 671 MB against what a process held on an H200.
        assert!(material(671 * MB, 857 * MB));
        assert!(material(671 * MB, 1500 * MB));
        // The same job under different plans: within a tenth.
        assert!(!material(915 * MB, 857 * MB));
        assert!(!material(915 * MB, 1000 * MB));
        // A small base: the floor, not the tenth.
        assert!(!material(100 * MB, 160 * MB));
        assert!(material(100 * MB, 100 * MB + MATERIAL_FLOOR + 1));
        assert!(material(MATERIAL_FLOOR + 1, 0));
    }

    #[test]
    fn a_rise_is_taken_at_once_a_fall_after_three_reports_in_a_row() {
        let mut b = Base::new(671 * MB, BaseSource::Profile);
        assert_eq!(b.source().name(), "profile");
        // Not measured, or within the threshold: nothing.
        assert_eq!(b.observe(0), None);
        assert_eq!(b.observe(700 * MB), None);
        assert_eq!((b.bytes(), b.source()), (671 * MB, BaseSource::Profile));
        // A rise: at once.
        assert_eq!(b.observe(1400 * MB), Some(1400 * MB));
        assert_eq!((b.bytes(), b.source().name()), (1400 * MB, "measured"));
        // Two falls, then one within the threshold: the streak ends.
        assert_eq!(b.observe(900 * MB), None);
        assert_eq!(b.observe(950 * MB), None);
        assert_eq!(b.observe(1350 * MB), None);
        assert_eq!(b.observe(900 * MB), None);
        assert_eq!(b.observe(950 * MB), None);
        // Reports that measured nothing do not break it; the third fall
        // in a row is taken at the largest of the three.
        assert_eq!(b.observe(0), None);
        assert_eq!(b.observe(920 * MB), Some(950 * MB));
        assert_eq!(b.bytes(), 950 * MB);
        // A rise in the middle of falls is taken and ends them.
        assert_eq!(b.observe(500 * MB), None);
        assert_eq!(b.observe(2000 * MB), Some(2000 * MB));
        assert_eq!(b.observe(500 * MB), None);
        assert_eq!(b.observe(500 * MB), None);
        assert_eq!(b.bytes(), 2000 * MB);
    }
}
