//! How a kernel's runs are timed. On a CPU, the wall clock around each run.
//! On CUDA, a kernel launch returns before the kernel runs, and a device
//! synchronize after each run adds its own latency (tens of microseconds,
//! more than many kernels take): the profile then over-predicts the GPU's
//! iterations. So on CUDA the runs go back to back and each is timed by two
//! CUDA events on libtorch's compute stream (the worker's op clock,
//! [`CudaOpClock`]); one wait at the end reads them all. Where the CUDA
//! driver cannot be opened for events, the wall clock with a synchronize
//! after each run stands in, and the report says so.

use std::time::{Duration, Instant};

use tch::Device;
use tensile_swap_executor::CudaOpClock;

/// What a run is timed by.
pub(crate) enum Clock {
    /// Wall clock around each run; on CUDA `Some(ordinal)`: each run ends
    /// with a device synchronize.
    Wall(Option<i64>),
    /// CUDA events around each run, runs back to back.
    Events(CudaOpClock),
}

/// A run that failed in libtorch, or a clock that failed.
#[derive(Debug)]
pub(crate) enum RunError {
    Torch(tch::TchError),
    Clock(String),
}

impl Clock {
    /// The clock for `device`: events on CUDA where the driver opens, the
    /// wall clock otherwise.
    pub(crate) fn for_device(device: Device) -> Clock {
        match device {
            Device::Cuda(i) => match CudaOpClock::new(i) {
                Ok(c) => Clock::Events(c),
                Err(_) => Clock::Wall(Some(i64::try_from(i).unwrap_or(0))),
            },
            _ => Clock::Wall(None),
        }
    }

    /// What the samples' times are, in words (the profile's report).
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Clock::Wall(None) => "wall clock per run",
            Clock::Wall(Some(_)) => {
                "wall clock per run, ending with a device synchronize (the CUDA driver did not open for events)"
            }
            Clock::Events(_) => "CUDA events around each run, runs back to back",
        }
    }

    /// Runs `f` `n` times and returns each run's time.
    pub(crate) fn time(
        &mut self,
        n: u32,
        f: &mut dyn FnMut() -> Result<(), tch::TchError>,
    ) -> Result<Vec<Duration>, RunError> {
        let n = n.max(1) as usize;
        match self {
            Clock::Wall(cuda) => {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    let t = Instant::now();
                    f().map_err(RunError::Torch)?;
                    if let Some(i) = *cuda {
                        tch::Cuda::synchronize(i);
                    }
                    out.push(t.elapsed());
                }
                Ok(out)
            }
            Clock::Events(clock) => {
                for run in 0..n {
                    clock.begin(run).map_err(RunError::Clock)?;
                    f().map_err(RunError::Torch)?;
                    clock.end().map_err(RunError::Clock)?;
                }
                let times = clock.take(n).map_err(RunError::Clock)?;
                times
                    .into_iter()
                    .enumerate()
                    .map(|(run, ns)| {
                        ns.map(Duration::from_nanos)
                            .ok_or_else(|| RunError::Clock(format!("run {run} was not timed")))
                    })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_timed_by_the_wall_clock_run_by_run() {
        let mut clock = Clock::for_device(Device::Cpu);
        assert_eq!(clock.describe(), "wall clock per run");
        let mut calls = 0;
        let times = clock
            .time(3, &mut || {
                calls += 1;
                std::thread::sleep(Duration::from_millis(2));
                Ok(())
            })
            .expect("no clock error on the CPU");
        assert_eq!(calls, 3);
        assert_eq!(times.len(), 3);
        assert!(times.iter().all(|t| *t >= Duration::from_millis(2)));
    }

    #[test]
    fn a_failing_run_stops_the_timing_with_its_error() {
        let mut clock = Clock::for_device(Device::Cpu);
        let mut calls = 0;
        let r = clock.time(5, &mut || {
            calls += 1;
            if calls == 2 {
                Err(tch::TchError::Kind("refused".into()))
            } else {
                Ok(())
            }
        });
        assert!(matches!(r, Err(RunError::Torch(_))));
        assert_eq!(calls, 2);
    }

    /// On a machine with CUDA: events time a matrix product no longer than
    /// the wall clock with a synchronize does (the synchronize's own
    /// latency is what events leave out).
    #[test]
    fn on_cuda_events_time_no_more_than_the_synchronized_wall_clock() {
        if !tch::Cuda::is_available() {
            eprintln!("SKIPPED: no CUDA device for libtorch");
            return;
        }
        let device = Device::Cuda(0);
        let mut events = Clock::for_device(device);
        assert!(
            matches!(events, Clock::Events(_)),
            "libtorch sees CUDA but the driver did not open for events"
        );
        let a = tch::Tensor::randn([64, 64], (tch::Kind::Float, device));
        let mut run = || a.f_matmul(&a).map(|_| ());
        let mut median = |c: &mut Clock| {
            let mut t = c.time(21, &mut run).expect("timed");
            t.sort_unstable();
            t[t.len() / 2]
        };
        median(&mut events); // warm-up
        let e = median(&mut events);
        let w = median(&mut Clock::Wall(Some(0)));
        eprintln!("64x64 matmul: events {e:?}, synchronized wall clock {w:?}");
        assert!(e > Duration::ZERO);
        assert!(e <= w, "events {e:?} > wall {w:?}");
    }
}
