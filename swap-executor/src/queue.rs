//! TENSILE's Execution Queue: swap events wait here from their trigger op
//! until their delay has passed, then leave in fire order (ties in the
//! order they were pushed).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Events of type `E` waiting for their fire time (ns).
#[derive(Debug, Clone)]
pub struct ExecutionQueue<E> {
    heap: BinaryHeap<Reverse<Entry<E>>>,
    seq: u64,
}

#[derive(Debug, Clone)]
struct Entry<E> {
    at: u64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl<E> Default for ExecutionQueue<E> {
    fn default() -> Self {
        ExecutionQueue {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<E> ExecutionQueue<E> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues `event` to fire at `at`.
    pub fn push(&mut self, at: u64, event: E) {
        self.heap.push(Reverse(Entry {
            at,
            seq: self.seq,
            event,
        }));
        self.seq += 1;
    }

    /// The events due by `now`, in fire order, each with its fire time.
    pub fn pop_due(&mut self, now: u64) -> Vec<(u64, E)> {
        let mut out = Vec::new();
        while self.heap.peek().is_some_and(|Reverse(e)| e.at <= now) {
            if let Some(Reverse(e)) = self.heap.pop() {
                out.push((e.at, e.event));
            }
        }
        out
    }

    /// When the next event fires.
    pub fn next_due(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse(e)| e.at)
    }

    /// When the last event fires.
    pub fn last_due(&self) -> Option<u64> {
        self.heap.iter().map(|Reverse(e)| e.at).max()
    }

    /// Moves the events that `pick` selects to fire no later than `now`
    /// (their order among themselves and their tie order are kept); says
    /// whether any was picked. `pick` may be called twice per event.
    pub fn bring_forward(&mut self, now: u64, mut pick: impl FnMut(&E) -> bool) -> bool {
        // Rebuilt only when a picked event must move: the executor asks at
        // every release, and most find none.
        let (mut any, mut later) = (false, false);
        for Reverse(e) in &self.heap {
            if pick(&e.event) {
                any = true;
                later |= e.at > now;
            }
        }
        if !later {
            return any;
        }
        let entries: Vec<_> = std::mem::take(&mut self.heap).into_vec();
        self.heap = entries
            .into_iter()
            .map(|Reverse(mut e)| {
                if pick(&e.event) {
                    e.at = e.at.min(now);
                }
                Reverse(e)
            })
            .collect();
        any
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Drops every waiting event.
    pub fn clear(&mut self) {
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_leave_in_fire_order_then_push_order() {
        let mut q = ExecutionQueue::new();
        q.push(30, 'a');
        q.push(10, 'b');
        q.push(30, 'c');
        q.push(10, 'd');
        q.push(50, 'e');
        assert_eq!(q.next_due(), Some(10));
        assert_eq!(q.last_due(), Some(50));
        assert_eq!(q.pop_due(5), vec![]);
        assert_eq!(
            q.pop_due(30),
            vec![(10, 'b'), (10, 'd'), (30, 'a'), (30, 'c')]
        );
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn bring_forward_moves_only_the_picked_events() {
        let mut q = ExecutionQueue::new();
        q.push(100, 1);
        q.push(90, 2);
        q.push(200, 3);
        assert!(q.bring_forward(20, |&e| e != 2));
        assert!(!q.bring_forward(20, |&e| e == 7));
        // 1 and 3 now fire at 20, in push order; 2 stays at 90.
        assert_eq!(q.pop_due(20), vec![(20, 1), (20, 3)]);
        assert_eq!(q.pop_due(u64::MAX), vec![(90, 2)]);
        assert!(q.is_empty());
    }
}
