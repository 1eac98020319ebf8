//! Memory over time: a trace is (time, bytes) at every change of one job's
//! memory, each value held until the next. The simulator keeps one per job
//! (ns); `tensile-worker --memory-trace` writes one per job as CSV lines
//! `unix_seconds,bytes`. Here they are written, read back and added up.

use std::cmp::Ordering;
use std::io::{self, Write};

/// Writes `memory` ((unix ns, bytes) at every change) as CSV lines
/// `seconds,bytes` with microsecond seconds, and flushes.
pub fn write_csv(out: &mut impl Write, memory: &[(u64, u64)]) -> io::Result<()> {
    for &(t, bytes) in memory {
        writeln!(out, "{:.6},{bytes}", t as f64 * 1e-9)?;
    }
    out.flush()
}

/// Reads what [`write_csv`] wrote: (seconds, bytes) per line. A line that
/// is not `finite number,integer` (the last one, cut short when its writer
/// was stopped; `nan` or `inf`, which no writer writes and no sum could
/// order) is left out.
pub fn parse_csv(text: &str) -> Vec<(f64, u64)> {
    text.lines()
        .filter_map(|l| {
            let (t, b) = l.split_once(',')?;
            let t: f64 = t.trim().parse().ok()?;
            Some((t, b.trim().parse().ok()?)).filter(|_| t.is_finite())
        })
        .collect()
}

/// The traces added up: (time, sum) at every instant at which any of them
/// changes, each trace holding its last value (0 before its first). Changes
/// at the same instant are taken together, so the sum never shows a state
/// that did not exist (one job's free counted before another's allocation
/// at the same time, or after it). Times that do not compare (NaN) count
/// as equal to all others, so they must not occur: [`parse_csv`] drops them.
pub fn summed<T: Copy + PartialOrd>(traces: &[&[(T, u64)]]) -> Vec<(T, u64)> {
    let mut changes: Vec<(T, usize, u64)> = traces
        .iter()
        .enumerate()
        .flat_map(|(j, t)| t.iter().map(move |&(at, bytes)| (at, j, bytes)))
        .collect();
    changes.sort_by(|a, b| {
        a.0.partial_cmp(&b.0)
            .unwrap_or(Ordering::Equal)
            .then(a.1.cmp(&b.1))
    });
    let mut held = vec![0u64; traces.len()];
    let mut sum = 0u64;
    let mut out: Vec<(T, u64)> = Vec::with_capacity(changes.len());
    for (at, j, bytes) in changes {
        sum = sum - held[j] + bytes;
        held[j] = bytes;
        match out.last_mut() {
            Some(last) if last.0 == at => last.1 = sum,
            _ => out.push((at, sum)),
        }
    }
    out
}

/// The most the traces held at one instant, added up ([`summed`]).
pub fn joint_peak<T: Copy + PartialOrd>(traces: &[&[(T, u64)]]) -> u64 {
    summed(traces).iter().map(|p| p.1).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn changes_at_one_instant_add_up_together() {
        // Job 0 frees 60 at t=2 while job 1 takes 50: the sum goes from
        // 100 to 90, never to 150 nor 40.
        let a = [(0u64, 100), (2, 40)];
        let b = [(2u64, 50), (3, 0)];
        assert_eq!(summed(&[&a, &b]), [(0, 100), (2, 90), (3, 40)]);
        assert_eq!(joint_peak(&[&a, &b]), 100);
        assert_eq!(joint_peak::<u64>(&[]), 0);
    }

    #[test]
    fn csv_round_trips_and_skips_a_line_cut_short() {
        let mut out = Vec::new();
        write_csv(&mut out, &[(1_500_000_000, 7), (2_000_001_000, 0)]).unwrap();
        let mut text = String::from_utf8(out).unwrap();
        assert_eq!(text, "1.500000,7\n2.000001,0\n");
        text.push_str("2.5,12\nnan,3\ninf,4\n-inf,5");
        text.push_str("\n3.0,");
        let got = parse_csv(&text);
        assert_eq!(got, [(1.5, 7), (2.000001, 0), (2.5, 12)]);
        // 7 + 5 at 1.75, 0 + 5 at 2.000001, 12 + 5 from 2.5 on.
        let other = [(1.75, 5)];
        assert_eq!(
            summed(&[&got, &other]),
            [(1.5, 7), (1.75, 12), (2.000001, 5), (2.5, 17)]
        );
        assert_eq!(joint_peak(&[&got, &other]), 17);
    }
}
