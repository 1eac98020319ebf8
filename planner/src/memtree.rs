//! Memory per step as a segment tree: add a value over a range of steps, ask
//! for the maximum and the first step that reaches it, both in O(log n).

#[derive(Debug, Clone)]
pub(crate) struct MemTree {
    n: usize,
    max: Vec<i64>,
    lazy: Vec<i64>,
}

impl MemTree {
    pub(crate) fn new(values: &[i64]) -> MemTree {
        let n = values.len().max(1);
        let mut t = MemTree {
            n,
            max: vec![0; 4 * n],
            lazy: vec![0; 4 * n],
        };
        t.build(1, 0, n, values);
        t
    }

    fn build(&mut self, node: usize, lo: usize, hi: usize, v: &[i64]) {
        if hi - lo == 1 {
            self.max[node] = v.get(lo).copied().unwrap_or(i64::MIN / 4);
            return;
        }
        let mid = (lo + hi) / 2;
        self.build(2 * node, lo, mid, v);
        self.build(2 * node + 1, mid, hi, v);
        self.max[node] = self.max[2 * node].max(self.max[2 * node + 1]);
    }

    /// Adds `delta` to every step in `[from, to)`.
    pub(crate) fn add(&mut self, from: usize, to: usize, delta: i64) {
        let to = to.min(self.n);
        if from < to {
            self.add_rec(1, 0, self.n, from, to, delta);
        }
    }

    fn add_rec(&mut self, node: usize, lo: usize, hi: usize, from: usize, to: usize, d: i64) {
        if to <= lo || hi <= from {
            return;
        }
        if from <= lo && hi <= to {
            self.max[node] += d;
            self.lazy[node] += d;
            return;
        }
        let mid = (lo + hi) / 2;
        self.add_rec(2 * node, lo, mid, from, to, d);
        self.add_rec(2 * node + 1, mid, hi, from, to, d);
        self.max[node] = self.max[2 * node].max(self.max[2 * node + 1]) + self.lazy[node];
    }

    /// The maximum and the first step where it is reached.
    pub(crate) fn peak(&self) -> (i64, usize) {
        let (mut node, mut lo, mut hi) = (1, 0, self.n);
        let target = self.max[1];
        let mut above = 0;
        while hi - lo > 1 {
            above += self.lazy[node];
            let mid = (lo + hi) / 2;
            if self.max[2 * node] + above == target {
                node *= 2;
                hi = mid;
            } else {
                node = 2 * node + 1;
                lo = mid;
            }
        }
        (target, lo)
    }

    /// How many steps have the value `v`, at most the maximum (subtrees
    /// whose maximum is below it are skipped).
    pub(crate) fn count_of(&self, v: i64) -> usize {
        self.count_rec(1, 0, self.n, v, 0)
    }

    fn count_rec(&self, node: usize, lo: usize, hi: usize, v: i64, above: i64) -> usize {
        if self.max[node] + above < v {
            return 0;
        }
        if hi - lo == 1 {
            return usize::from(self.max[node] + above == v);
        }
        let above = above + self.lazy[node];
        let mid = (lo + hi) / 2;
        self.count_rec(2 * node, lo, mid, v, above)
            + self.count_rec(2 * node + 1, mid, hi, v, above)
    }

    /// The value at one step.
    pub(crate) fn at(&self, step: usize) -> i64 {
        let (mut node, mut lo, mut hi) = (1, 0, self.n);
        let mut above = 0;
        while hi - lo > 1 {
            above += self.lazy[node];
            let mid = (lo + hi) / 2;
            if step < mid {
                node *= 2;
                hi = mid;
            } else {
                node = 2 * node + 1;
                lo = mid;
            }
        }
        self.max[node] + above
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_adds_and_first_peak() {
        let mut t = MemTree::new(&[1, 5, 3, 5, 2]);
        assert_eq!(t.peak(), (5, 1));
        t.add(0, 2, -3);
        assert_eq!(t.peak(), (5, 3));
        t.add(2, 5, 10);
        assert_eq!(t.peak(), (15, 3));
        assert_eq!(
            (0..5).map(|i| t.at(i)).collect::<Vec<_>>(),
            [-2, 2, 13, 15, 12]
        );
    }

    #[test]
    fn matches_a_plain_array_under_random_updates() {
        let mut v: Vec<i64> = (0..37).map(|i| (i * 7919 % 101) as i64).collect();
        let mut t = MemTree::new(&v);
        let mut x = 12345u64;
        for _ in 0..500 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let a = (x >> 33) as usize % 37;
            let b = a + (x >> 20) as usize % (38 - a);
            let d = (x % 200) as i64 - 100;
            t.add(a, b, d);
            for e in &mut v[a..b] {
                *e += d;
            }
            let m = *v.iter().max().unwrap();
            let i = v.iter().position(|&e| e == m).unwrap();
            assert_eq!(t.peak(), (m, i));
            assert_eq!(t.count_of(m), v.iter().filter(|&&e| e == m).count());
        }
    }
}
