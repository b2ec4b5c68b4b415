//! aarch64 Advanced SIMD kernels: the heads' dot products ([`crate::kernels::dot`]).

use std::arch::aarch64::*;

use crate::kernels::dot::LANES;

/// The 64 lanes of [`crate::kernels::dot`]'s order, sixteen registers of 4.
///
/// # Safety
/// The CPU has NEON; `a.len() == b.len()` is a multiple of 64.
#[target_feature(enable = "neon")]
pub unsafe fn dot_lanes(a: &[f32], b: &[f32], lanes: &mut [f32; LANES]) {
    // SAFETY: every load reads 4 floats below len (a multiple of 64).
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 16];
        for i in (0..a.len()).step_by(LANES) {
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = vld1q_f32(a.as_ptr().add(i + 4 * r));
                let y = vld1q_f32(b.as_ptr().add(i + 4 * r));
                *acc = vfmaq_f32(*acc, x, y);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            vst1q_f32(lanes.as_mut_ptr().add(4 * r), *acc);
        }
    }
}
