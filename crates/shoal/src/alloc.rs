//! The process's allocator: mimalloc, entered through its plain `mi_malloc` for the common
//! alignments.
//!
//! mimalloc instead of glibc's malloc: the broker allocates and frees small buffers per request
//! (frames, headers, answers) on several threads; with 16 sends in flight per producer glibc's
//! malloc/free took 30% of the broker's CPU. Measured A/B (docs/benchmarks.md, "Settings that
//! were measured"): broker CPU per message 4-13% lower pipelined and batched (unchanged at 1 in
//! flight), the client's (`shoal bench`) 4-24% lower.
//!
//! The `mimalloc` crate's allocator calls `mi_malloc_aligned` for every allocation, whose path
//! (an alignment check, a page whose next free block must happen to be aligned, else a generic
//! fallback) cost about 65 instructions per allocation here. Every mimalloc block is at least
//! word-aligned (block sizes are multiples of a word, pages start aligned), so an alignment of
//! up to 8 bytes (strings, buffers, boxes, `Arc`s, futures: nearly every allocation) goes to
//! `mi_malloc`; larger alignments (cache-padded runtime structures) keep the aligned entry
//! points. Frees go to `mi_free` either way.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

/// Alignment every mimalloc block has (a word).
const BLOCK_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc, with `mi_malloc` for alignments it always meets.
pub(crate) struct Mimalloc;

#[allow(unsafe_code)]
// SAFETY: every pointer returned comes from mimalloc with at least `layout`'s size and
// alignment (`mi_malloc`/`mi_zalloc`/`mi_realloc` blocks are word-aligned, and larger alignments
// use the aligned entry points), and every pointer freed or reallocated was returned by this
// allocator (mimalloc frees blocks from either entry point with `mi_free`).
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= BLOCK_ALIGN {
            // SAFETY: see the impl.
            unsafe { mi_malloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: see the impl.
            unsafe { mi_malloc_aligned(layout.size(), layout.align()) as *mut u8 }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= BLOCK_ALIGN {
            // SAFETY: see the impl.
            unsafe { mi_zalloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: see the impl.
            unsafe { mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8 }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: see the impl.
        unsafe { mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= BLOCK_ALIGN {
            // SAFETY: see the impl.
            unsafe { mi_realloc(ptr as *mut c_void, new_size) as *mut u8 }
        } else {
            // SAFETY: see the impl.
            unsafe { mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8 }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_have_their_alignment_and_keep_their_bytes() {
        let a = Mimalloc;
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in [1usize, 7, 8, 9, 24, 40, 56, 100, 1000, 70_000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                #[allow(unsafe_code)]
                // SAFETY: non-zero sizes; each pointer is used within its layout and freed once.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    std::ptr::write_bytes(p, 0xA5, size);
                    let q = a.realloc(p, layout, size * 3);
                    assert_eq!(q as usize % align, 0, "realloc: size {size} align {align}");
                    assert!((0..size).all(|i| *q.add(i) == 0xA5));
                    a.dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0);
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
