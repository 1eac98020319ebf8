//! Device storages as the host copy engine sees them: one flat, contiguous
//! tensor over a storage's bytes (a [`Flat`]), whose bytes the engine reads
//! out with tch's `copy_data_u8` and writes into a new tensor with
//! `from_data_size` (or, refilling a CPU buffer the engine kept, straight
//! into it with `tensile_kernels::write_bytes`). Every tensor of the storage is a strided view of it
//! ([`Layout`]), re-derived after a swap-in with the same size, stride and
//! offset.

use tch::{Device, Kind, Tensor};
use tensile_swap_executor::Payload;

/// A storage's bytes as one flat tensor.
#[derive(Debug)]
pub struct Flat(pub Tensor);

/// What it takes to rebuild a [`Flat`] from bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlatMeta {
    pub kind: Kind,
    pub device: Device,
}

impl Payload for Flat {
    type Meta = FlatMeta;

    fn meta(&self) -> FlatMeta {
        FlatMeta {
            kind: self.0.kind(),
            device: self.0.device(),
        }
    }

    fn share(&self) -> Self {
        Flat(self.0.shallow_clone())
    }

    fn byte_len(&self) -> usize {
        self.0.numel() * self.0.kind().elt_size_in_bytes()
    }

    fn read(&self, dst: &mut [u8]) -> Result<(), String> {
        self.0
            .f_copy_data_u8(dst, self.0.numel())
            .map_err(|e| format!("reading a device buffer: {e}"))
    }

    fn write(meta: &FlatMeta, src: &[u8]) -> Result<Self, String> {
        let elt = meta.kind.elt_size_in_bytes();
        let n = src.len() / elt;
        let t = Tensor::f_from_data_size(src, &[n as i64], meta.kind)
            .map_err(|e| format!("building a device buffer: {e}"))?;
        let t = if meta.device == Device::Cpu {
            t
        } else {
            t.f_to_device(meta.device)
                .map_err(|e| format!("moving a buffer to {:?}: {e}", meta.device))?
        };
        Ok(Flat(t))
    }

    /// CPU buffers: a fresh one of 32 MB or more page-faults on first
    /// touch; a CUDA device's caching allocator reuses its own blocks.
    fn reusable(&self) -> bool {
        self.0.device() == Device::Cpu
    }

    fn overwrite(&mut self, src: &[u8]) -> Result<(), String> {
        tensile_kernels::write_bytes(&self.0, src)
    }
}

/// Where a tensor lies in its storage: enough to re-derive it from the
/// storage's flat tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub size: Vec<i64>,
    pub stride: Vec<i64>,
    /// Bytes from the start of the flat tensor.
    pub byte_offset: i64,
    pub kind: Kind,
}

/// Elements a strided tensor spans, from its first to its last element.
pub(crate) fn span(size: &[i64], stride: &[i64]) -> Result<i64, String> {
    if size.contains(&0) {
        return Ok(0);
    }
    let mut last = 0i64;
    for (&n, &s) in size.iter().zip(stride) {
        if s < 0 {
            return Err(format!("negative stride {s}"));
        }
        last += (n - 1) * s;
    }
    Ok(last + 1)
}

impl Flat {
    /// The flat tensor over the bytes that `t` spans, from its first element.
    pub fn over(t: &Tensor) -> Result<Flat, String> {
        let n = span(&t.size(), &t.stride())?;
        t.f_as_strided([n], [1], None::<i64>)
            .map(Flat)
            .map_err(|e| format!("flattening a storage: {e}"))
    }

    /// Where `t` lies in this flat tensor; an error when it lies outside.
    pub fn layout_of(&self, t: &Tensor) -> Result<Layout, String> {
        let (size, stride, kind) = (t.size(), t.stride(), t.kind());
        let byte_offset = t.data_ptr() as i64 - self.0.data_ptr() as i64;
        let end = byte_offset + span(&size, &stride)? * kind.elt_size_in_bytes() as i64;
        if byte_offset < 0 || end > self.byte_len() as i64 {
            return Err(format!(
                "a tensor at bytes {byte_offset}..{end} lies outside its storage of {} bytes",
                self.byte_len()
            ));
        }
        Ok(Layout {
            size,
            stride,
            byte_offset,
            kind,
        })
    }

    /// The tensor at `layout` in this flat tensor.
    pub fn derive(&self, layout: &Layout) -> Result<Tensor, String> {
        let elt = layout.kind.elt_size_in_bytes() as i64;
        if layout.byte_offset % elt != 0 {
            return Err(format!(
                "offset {} is not a multiple of {elt}",
                layout.byte_offset
            ));
        }
        let base = if layout.kind == self.0.kind() {
            self.0.shallow_clone()
        } else {
            self.0
                .f_view_dtype(layout.kind)
                .map_err(|e| format!("viewing a storage as {:?}: {e}", layout.kind))?
        };
        base.f_as_strided(
            layout.size.as_slice(),
            layout.stride.as_slice(),
            Some(layout.byte_offset / elt),
        )
        .map_err(|e| format!("re-deriving a view: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_re_derive_from_a_copied_storage_with_their_layout() {
        let root = Tensor::arange(24, (Kind::Float, Device::Cpu)).reshape([4, 6]);
        let view = root.narrow(1, 2, 3).transpose(0, 1);
        let flat = Flat::over(&root).expect("flat");
        assert_eq!(flat.byte_len(), 96);
        let layout = flat.layout_of(&view).expect("inside");
        assert_eq!(layout.byte_offset, 8);
        let mut bytes = vec![0u8; flat.byte_len()];
        flat.read(&mut bytes).expect("read");
        let copy = Flat::write(&flat.meta(), &bytes).expect("write");
        let again = copy.derive(&layout).expect("derive");
        assert_eq!(again.size(), view.size());
        assert_eq!(again.stride(), view.stride());
        assert!(again.equal(&view));
        // A distinct buffer: writing the copy leaves the original alone.
        assert_ne!(again.data_ptr(), view.data_ptr());
    }

    #[test]
    fn a_cpu_buffer_is_refilled_in_place_and_a_misfit_is_an_error() {
        let want = Tensor::arange(6, (Kind::Float, Device::Cpu));
        let mut bytes = vec![0u8; 24];
        Flat(want.shallow_clone()).read(&mut bytes).expect("read");
        let mut flat = Flat(Tensor::zeros([6], (Kind::Float, Device::Cpu)));
        assert!(flat.reusable());
        let at = flat.0.data_ptr();
        flat.overwrite(&bytes).expect("fits");
        assert_eq!(flat.0.data_ptr(), at, "in place");
        assert!(flat.0.equal(&want));
        let err = flat.overwrite(&bytes[..20]).expect_err("short");
        assert!(err.contains("writing 20 B into a tensor of 24 B"), "{err}");
        let strided = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)).transpose(0, 1);
        let err = tensile_kernels::write_bytes(&strided, &bytes).expect_err("strided");
        assert!(err.contains("non-contiguous"), "{err}");
    }

    #[test]
    fn a_tensor_outside_the_storage_is_an_error() {
        let a = Tensor::zeros([8], (Kind::Float, Device::Cpu));
        let flat = Flat::over(&a.narrow(0, 0, 4)).expect("flat");
        let err = flat.layout_of(&a.narrow(0, 2, 4)).expect_err("outside");
        assert!(err.contains("outside its storage"), "{err}");
    }
}
