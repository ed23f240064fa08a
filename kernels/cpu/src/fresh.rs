//! Output buffers without a zero fill.
//!
//! `vec![0f32; n]` for a kernel's output writes every element twice: the allocator's zeros (a
//! `memset`), then the kernel's values. At the tiny training shape those zero fills were ~3.5% of
//! a forward+backward and ~3% of generation (benches/RESULTS.md's git history), for outputs
//! that every kernel here writes whole before anything reads them. The buffers here are left
//! unwritten instead: the kernels write them as `MaybeUninit<f32>` (never reading an unwritten
//! element), and [`assume_written`] makes the vector of f32 once every element is.
//!
//! Debug builds (the test suite) fill a fresh buffer with NaN: an element a kernel failed to write
//! would show as NaN in the tests' results, where release builds would leave it to chance.

use std::mem::{ManuallyDrop, MaybeUninit};

/// `len` elements for a kernel to write: unwritten in release builds, NaN in debug builds.
pub(crate) fn unwritten(len: usize) -> Vec<MaybeUninit<f32>> {
    if cfg!(debug_assertions) {
        return vec![MaybeUninit::new(f32::NAN); len];
    }
    let mut v = Vec::with_capacity(len);
    // `MaybeUninit` needs no initialisation: the capacity's elements are valid as they are.
    v.resize_with(len, MaybeUninit::uninit);
    v
}

/// Every element of `dst` written 0, and `dst` as the f32s it now holds: the start of a sum.
pub(crate) fn zeroed(dst: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    for d in dst.iter_mut() {
        d.write(0.0);
    }
    written_slice(dst)
}

/// `src` copied into `dst` (of the same length; a longer `dst` keeps its tail unwritten).
pub(crate) fn write_copy(dst: &mut [MaybeUninit<f32>], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(s);
    }
}

/// `v`'s lanes written into `dst`, which must be exactly one vector long (checked: a wrong
/// length is a bug of the caller's, and panics rather than write past `dst`).
#[inline(always)]
#[allow(unsafe_code)] // an unaligned store of a plain vector type
pub(crate) fn store<S: pulp::Simd>(dst: &mut [MaybeUninit<f32>], v: S::f32s) {
    assert!(
        dst.len() == S::F32_LANES && size_of::<S::f32s>() == size_of_val(dst),
        "fresh::store: a vector of {} lanes into {} elements",
        S::F32_LANES,
        dst.len()
    );
    // SAFETY: `dst` is exactly the vector's size (checked above), writable (a unique borrow),
    // and `write_unaligned` needs no alignment; `S::f32s` is plain data (f32 lanes).
    unsafe { dst.as_mut_ptr().cast::<S::f32s>().write_unaligned(v) }
}

/// A slice every element of which [`zeroed`] has just written, as f32s.
#[allow(unsafe_code)] // a cast between layouts that are the same
fn written_slice(dst: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: `MaybeUninit<f32>` has f32's size and alignment, and the only caller wrote every
    // element of `dst` before this.
    unsafe { &mut *(std::ptr::from_mut(dst) as *mut [f32]) }
}

/// The buffer as the f32s it holds.
///
/// # Safety
/// Every element of `v` was written (or `v` came from [`unwritten`] in a debug build).
#[allow(unsafe_code)] // a cast between layouts that are the same
pub(crate) unsafe fn assume_written(v: Vec<MaybeUninit<f32>>) -> Vec<f32> {
    let mut v = ManuallyDrop::new(v);
    let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
    // SAFETY: the allocation is `v`'s, handed over whole (ManuallyDrop: not freed twice), with
    // the same size and alignment of element; the caller vouches that every element is written.
    unsafe { Vec::from_raw_parts(ptr.cast::<f32>(), len, cap) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_writes_every_element() {
        let mut buf = unwritten(5);
        assert_eq!(zeroed(&mut buf), &[0.0; 5]);
        // SAFETY: zeroed wrote all five.
        #[allow(unsafe_code)]
        let v = unsafe { assume_written(buf) };
        assert_eq!(v, [0.0; 5]);
    }

    // Reads an element left unwritten: only where debug builds have poisoned it.
    #[cfg(debug_assertions)]
    #[test]
    fn write_copy_copies_and_debug_builds_poison_the_rest() {
        let mut buf = unwritten(3);
        write_copy(&mut buf[..2], &[4.0, 5.0]);
        // SAFETY: debug builds (the tests) fill a fresh buffer with NaN.
        #[allow(unsafe_code)]
        let v = unsafe { assume_written(buf) };
        assert_eq!(&v[..2], &[4.0, 5.0]);
        assert!(
            v[2].is_nan(),
            "an unwritten element shows as NaN in debug builds"
        );
    }
}
