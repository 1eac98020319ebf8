//! The FFI edge: the only module with `unsafe`. It wraps the C++ shim
//! (`csrc/shim.cpp`) that finds ATen operators in the dispatcher, describes
//! their schemas and calls them boxed. Tensors cross as `at::Tensor*`, which
//! is what tch's `C_tensor` pointers are; tensors coming back are new heap
//! `at::Tensor`s, owned by the `tch::Tensor` that wraps them.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr::{self, NonNull};

use tch::Tensor;

#[repr(C)]
struct RawArg {
    kind: i32,
    i: i64,
    j: i64,
    f: f64,
    p: *const c_void,
    n: usize,
}

unsafe extern "C" {
    fn tk_free_str(s: *mut c_char);
    fn tk_op_find(
        name: *const c_char,
        overload: *const c_char,
        err: *mut *mut c_char,
    ) -> *mut c_void;
    fn tk_op_free(op: *mut c_void);
    fn tk_overloads(name: *const c_char, err: *mut *mut c_char) -> *mut c_char;
    fn tk_op_schema(op: *mut c_void, err: *mut *mut c_char) -> *mut c_char;
    fn tk_op_call(
        op: *mut c_void,
        args: *const RawArg,
        nargs: usize,
        outs: *mut *mut *mut c_void,
        nouts: *mut usize,
        err: *mut *mut c_char,
    ) -> i32;
    fn tk_free_outs(outs: *mut *mut c_void);
    fn tk_device_memory(
        device_type: i32,
        index: i32,
        reset: i32,
        out: *mut i64,
        err: *mut *mut c_char,
    ) -> i32;
    fn tk_empty_cache(device_type: i32, err: *mut *mut c_char) -> i32;
    fn tk_set_deterministic_cudnn(on: i32);
    fn tk_set_allocator_settings(conf: *const c_char, err: *mut *mut c_char) -> i32;
    fn tk_storage_use_count(t: *const c_void) -> i64;
}

/// cuDNN's deterministic algorithms on or off (its autotuner off).
pub(crate) fn set_deterministic_cudnn(on: bool) {
    // SAFETY: the shim sets two flags of ATen's global context; it takes no
    // pointers and throws nothing.
    unsafe { tk_set_deterministic_cudnn(i32::from(on)) }
}

/// Sets the caching allocators' settings (PYTORCH_ALLOC_CONF's syntax).
pub(crate) fn set_allocator_settings(conf: &str) -> Result<(), String> {
    let c = CString::new(conf).map_err(|_| "a NUL byte in the settings".to_string())?;
    let mut err: *mut c_char = ptr::null_mut();
    // SAFETY: `c` is a NUL-terminated string alive for the call, which
    // copies it; `err` is a valid out-pointer; the shim catches every C++
    // exception.
    let rc = unsafe { tk_set_allocator_settings(c.as_ptr(), &mut err) };
    if rc != 0 {
        return Err(take_str(err));
    }
    Ok(())
}

/// The caching allocator's `[allocated now, allocated peak, reserved now,
/// reserved peak]` of CUDA device `index`; with `reset`, the peaks are reset
/// afterwards.
pub(crate) fn cuda_memory(index: i32, reset: bool) -> Result<[i64; 4], String> {
    let mut out = [0i64; 4];
    let mut err: *mut c_char = ptr::null_mut();
    // SAFETY: `out` has the 4 slots the shim writes; `err` is a valid
    // out-pointer; the shim catches every C++ exception.
    let rc = unsafe { tk_device_memory(1, index, i32::from(reset), out.as_mut_ptr(), &mut err) };
    if rc != 0 {
        return Err(take_str(err));
    }
    Ok(out)
}

/// Gives the CUDA caching allocator's unused cached memory back to the
/// driver.
pub(crate) fn cuda_empty_cache() -> Result<(), String> {
    let mut err: *mut c_char = ptr::null_mut();
    // SAFETY: `err` is a valid out-pointer; the shim takes no other
    // pointer and catches every C++ exception.
    let rc = unsafe { tk_empty_cache(1, &mut err) };
    if rc != 0 {
        return Err(take_str(err));
    }
    Ok(())
}

/// Writes `src` into the memory of `dst`, a contiguous CPU tensor of
/// exactly `src.len()` bytes, with no allocation (a copy engine refilling
/// a buffer it reuses).
pub(crate) fn write_bytes(dst: &Tensor, src: &[u8]) -> Result<(), String> {
    let len = dst.numel() * dst.kind().elt_size_in_bytes();
    if dst.device() != tch::Device::Cpu {
        return Err(format!(
            "writing bytes into a {:?} tensor (CPU only)",
            dst.device()
        ));
    }
    if !dst.is_contiguous() || len != src.len() {
        return Err(format!(
            "writing {} B into a {}tensor of {len} B",
            src.len(),
            if dst.is_contiguous() {
                ""
            } else {
                "non-contiguous "
            }
        ));
    }
    if len == 0 {
        return Ok(());
    }
    let mut bytes = dst
        .f_view_dtype(tch::Kind::Uint8)
        .and_then(|t| t.f_reshape([len as i64]))
        .map_err(|e| format!("viewing a tensor as bytes: {e}"))?;
    // SAFETY: `src` is `len` initialised bytes, borrowed for this whole
    // function; the blob tensor only reads them in the synchronous CPU
    // `copy_` below and is dropped before the function returns (nothing
    // else holds it: `copy_` keeps no reference to its source).
    let blob = unsafe {
        Tensor::f_from_blob(
            src.as_ptr(),
            &[len as i64],
            &[1],
            tch::Kind::Uint8,
            tch::Device::Cpu,
        )
    }
    .map_err(|e| format!("wrapping {len} B: {e}"))?;
    let copied = bytes.f_copy_(&blob).map(drop);
    drop(blob);
    copied.map_err(|e| format!("copying {len} B: {e}"))
}

/// Runs `f` on flat CPU tensors over memory the caller lends: one tensor
/// per buffer, of its kind, as long as the buffer (see
/// [`crate::with_cpu_tensors`]). No tensor over the buffers may outlive
/// `f`: that is checked when `f` returns (or panics), and a tensor that
/// escaped aborts the process, since it would point at memory about to go
/// back to its owner.
pub(crate) fn with_cpu_tensors<R>(
    bufs: &mut [(&mut [u8], tch::Kind)],
    f: impl FnOnce(&[Tensor]) -> R,
) -> Result<R, String> {
    let mut tensors = Vec::with_capacity(bufs.len());
    for (bytes, kind) in bufs.iter_mut() {
        let elt = kind.elt_size_in_bytes();
        let (len, at) = (bytes.len(), bytes.as_mut_ptr());
        // An empty buffer's pointer is dangling: no alignment to check.
        if !len.is_multiple_of(elt) || (len > 0 && !(at as usize).is_multiple_of(elt)) {
            return Err(format!(
                "{len} B at {at:p} are not whole, aligned elements of {kind:?}"
            ));
        }
        let t = if len == 0 {
            Tensor::f_empty([0], (*kind, tch::Device::Cpu))
        } else {
            // SAFETY: `bytes` is `len` bytes, aligned for `kind`, borrowed
            // mutably for this whole function, so nothing else reads or
            // writes them meanwhile; the tensor, which does not own them, and
            // every view of it are gone before this function returns (the
            // use count is checked below, and the process aborts if one
            // escaped).
            unsafe {
                Tensor::f_from_blob(
                    at.cast_const(),
                    &[(len / elt) as i64],
                    &[1],
                    *kind,
                    tch::Device::Cpu,
                )
            }
        }
        .map_err(|e| format!("wrapping {len} B as {kind:?}: {e}"))?;
        tensors.push(t);
    }
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&tensors)));
    for t in &tensors {
        // SAFETY: `t` is a live tensor; the shim only reads its storage's
        // reference count.
        let users = unsafe { tk_storage_use_count(t.as_ptr() as *const c_void) };
        if users > 1 {
            eprintln!(
                "tensile-kernels: a tensor over lent host memory outlived its use ({users} users): aborting"
            );
            std::process::abort();
        }
    }
    drop(tensors);
    match out {
        Ok(r) => Ok(r),
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// One argument value, in schema order (see `tk_arg` in the shim).
#[derive(Debug)]
pub(crate) enum Arg<'a> {
    /// The schema's default value.
    Default,
    None,
    Tensor(&'a Tensor),
    TensorList(Vec<&'a Tensor>),
    OptTensorList(Vec<Option<&'a Tensor>>),
    Int(i64),
    Float(f64),
    Bool(bool),
    Ints(&'a [i64]),
    Floats(&'a [f64]),
    Bools(Vec<u8>),
    ScalarInt(i64),
    ScalarFloat(f64),
    ScalarBool(bool),
    /// A number where the schema wants a tensor: a wrapped-number tensor.
    WrappedInt(i64),
    WrappedFloat(f64),
    WrappedBool(bool),
    Str(&'a str),
    /// A `c10::ScalarType` code.
    Dtype(i64),
    /// A `c10::MemoryFormat` code.
    MemoryFormat(i64),
    /// A `c10::Layout` code.
    Layout(i64),
    /// A `c10::DeviceType` code and a device index (-1: none).
    Device(i64, i64),
}

/// Takes a message the shim allocated.
fn take_str(s: *mut c_char) -> String {
    if s.is_null() {
        return "unknown error (no message)".to_string();
    }
    // SAFETY: `s` is a NUL-terminated string malloc'd by the shim (`dup`), not
    // freed before; we copy it out and hand it back to the shim's `free`.
    unsafe {
        let out = CStr::from_ptr(s).to_string_lossy().into_owned();
        tk_free_str(s);
        out
    }
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

/// The overload names registered for an operator (`""` is the default one).
pub(crate) fn overloads(name: &str) -> Result<Vec<String>, String> {
    let name = cstring(name)?;
    let mut err: *mut c_char = ptr::null_mut();
    // SAFETY: `name` is a valid C string for the duration of the call; `err`
    // is a valid out-pointer. The shim catches every C++ exception.
    let text = unsafe { tk_overloads(name.as_ptr(), &mut err) };
    if text.is_null() {
        return Err(take_str(err));
    }
    Ok(take_str(text).lines().map(str::to_string).collect())
}

/// A handle on one operator of the dispatcher (`c10::OperatorHandle`).
#[derive(Debug)]
pub(crate) struct OpHandle(NonNull<c_void>);

// SAFETY: an OperatorHandle points into the dispatcher's global operator
// table, which is itself thread-safe; the handle object is only read.
unsafe impl Send for OpHandle {}

impl Drop for OpHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `tk_op_find` (a `new` OperatorHandle)
        // and is freed exactly once, here.
        unsafe { tk_op_free(self.0.as_ptr()) }
    }
}

impl OpHandle {
    /// Finds `name` (`aten::add`) with `overload` (`""`: the default one).
    pub(crate) fn find(name: &str, overload: &str) -> Result<OpHandle, String> {
        let (n, o) = (cstring(name)?, cstring(overload)?);
        let mut err: *mut c_char = ptr::null_mut();
        // SAFETY: both strings live for the call; `err` is a valid out-pointer.
        let h = unsafe { tk_op_find(n.as_ptr(), o.as_ptr(), &mut err) };
        NonNull::new(h).map(OpHandle).ok_or_else(|| take_str(err))
    }

    /// The schema as the shim describes it (see `tk_op_schema`).
    pub(crate) fn schema_text(&self) -> Result<String, String> {
        let mut err: *mut c_char = ptr::null_mut();
        // SAFETY: `self.0` is a live OperatorHandle; `err` a valid out-pointer.
        let text = unsafe { tk_op_schema(self.0.as_ptr(), &mut err) };
        if text.is_null() {
            return Err(take_str(err));
        }
        Ok(take_str(text))
    }

    /// Calls the operator with `args` in schema order; returns its tensor
    /// results flattened (`None` for an undefined tensor or a None return).
    pub(crate) fn call(&self, args: &[Arg<'_>]) -> Result<Vec<Option<Tensor>>, String> {
        // Pointer arrays for list arguments, kept alive until the call returns.
        let mut lists: Vec<Vec<*const c_void>> = Vec::new();
        let mut bools: Vec<&[u8]> = Vec::new();
        for a in args {
            match a {
                Arg::TensorList(ts) => {
                    lists.push(ts.iter().map(|t| t.as_ptr() as *const c_void).collect())
                }
                Arg::OptTensorList(ts) => lists.push(
                    ts.iter()
                        .map(|t| t.map_or(ptr::null(), |t| t.as_ptr() as *const c_void))
                        .collect(),
                ),
                Arg::Bools(v) => bools.push(v),
                _ => {}
            }
        }
        let (mut li, mut bi) = (0, 0);
        let mut raw = Vec::with_capacity(args.len());
        for a in args {
            let mut r = RawArg {
                kind: 0,
                i: 0,
                j: -1,
                f: 0.0,
                p: ptr::null(),
                n: 0,
            };
            match a {
                Arg::Default => r.kind = 0,
                Arg::None => r.kind = 1,
                Arg::Tensor(t) => {
                    r.kind = 2;
                    r.p = t.as_ptr() as *const c_void;
                }
                Arg::TensorList(_) | Arg::OptTensorList(_) => {
                    r.kind = if matches!(a, Arg::TensorList(_)) {
                        3
                    } else {
                        4
                    };
                    r.p = lists[li].as_ptr() as *const c_void;
                    r.n = lists[li].len();
                    li += 1;
                }
                Arg::Int(v) => (r.kind, r.i) = (5, *v),
                Arg::Float(v) => (r.kind, r.f) = (6, *v),
                Arg::Bool(v) => (r.kind, r.i) = (7, i64::from(*v)),
                Arg::Ints(v) => (r.kind, r.p, r.n) = (8, v.as_ptr() as *const c_void, v.len()),
                Arg::Floats(v) => (r.kind, r.p, r.n) = (9, v.as_ptr() as *const c_void, v.len()),
                Arg::Bools(_) => {
                    (r.kind, r.p, r.n) = (10, bools[bi].as_ptr() as *const c_void, bools[bi].len());
                    bi += 1;
                }
                Arg::ScalarInt(v) => (r.kind, r.i) = (11, *v),
                Arg::ScalarFloat(v) => (r.kind, r.f) = (12, *v),
                Arg::ScalarBool(v) => (r.kind, r.i) = (13, i64::from(*v)),
                Arg::WrappedInt(v) => (r.kind, r.i) = (14, *v),
                Arg::WrappedFloat(v) => (r.kind, r.f) = (15, *v),
                Arg::WrappedBool(v) => (r.kind, r.i) = (16, i64::from(*v)),
                Arg::Str(s) => (r.kind, r.p, r.n) = (17, s.as_ptr() as *const c_void, s.len()),
                Arg::Dtype(v) => (r.kind, r.i) = (18, *v),
                Arg::MemoryFormat(v) => (r.kind, r.i) = (19, *v),
                Arg::Layout(v) => (r.kind, r.i) = (20, *v),
                Arg::Device(t, i) => (r.kind, r.i, r.j) = (21, *t, *i),
            }
            raw.push(r);
        }
        let mut outs: *mut *mut c_void = ptr::null_mut();
        let mut nouts = 0usize;
        let mut err: *mut c_char = ptr::null_mut();
        // SAFETY: `self.0` is a live OperatorHandle; every pointer in `raw`
        // points into `args` (tensors, slices, strings) or into `lists` /
        // `bools`, all alive until this call returns; the shim only reads
        // them and catches every C++ exception.
        let rc = unsafe {
            tk_op_call(
                self.0.as_ptr(),
                raw.as_ptr(),
                raw.len(),
                &mut outs,
                &mut nouts,
                &mut err,
            )
        };
        if rc != 0 {
            return Err(take_str(err));
        }
        let mut result = Vec::with_capacity(nouts);
        for k in 0..nouts {
            // SAFETY: on success `outs` holds `nouts` entries, each null or a
            // heap `at::Tensor*` we now own; `Tensor::from_ptr` takes that
            // ownership (tch frees it on drop). The array is freed once below.
            let t = unsafe { *outs.add(k) };
            result.push(if t.is_null() {
                None
            } else {
                // SAFETY: see above; `t` is a fresh, owned at::Tensor*.
                Some(unsafe { Tensor::from_ptr(t as *mut torch_sys::C_tensor) })
            });
        }
        // SAFETY: `outs` was malloc'd by the shim and is freed exactly once.
        unsafe { tk_free_outs(outs) };
        Ok(result)
    }
}
