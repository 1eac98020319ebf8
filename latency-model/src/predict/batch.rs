//! The rows one [`crate::Predictor::predict_graph`] call sends to each op
//! type's model: the distinct feature vectors only. A graph repeats its
//! shapes (ResNet-50's bottlenecks, DenseNet's dense layers, one optimizer
//! update per parameter): at batch 16 the zoo models have 2 to 14 times
//! fewer distinct rows than kernel ops. A model's output for a row depends
//! on that row alone, so the ops that share a row share its prediction (up
//! to float rounding: ONNX Runtime's matrix kernels may round a row a last
//! bit differently in a batch of another size).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::features::FEATURE_LEN;

/// A hash map with [`FastHasher`].
pub(super) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// The distinct rows of each model, kept between calls so that their
/// buffers are allocated once.
#[derive(Debug, Default)]
pub(super) struct Batches {
    batches: Vec<Batch>,
}

/// The distinct rows of one model.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// Row-major, [`FEATURE_LEN`] a row.
    pub(super) rows: Vec<f32>,
    /// A row's bits to its index in `rows`.
    index: FastMap<[u32; FEATURE_LEN], u32>,
}

impl Batches {
    /// Empties every batch (keeping the buffers) for `models` models.
    pub(super) fn reset(&mut self, models: usize) {
        self.batches.resize_with(models, Batch::default);
        for b in &mut self.batches {
            b.rows.clear();
            b.index.clear();
        }
    }

    /// The index of `row` in model `m`'s batch, added if it is new.
    pub(super) fn row(&mut self, m: usize, row: &[f32; FEATURE_LEN]) -> u32 {
        let b = &mut self.batches[m];
        let next = b.index.len() as u32;
        let i = *b.index.entry(row.map(f32::to_bits)).or_insert(next);
        if i == next {
            b.rows.extend_from_slice(row);
        }
        i
    }

    /// Every model's batch, by model index.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Batch> {
        self.batches.iter()
    }

    /// Rows in all batches.
    pub(super) fn rows(&self) -> usize {
        self.batches.iter().map(Batch::len).sum()
    }
}

impl Batch {
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }
}

/// FxHash's multiply-and-rotate over 8-byte words: a row's 128 bytes hash
/// in a few nanoseconds, against about a hundred for the default SipHash,
/// which matters at thousands of ops a call. (Keys are our own rows and op
/// types, not an attacker's.)
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(c);
            self.add(u64::from_le_bytes(word));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_rows_share_an_index_and_reset_keeps_nothing() {
        let mut b = Batches::default();
        b.reset(2);
        let (x, mut y) = ([1.0f32; FEATURE_LEN], [1.0f32; FEATURE_LEN]);
        y[31] = 2.0;
        assert_eq!(b.row(0, &x), 0);
        assert_eq!(b.row(0, &y), 1);
        assert_eq!(b.row(0, &x), 0);
        assert_eq!(b.row(1, &y), 0);
        assert_eq!(b.rows(), 3);
        assert_eq!(b.iter().next().map(|m| m.rows.len()), Some(2 * FEATURE_LEN));
        b.reset(2);
        assert_eq!(b.rows(), 0);
        assert_eq!(b.row(1, &x), 0);
    }
}
