//! The clock the contract's iteration gates are on: CLOCK_MONOTONIC of the
//! scheduler's host, which every process there reads alike (the workers,
//! the scheduler, Python's `time.monotonic_ns()` in the hook), so that one
//! epoch means one moment to all of them.

/// Nanoseconds on the host's monotonic clock.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec.max(0) as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_runs_forward_with_the_standard_librarys_instant() {
        let (a, i) = (super::monotonic_ns(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (b, d) = (super::monotonic_ns(), i.elapsed().as_nanos() as u64);
        assert!(b > a);
        // Both are CLOCK_MONOTONIC: they agree to well within a millisecond.
        assert!((b - a).abs_diff(d) < 1_000_000, "{} vs {d}", b - a);
    }
}
