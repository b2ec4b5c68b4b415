//! One row's attention over q8_0 key and value caches: the talker's steps
//! ([`crate::ffi::Context::attend_q8_row`]).
//!
//! A group is the query heads that share one key/value head. Each query head arrives already
//! rounded to q8_0 (by the caller, as ggml's flash attention rounds it); the scores are
//! `scale · q · k` over positions `0..n`, softmaxed per head, and each head's output is the
//! scores' weighted sum of the value rows. A key or value row is read once for the whole group.
//! The kernels sum in different orders, so they agree within float rounding, not to the bit
//! (`tests`: 1e-5 of the output's scale).

use super::Features;

/// Bytes of a q8_0 block (32 values).
pub const Q8_0_BLOCK: usize = crate::gguf::GgmlType::Q8_0.type_size() as usize;
/// The most query heads per key/value head.
pub const MAX_GROUP: usize = 8;
/// The widest head.
pub const MAX_HEAD_DIM: usize = 256;

/// An attention kernel: the outputs of the query heads `q` (q8_0 blocks, `d / 32` per head,
/// heads one after the other) over `n` positions of the key and value rows at `k` and `v`
/// (`row` bytes apart, each starting with this group's `d / 32` blocks), into `out` (`d` per
/// head); `scores` is the caller's scratch.
///
/// # Safety
/// `k` and `v` hold `n` rows `row` bytes apart as described; `q` holds whole heads of
/// `d / 32` blocks, at most [`MAX_GROUP`] of them; `d` is a multiple of 32 and at most
/// [`MAX_HEAD_DIM`]; `out` holds `d` values per head; the CPU has the kernel's features.
pub type GroupKernel = unsafe fn(
    q: &[u8],
    d: usize,
    kv: (*const u8, *const u8),
    row: usize,
    n: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
);

/// The kernel among `caps`.
pub fn kernel(caps: Features) -> GroupKernel {
    #[cfg(target_arch = "x86_64")]
    if caps.avx512 {
        return super::x86::avx512::attend_q8_group;
    }
    let _ = caps;
    attend_q8_group
}

/// The scalar kernel: the queries and each key and value block widened to f32.
///
/// # Safety
/// As [`GroupKernel`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_q8_group(
    q: &[u8],
    d: usize,
    (k, v): (*const u8, *const u8),
    row: usize,
    n: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let nb = d / 32;
    let group = q.len() / (nb * Q8_0_BLOCK);
    let mut qf = [[0f32; MAX_HEAD_DIM]; MAX_GROUP];
    for (h, qh) in qf[..group].iter_mut().enumerate() {
        for b in 0..nb {
            let mut blk = [0f32; 32];
            // SAFETY: block b of head h, inside `q`.
            unsafe { dequant_q8(q.as_ptr().add((h * nb + b) * Q8_0_BLOCK), &mut blk) };
            qh[32 * b..32 * b + 32].copy_from_slice(&blk);
        }
    }
    scores.clear();
    scores.resize(group * n, 0.0);
    let mut kf = [0f32; 32];
    for t in 0..n {
        let mut acc = [[0f32; 32]; MAX_GROUP];
        for b in 0..nb {
            // SAFETY: block b of this head's key row at position t (the caller's contract).
            unsafe { dequant_q8(k.add(t * row + b * Q8_0_BLOCK), &mut kf) };
            for (h, acc) in acc[..group].iter_mut().enumerate() {
                let qb = &qf[h][b * 32..][..32];
                for i in 0..32 {
                    acc[i] += kf[i] * qb[i];
                }
            }
        }
        for (h, acc) in acc[..group].iter().enumerate() {
            scores[h * n + t] = sum32(acc) * scale;
        }
    }
    softmax_rows(scores, n);
    out.fill(0.0);
    for t in 0..n {
        for b in 0..nb {
            // SAFETY: block b of this head's value row at position t (the caller's contract).
            unsafe { dequant_q8(v.add(t * row + b * Q8_0_BLOCK), &mut kf) };
            for h in 0..group {
                let w = scores[h * n + t];
                let o = &mut out[h * d + b * 32..][..32];
                for i in 0..32 {
                    o[i] += w * kf[i];
                }
            }
        }
    }
}

/// Each row of `n` scores (one row a query head) as its softmax, in place.
pub(crate) fn softmax_rows(scores: &mut [f32], n: usize) {
    for s in scores.chunks_exact_mut(n) {
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0f32;
        for x in s.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        for x in s.iter_mut() {
            *x *= inv;
        }
    }
}

/// The scale of the q8_0 block at `p` (its first two bytes, an f16).
///
/// # Safety
/// `p` points at a whole q8_0 block.
#[inline(always)]
pub(crate) unsafe fn q8_scale(p: *const u8) -> f32 {
    // SAFETY: the caller's block starts with its scale.
    half::f16::from_bits(unsafe { u16::from_le_bytes([*p, *p.add(1)]) }).to_f32()
}

/// The 32 values of the q8_0 block at `p`.
///
/// # Safety
/// `p` points at a whole q8_0 block.
#[inline(always)]
unsafe fn dequant_q8(p: *const u8, out: &mut [f32; 32]) {
    // SAFETY: the caller's block: 2 bytes of f16 scale, 32 values.
    let (scale, qs) = unsafe {
        (
            q8_scale(p),
            std::slice::from_raw_parts(p.add(2) as *const i8, 32),
        )
    };
    for (o, &x) in out.iter_mut().zip(qs) {
        *o = x as f32 * scale;
    }
}

/// `Σ a` as a tree of lanes (so that it vectorizes, where a running sum would chain 32 adds).
#[inline(always)]
fn sum32(a: &[f32; 32]) -> f32 {
    let mut s = [0f32; 16];
    for i in 0..16 {
        s[i] = a[i] + a[i + 16];
    }
    for w in [8, 4, 2, 1] {
        for i in 0..w {
            s[i] += s[i + w];
        }
    }
    s[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;

    /// Every tier's kernel against the scalar one, on a talker-sized group (two query heads of
    /// 128 over 40 positions), within 1e-5 of the outputs' scale: the same values summed in
    /// other orders.
    #[test]
    fn every_tier_s_kernel_is_the_scalar_one_within_rounding() {
        let (d, group, n) = (128usize, 2usize, 40usize);
        let val = |i: usize| ((i * 7919 % 2003) as f32 / 1001.5) - 1.0;
        let row_f: Vec<f32> = (0..n * d).map(|i| val(i + 5)).collect();
        let caches = |off: usize| {
            let f: Vec<f32> = row_f
                .iter()
                .enumerate()
                .map(|(i, _)| val(i + off))
                .collect();
            crate::ffi::quantize(GgmlType::Q8_0, &f, d).unwrap()
        };
        let (k, v) = (caches(11), caches(777));
        let qf: Vec<f32> = (0..group * d).map(|i| val(3 * i + 1)).collect();
        let q = crate::ffi::quantize(GgmlType::Q8_0, &qf, d).unwrap();
        let row = d / 32 * Q8_0_BLOCK;
        let run = |kernel: GroupKernel| {
            let (mut scores, mut out) = (Vec::new(), vec![0f32; group * d]);
            // SAFETY: n rows of `row` bytes in each cache, whole q8_0 heads, d ≤ 256; the
            // kernel comes from `kernel(caps)` for a tier this CPU runs.
            unsafe {
                kernel(
                    &q,
                    d,
                    (k.as_ptr(), v.as_ptr()),
                    row,
                    n,
                    0.1,
                    &mut scores,
                    &mut out,
                )
            };
            out
        };
        let want = run(attend_q8_group);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.01, "{scale}");
        crate::kernels::for_each_tier(|tier| {
            let got = run(kernel(tier.caps()));
            let e = want
                .iter()
                .zip(&got)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(e <= 1e-5 * scale, "{tier}: {e} of {scale}");
        });
    }
}
