//! The program's own copies around its host ops ([`Gap::forced`]): a
//! host op's device inputs go out when the op is reached, and what it
//! rewrites on the host comes back before the next iteration reads it.
//! They are placed on the job's time line before the planner's own
//! decisions, which then plan around them.

use tensile_graph::StorageId;

use crate::job::{Copy, Gap, Job};

impl Job<'_> {
    /// Places the program's own copies around its host ops
    /// ([`Gap::forced`]), anew: each host op's device inputs go out when the
    /// op is reached (the executor does so), their buffers with them; and,
    /// where the job may swap across iterations, each storage a host op
    /// rewrites is released after its last device access and fetched back
    /// before its first in the next iteration (when no fetch fits before
    /// that access, the job waits for it there).
    pub(crate) fn place_host_copies(&mut self) {
        if self.host_ops.is_empty() {
            return;
        }
        for st in &mut self.st {
            st.gaps.retain(|g| !g.forced);
        }
        self.rebuild();
        let n = self.n();
        let graph = self.graph;
        for h in self.host_ops.clone() {
            let Some(k) = self.steps.iter().position(|x| x.op == h.op && x.is_real()) else {
                continue;
            };
            let mut seen = Vec::new();
            for &t in &graph.op(h.op).inputs {
                let s = self.live.storage_of[t.index()];
                let st = &self.st[s.index()];
                if seen.contains(&s) || st.persistent || st.host_master {
                    continue;
                }
                seen.push(s);
                // Read on the device after the host op: it stays.
                let (Some(&first), Some(&last)) = (st.accesses.first(), st.accesses.last()) else {
                    continue;
                };
                let bytes = st.bytes;
                if last.step > k || k == 0 || first.step >= k {
                    continue;
                }
                let out = Copy {
                    trigger: Some(k - 1),
                    delay: 0,
                    dur: self.out_dur(bytes),
                };
                let st = &mut self.st[s.index()];
                st.last = None;
                st.gaps.push(Gap {
                    after: last.step,
                    before: n,
                    wrap: false,
                    out: Some(out),
                    inn: None,
                    forced: true,
                });
            }
        }
        self.rebuild();
        if !(self.settings.swap && self.settings.across_iteration) {
            return;
        }
        // Latest first use first: each takes the latest fetch that fits.
        let mut rewritten: Vec<StorageId> = (0..self.st.len())
            .map(|i| StorageId(i as u32))
            .filter(|s| {
                let st = &self.st[s.index()];
                st.host_master && !st.host_only && !st.accesses.is_empty()
            })
            .collect();
        rewritten.sort_by_key(|s| std::cmp::Reverse(self.st[s.index()].accesses[0].step));
        for s in rewritten {
            let acc = &self.st[s.index()].accesses;
            let (first, last) = (acc[0].step, acc[acc.len() - 1].step);
            let by = self.times[first];
            // At the head of the next iteration, else at the tail of this
            // one once the host op is done, else the next waits for it.
            let written = self
                .host_ops
                .iter()
                .position(|h| h.writes.contains(&s.index()))
                .and_then(|h| self.host_end.get(h).copied())
                .unwrap_or(0);
            let placed = crate::swap::place_in(self, s, 0, by, 0)
                .or_else(|| {
                    let end = self.iteration_ns();
                    crate::swap::place_in(self, s, written, end, last + 1)
                        .and_then(|c| self.before_last_op(c, last))
                })
                .or_else(|| self.fetch_in_tail(s, written, last));
            let Some(inn) = placed else {
                continue;
            };
            let gap = Gap {
                after: last,
                before: first,
                wrap: true,
                out: None,
                inn: Some(inn),
                forced: true,
            };
            self.apply_gap(s, gap);
        }
        self.rebuild();
    }

    /// The earliest fetch of `s` from `lo` on (once its host op is done)
    /// after its last access, at the tail of the iteration: past the last
    /// op, the iteration lasts until it has arrived.
    fn fetch_in_tail(&self, s: StorageId, lo: u64, last: usize) -> Option<Copy> {
        let dur = self.in_dur(self.st[s.index()].bytes);
        let lo = lo.max(self.times[last + 1]);
        let start = self
            .chan(self.in_chan())
            .earliest_fit(lo, u64::MAX, dur)
            .unwrap_or(lo);
        let k = self.boundary_at_or_before(start).max(last + 1);
        self.before_last_op(
            Copy {
                trigger: Some(k - 1),
                delay: start - self.times[k],
                dur,
            },
            last,
        )
    }

    /// A fetch at the tail of the iteration triggered before its last op
    /// (so that its buffer counts in the last op's memory, as the executor
    /// has it then) and after the storage's last access `last`, the same
    /// copy: `None` when the last op is that access.
    fn before_last_op(&self, c: Copy, last: usize) -> Option<Copy> {
        let n = self.n();
        let t = c.trigger?;
        if t + 1 < n {
            return Some(c);
        }
        let mut k = n - 1;
        while k > last + 1 && !self.steps[k - 1].is_real() {
            k -= 1;
        }
        (k > last).then(|| Copy {
            trigger: Some(k - 1),
            delay: c.start(&self.times) - self.times[k],
            dur: c.dur,
        })
    }
}
