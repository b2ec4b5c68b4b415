//! The decoder's convolutions as one matrix product per node, with their epilogues (bias,
//! residual, SnakeBeta) fused.

use super::thread_share;
use crate::ffi::{sys, Context, GgmlError, Tensor};
use crate::gguf::GgmlType;
use crate::kernels::{bf16, int8, panel};

/// The largest tap count and dilation [`Context::conv_gemm`] takes: both travel in the op's
/// `userdata` word, 14 bits each, beside the epilogue's two flags.
const CONV_GEMM_MAX: usize = (1 << 14) - 1;
/// `userdata` flag of [`Context::conv_gemm_then`]: a bias is the node's next source.
const CONV_GEMM_BIAS: usize = 1 << 28;
/// `userdata` flag of [`Context::conv_gemm_then`]: a residual is the node's last source.
const CONV_GEMM_RESIDUAL: usize = 1 << 29;
/// `userdata` flag of [`Context::conv_gemm_by`]: a bf16 kernel runs on AVX-512 BF16 (else on
/// AMX tiles).
const CONV_GEMM_AVX512_BF16: usize = 1 << 30;
/// `userdata` flag of [`Context::conv_gemm_panel`]: the f32 kernel is packed in panels
/// ([`panel::pack`]), computed by the process's tier's [`panel::Kernel`].
const CONV_GEMM_PANEL: usize = 1 << 31;

/// What computes a [`Context::conv_gemm_by`] node, by the kernel matrix's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Storage {
    /// f32 as `[taps · c_in, c_out]`: `matrixmultiply`'s sgemm.
    F32,
    /// bf16 tiles ([`bf16::pack`]) for this kernel (or none available).
    Bf16(Option<bf16::Kernel>),
    /// f32 panels ([`panel::pack`]).
    Panel,
    /// 8-bit integers ([`int8::pack`], an `i8` tensor).
    Int8,
}

/// What [`Context::conv_gemm_then`] adds to the product's rows as each part is stored: the bias,
/// then the residual.
struct Epilogue {
    /// `bias_len` values; column `c` adds `bias[c % bias_len]`. Null: none.
    bias: *const f32,
    bias_len: usize,
    /// The contiguous rows of the residual, as many and as long as the output's. Null: none.
    residual: *const f32,
}

impl Epilogue {
    /// Adds the bias, then the residual, to rows `rows` and columns `cols` of `y` (rows of `n`),
    /// in place; nothing when there is neither.
    ///
    /// # Safety
    /// `y` holds those rows, the bias `bias_len` values and the residual rows as long as `y`'s;
    /// no one else writes them during the call.
    unsafe fn apply(
        &self,
        y: *mut f32,
        n: usize,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
    ) {
        if self.bias.is_null() && self.residual.is_null() {
            return;
        }
        // SAFETY: `bias_len` values at `bias` when it is not null.
        let bias = (!self.bias.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(self.bias, self.bias_len) });
        for t in rows {
            // SAFETY: the caller's contract; `cols` lies within the row.
            let out =
                unsafe { std::slice::from_raw_parts_mut(y.add(t * n + cols.start), cols.len()) };
            // SAFETY: the residual's row t, as long as `y`'s, when it is not null.
            let res = (!self.residual.is_null()).then(|| unsafe {
                std::slice::from_raw_parts(self.residual.add(t * n + cols.start), out.len())
            });
            let Some(bias) = bias else {
                for (o, v) in out.iter_mut().zip(res.unwrap_or_default()) {
                    *o += v;
                }
                continue;
            };
            // Runs of columns that do not wrap around the bias, each taking the bias and the
            // residual in one pass, in the order of two adds.
            let (mut c, mut done) = (cols.start, 0);
            while done < out.len() {
                let b = c % bias.len();
                let run = (out.len() - done).min(bias.len() - b);
                let (o, bv) = (&mut out[done..done + run], &bias[b..b + run]);
                match res {
                    Some(r) => {
                        for ((o, b), r) in o.iter_mut().zip(bv).zip(&r[done..done + run]) {
                            *o = (*o + b) + r;
                        }
                    }
                    None => {
                        for (o, b) in o.iter_mut().zip(bv) {
                            *o += b;
                        }
                    }
                }
                (c, done) = (c + run, done + run);
            }
        }
    }
}

/// ggml's side of [`Context::conv_gemm`]: an f32 kernel splits the output rows over the graph's
/// threads, each thread one `sgemm` per tap (one in all when the taps are adjacent); a bf16 kernel
/// splits the 32 × 32 output blocks of [`bf16::conv`]. Each thread adds the epilogue to its own
/// rows or blocks.
///
/// # Safety
/// Called by ggml only, on every thread of the graph computing the node this module built: `dst`
/// is that node, its sources and `userdata` are what the builder put there, and thread `ith` of
/// `nth` writes only its own share of `dst`.
unsafe extern "C" fn conv_gemm_trampoline(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    userdata: *mut std::os::raw::c_void,
) {
    let word = userdata as usize;
    let (taps, dilation) = ((word >> 14) & CONV_GEMM_MAX, word & CONV_GEMM_MAX);
    // SAFETY: `conv_gemm_then` built this node: its sources are the contiguous kernel
    // `[taps · c_in, c_out]` (f32, or bf16 packed by `bf16::pack` when a bf16 kernel is available and the
    // shape fits), the f32 input `[c_in, t_out + (taps − 1) · dilation]`, then, as the word's
    // flags say, the contiguous f32 bias (a length dividing `c_out`) and the contiguous f32
    // residual `[c_out, t_out]`; `dst` is a fresh contiguous f32 `[c_out, t_out]` (ggml never
    // computes a custom op in place), all allocated by the time ggml computes the node. Every
    // read stays inside the input: row `t + j · dilation` for `t < t_out` and `j < taps`, `c_in`
    // values long.
    unsafe {
        let (w, x) = ((*dst).src[0], (*dst).src[1]);
        let c_in = (*x).ne[0] as usize;
        let (c_out, t_out) = ((*dst).ne[0] as usize, (*dst).ne[1] as usize);
        let mut next = 2;
        let mut epilogue = Epilogue {
            bias: std::ptr::null(),
            bias_len: 1,
            residual: std::ptr::null(),
        };
        if word & CONV_GEMM_BIAS != 0 {
            let b = (*dst).src[next];
            (epilogue.bias, epilogue.bias_len) = ((*b).data as *const f32, (*b).ne[0] as usize);
            next += 1;
        }
        if word & CONV_GEMM_RESIDUAL != 0 {
            epilogue.residual = (*(*dst).src[next]).data as *const f32;
        }
        let y = (*dst).data as *mut f32;
        let s = bf16::Conv {
            c_in,
            taps,
            dilation,
            t_out,
            n: c_out,
        };
        if word & CONV_GEMM_PANEL != 0 {
            // `conv_gemm_panel` built the node only with a kernel available.
            let Some(kernel) = panel::Kernel::active() else {
                return;
            };
            let share = thread_share(panel::blocks(t_out, c_out), ith, nth);
            let then = |rows, cols| epilogue.apply(y, c_out, rows, cols);
            let x = (*x).data as *const f32;
            if (*w).type_ == sys::GGML_TYPE_F16 {
                // `conv_gemm_panel` built an f16 node only for a kernel that reads f16.
                panel::conv_f16(kernel, (*w).data as *const u16, x, y, s, share, then);
            } else {
                panel::conv(kernel, (*w).data as *const f32, x, y, s, share, then);
            }
            return;
        }
        if (*w).type_ == sys::GGML_TYPE_I8 {
            // `conv_gemm_int8` checked the shapes; the scalar twin where no vector kernel is.
            let kernel = int8::Kernel::active().unwrap_or(int8::Kernel::Scalar);
            int8::conv(
                kernel,
                (*w).data as *const u8,
                (*x).data as *const f32,
                y,
                s,
                thread_share(int8::blocks(t_out, c_out), ith, nth),
                |rows, cols| epilogue.apply(y, c_out, rows, cols),
            );
            return;
        }
        if (*w).type_ == sys::GGML_TYPE_BF16 {
            // `conv_gemm_by` built a bf16 node only with the kernel available.
            let kernel = if word & CONV_GEMM_AVX512_BF16 != 0 {
                bf16::Kernel::Avx512
            } else {
                bf16::Kernel::Amx
            };
            bf16::conv(
                kernel,
                (*w).data as *const u16,
                (*x).data as *const f32,
                y,
                s,
                thread_share(bf16::blocks(t_out, c_out), ith, nth),
                |rows, cols| epilogue.apply(y, c_out, rows, cols),
            );
            return;
        }
        let (r0, r1) = thread_share(t_out, ith, nth);
        if r0 == r1 {
            return;
        }
        if c_out == 1 && dilation == 1 {
            // One output column (the DAC's post-conv: 96 channels to the waveform): output row
            // `t` is the dot product of the `taps · c_in` consecutive input values from row `t`
            // with the kernel's column, in `dot::Kernel`'s fixed order, which does not depend on
            // the rows or threads either. sgemm packs more than it multiplies for one column.
            let k = taps * c_in;
            let dot = crate::kernels::dot::Kernel::active();
            let wv = std::slice::from_raw_parts((*w).data as *const f32, k);
            let x = (*x).data as *const f32;
            for t in r0..r1 {
                *y.add(t) = dot.dot(std::slice::from_raw_parts(x.add(t * c_in), k), wv);
            }
            epilogue.apply(y, c_out, r0..r1, 0..c_out);
            return;
        }
        let xs = ((*x).data as *const f32).add(r0 * c_in);
        let ws = (*w).data as *const f32;
        let ys = y.add(r0 * c_out);
        let k = taps * c_in;
        // Row t of the product reads input rows t..t + taps (dilation 1): `taps · c_in`
        // consecutive values, so one product whose left rows overlap covers every tap.
        let per_tap = if dilation == 1 { taps } else { 1 };
        // A panic must not unwind into ggml; sgemm does not panic on these sizes, and a caught
        // one leaves the output rows unfinished.
        let _ = std::panic::catch_unwind(|| {
            for j in (0..taps).step_by(per_tap) {
                matrixmultiply::sgemm(
                    r1 - r0,
                    per_tap * c_in,
                    c_out,
                    1.0,
                    xs.add(j * dilation * c_in),
                    c_in as isize,
                    1,
                    ws.add(j * c_in),
                    1,
                    k as isize,
                    if j == 0 { 0.0 } else { 1.0 },
                    ys,
                    c_out as isize,
                    1,
                );
            }
        });
        epilogue.apply(y, c_out, r0..r1, 0..c_out);
    }
}

impl Context {
    /// The causal 1-D convolution of `x` (`[c_in, t]`, channels fastest, f32) by the kernel `w`
    /// (`[taps · c_in, c_out]`, f32, index `c + c_in · j` for channel `c` and tap `j`) with
    /// `dilation`, unpadded: `[c_out, t − (taps − 1) · dilation]`. With one tap it is
    /// `mul_mat(w, x)`. Computed by `matrixmultiply`'s packed sgemm instead of ggml's `im2col`
    /// and `mul_mat`; each output value sums its products in the same order whatever the row
    /// count and thread count, so results do not depend on how a signal is chunked.
    ///
    /// A bf16 kernel (`[taps · c_in, c_out]` packed by [`bf16::pack`], where the process's tier
    /// has a [`bf16::Kernel`] and [`bf16::fits`]`(c_in, c_out)`) is computed by that kernel (AMX
    /// tiles or AVX-512 BF16 dot products) from a bf16 copy of the input:
    /// not exact (bf16 keeps 8 significant bits), also independent of the chunking.
    pub fn conv_gemm<'a>(
        &'a self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        taps: usize,
        dilation: usize,
    ) -> Result<Tensor<'a>, GgmlError> {
        self.conv_gemm_then(w, x, taps, dilation, None, None)
    }

    /// [`Context::conv_gemm`], then `+ bias` (contiguous f32 of a length `b` dividing `c_out`:
    /// column `c` adds `bias[c % b]`) and `+ residual` (contiguous f32 `[c_out, t_out]`), without
    /// ggml's two passes over the output: they are added to each part of the output (a thread's
    /// rows, or an AMX block) as it is stored, while it is in cache. The same values, bit for
    /// bit, as the product followed by ggml's `add` of the bias and then of the residual.
    pub fn conv_gemm_then<'a>(
        &'a self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        taps: usize,
        dilation: usize,
        bias: Option<Tensor<'a>>,
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        self.conv_gemm_by(bf16::Kernel::active(), w, x, taps, dilation, bias, residual)
    }

    /// [`Context::conv_gemm_then`] with a bf16 weight computed by `kernel` (the benches' and
    /// tests' way to compare the bf16 kernels in one process; `conv_gemm_then` takes the
    /// process's tier's). An f32 weight ignores `kernel`.
    #[allow(clippy::too_many_arguments)]
    pub fn conv_gemm_by<'a>(
        &'a self,
        kernel: Option<bf16::Kernel>,
        w: Tensor<'a>,
        x: Tensor<'a>,
        taps: usize,
        dilation: usize,
        bias: Option<Tensor<'a>>,
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        let storage = if w.is_type(GgmlType::BF16) {
            Storage::Bf16(kernel)
        } else {
            Storage::F32
        };
        self.conv_gemm_stored(storage, w, x, taps, dilation, bias, residual)
    }

    /// [`Context::conv_gemm_then`] with the kernel matrix `w` in f32 panels ([`panel::pack`] of
    /// the `[taps · c_in, c_out]` matrix, `c_out` a multiple of [`panel::BLOCK`]), or in f16
    /// panels ([`panel::pack_f16`], an f16 tensor) where the kernel reads them, computed by
    /// the process's tier's [`panel::Kernel`]: exact f32 (one fused multiply-add chain per output,
    /// in the order [`panel`] fixes; f16 weights widened exactly), no packing per call, so it
    /// pays on products of any row count. An error on a tier without one (scalar).
    pub fn conv_gemm_panel<'a>(
        &'a self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        taps: usize,
        dilation: usize,
        bias: Option<Tensor<'a>>,
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        self.conv_gemm_stored(Storage::Panel, w, x, taps, dilation, bias, residual)
    }

    /// [`Context::conv_gemm_then`] with the kernel matrix `w` quantized to 8 bits
    /// ([`int8::pack`] of the `[taps · c_in, c_out]` matrix: an `i8` tensor
    /// `[`[`int8::packed_len`]` / c_out, c_out]`), computed by the process's tier's
    /// [`int8::Kernel`] (its scalar twin where the tier has none) from an 8-bit copy of the
    /// input: not exact (see [`int8`]), independent of the chunking and the thread count.
    pub fn conv_gemm_int8<'a>(
        &'a self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        taps: usize,
        dilation: usize,
        bias: Option<Tensor<'a>>,
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        self.conv_gemm_stored(Storage::Int8, w, x, taps, dilation, bias, residual)
    }

    #[allow(clippy::too_many_arguments)]
    fn conv_gemm_stored<'a>(
        &'a self,
        storage: Storage,
        w: Tensor<'a>,
        x: Tensor<'a>,
        taps: usize,
        dilation: usize,
        bias: Option<Tensor<'a>>,
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        if storage == Storage::Panel {
            let kernel = panel::Kernel::active();
            // f16 panels where the kernel reads them; f32 otherwise.
            if !(w.is_type(GgmlType::F16) && kernel.is_some_and(panel::Kernel::reads_f16)) {
                Self::dense_f32("conv_gemm panel kernel", w)?;
            }
            // SAFETY: the tensor is live; the contiguity test reads only its shape and strides.
            let dense = unsafe { sys::ggml_is_contiguous(w.ptr.as_ptr()) };
            if kernel.is_none() || !panel::fits(w.ne()[1]) || !dense {
                return Err(GgmlError::Shape {
                    what: "conv_gemm panel kernel",
                    expected: format!(
                        "a contiguous kernel packed by panel::pack (or pack_f16 where the panel \
                         kernel reads f16), c_out a multiple of {}, on a kernel tier with AVX2 \
                         and FMA or AVX-512 (else an unpacked f32 kernel)",
                        panel::BLOCK
                    ),
                    found: format!(
                        "kernel {:?}, contiguous {dense}, panel kernel {kernel:?}",
                        w.ne()
                    ),
                });
            }
        }
        if let Storage::Bf16(kernel) = storage {
            // SAFETY: the tensor is live; the contiguity test reads only its shape and strides.
            let dense = unsafe { sys::ggml_is_contiguous(w.ptr.as_ptr()) };
            let usable = kernel.is_some_and(bf16::Kernel::available);
            if !usable || !dense || !bf16::fits(x.ne()[0], w.ne()[1]) {
                return Err(GgmlError::Shape {
                    what: "conv_gemm bf16 kernel",
                    expected: "a contiguous kernel packed by bf16::pack, c_in a multiple of 32, \
                               c_out of 32, on a kernel tier with AMX-BF16 or AVX-512 BF16 (else \
                               an f32 kernel)"
                        .into(),
                    found: format!(
                        "kernel {:?}, contiguous {dense}, input {:?}, bf16 kernel {kernel:?}",
                        w.ne(),
                        x.ne(),
                    ),
                });
            }
        } else if storage == Storage::F32 {
            Self::dense_f32("conv_gemm kernel", w)?;
        }
        Self::dense_f32("conv_gemm input", x)?;
        let (mut nw, nx) = (w.ne(), x.ne());
        if storage == Storage::Int8 {
            // SAFETY: the tensor is live; the contiguity test reads only its shape and strides.
            let dense = unsafe { sys::ggml_is_contiguous(w.ptr.as_ptr()) };
            let (c_in, n) = (nx[0], nw[1]);
            let rows = taps.max(1) * c_in + 8 * taps.max(1) * int8::runs(c_in);
            if !w.is_type(GgmlType::I8) || !dense || !int8::fits(c_in, n) || nw[0] != rows {
                return Err(GgmlError::Shape {
                    what: "conv_gemm int8 kernel",
                    expected: format!(
                        "a contiguous i8 kernel packed by int8::pack, [{rows}, c_out], c_in a \
                         multiple of {}, c_out of {}",
                        int8::GROUP,
                        int8::BLOCK
                    ),
                    found: format!(
                        "kernel {nw:?}, i8 {}, contiguous {dense}, input {nx:?}",
                        w.is_type(GgmlType::I8)
                    ),
                });
            }
            // The product's own shape, as the checks below take it.
            nw[0] = taps * c_in;
        }
        let span = taps.saturating_sub(1) * dilation;
        if taps == 0
            || dilation == 0
            || taps > CONV_GEMM_MAX
            || dilation > CONV_GEMM_MAX
            || nw[0] != taps * nx[0]
            || nw[2] != 1
            || nw[3] != 1
            || nx[2] != 1
            || nx[3] != 1
            || nx[1] <= span
        {
            return Err(GgmlError::Shape {
                what: "conv_gemm",
                expected: format!(
                    "kernel [{taps} · c_in, c_out], input [c_in, t > {span}], \
                     1 <= taps, dilation <= {CONV_GEMM_MAX}"
                ),
                found: format!("kernel {nw:?}, input {nx:?}, taps {taps}, dilation {dilation}"),
            });
        }
        let (c_out, t_out) = (nw[1], nx[1] - span);
        let mut args = vec![w, x];
        let mut word = (taps << 14) | dilation;
        match storage {
            Storage::Bf16(Some(bf16::Kernel::Avx512)) => word |= CONV_GEMM_AVX512_BF16,
            Storage::Panel => word |= CONV_GEMM_PANEL,
            _ => {}
        }
        if let Some(b) = bias {
            Self::dense_f32("conv_gemm bias", b)?;
            let len = b.n_elems();
            if len == 0 || c_out % len != 0 {
                return Err(GgmlError::Shape {
                    what: "conv_gemm bias",
                    expected: format!("a length dividing the {c_out} output columns"),
                    found: format!("{:?}", b.ne()),
                });
            }
            args.push(b);
            word |= CONV_GEMM_BIAS;
        }
        if let Some(r) = residual {
            Self::dense_f32("conv_gemm residual", r)?;
            if r.n_elems() != c_out * t_out {
                return Err(GgmlError::Shape {
                    what: "conv_gemm residual",
                    expected: format!("{c_out} × {t_out} values, as the product"),
                    found: format!("{:?}", r.ne()),
                });
            }
            args.push(r);
            word |= CONV_GEMM_RESIDUAL;
        }
        // SAFETY: the tensors are live, contiguous f32 and shaped as the trampoline expects
        // (checked above); the word's flags name the sources after the first two.
        unsafe {
            self.custom_f32(
                [c_out, t_out, 1, 1],
                &args,
                conv_gemm_trampoline,
                word as *mut std::os::raw::c_void,
            )
        }
    }
}
