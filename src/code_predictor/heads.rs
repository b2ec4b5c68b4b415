//! The 15 sample heads on the host: `logits = W · h` for a 2048 × width matrix.
//!
//! f32 heads are exact; q8_0 heads take a quarter of the memory traffic. Both multiply by
//! [`crate::kernels::dot`]'s kernels, whose fixed summation order gives the same logits on every
//! kernel tier. Packed q8_0 heads ([`Heads::to_packed`]) multiply by the tier's packed q8_0
//! kernel instead ([`crate::kernels::quant`]): several times faster, the input quantized to int8
//! as the layers' is, again the same logits on every tier. Nothing here allocates;
//! [`Heads::logits`] writes into the caller's buffer.

pub use crate::kernels::dot::{BlockQ8, Kernel};
use crate::kernels::quant::{self, q8_0, QType};

/// How the heads' weights are stored on the host.
#[derive(Debug, Clone)]
pub enum HeadWeights {
    /// f32 rows (exact).
    F32(Vec<f32>),
    /// q8_0 rows: a quarter of the memory traffic, logits within quantization error.
    Q8(Vec<BlockQ8>),
    /// q8_0 rows packed for the tier's packed q8_0 kernel (the input quantized to int8 as the
    /// layers' is): several times faster (see [`Heads::to_packed`]).
    Q8Packed(std::rc::Rc<Vec<u8>>),
}

/// The 15 heads on the host.
#[derive(Debug, Clone)]
pub struct Heads {
    weights: HeadWeights,
    n_codes: usize,
    width: usize,
    kernel: Kernel,
}

impl Heads {
    /// f32 heads from `weights` (`groups × n_codes × width`, row-major) using `kernel`.
    pub fn new(weights: Vec<f32>, n_codes: usize, width: usize, kernel: Kernel) -> Self {
        Heads {
            weights: HeadWeights::F32(weights),
            n_codes,
            width,
            kernel,
        }
    }

    /// q8_0 heads from ggml's q8_0 encoding (34-byte blocks: f16 scale, 32 × i8), rows of
    /// `width` values (a multiple of 32).
    pub fn from_q8_bytes(bytes: &[u8], n_codes: usize, width: usize, kernel: Kernel) -> Self {
        let blocks = bytes
            .chunks_exact(34)
            .map(|c| {
                let mut q = [0i8; 32];
                for (d, s) in q.iter_mut().zip(&c[2..]) {
                    *d = *s as i8;
                }
                BlockQ8 {
                    d: half::f16::from_le_bytes([c[0], c[1]]).to_f32(),
                    q,
                }
            })
            .collect();
        Heads {
            weights: HeadWeights::Q8(blocks),
            n_codes,
            width,
            kernel,
        }
    }

    /// These heads stored as q8_0 (ggml's quantizer), when the width is a multiple of 32.
    pub fn to_q8(&self) -> Option<Heads> {
        let HeadWeights::F32(w) = &self.weights else {
            return Some(self.clone());
        };
        if !self.width.is_multiple_of(32) {
            return None;
        }
        let bytes = crate::ffi::quantize(crate::gguf::GgmlType::Q8_0, w, self.width).ok()?;
        Some(Self::from_q8_bytes(
            &bytes,
            self.n_codes,
            self.width,
            self.kernel,
        ))
    }

    /// These q8_0 heads packed for the process's tier's packed q8_0 kernel, when it has one and
    /// the shape packs ([`quant::fits`]); `None` otherwise, and for f32 heads (which stay exact).
    pub fn to_packed(&self) -> Option<Heads> {
        let HeadWeights::Q8(blocks) = &self.weights else {
            return None;
        };
        quant::packed_kernel(QType::Q8_0, crate::kernels::caps())?;
        if !quant::fits(QType::Q8_0, self.n_codes, self.width) {
            return None;
        }
        use q8_0::{BLOCK, BLOCK_BYTES};
        let mut bytes = Vec::with_capacity(blocks.len() * BLOCK_BYTES);
        for b in blocks {
            bytes.extend(half::f16::from_f32(b.d).to_le_bytes());
            bytes.extend(b.q.iter().map(|&q| q as u8));
        }
        let row_bytes = self.width / BLOCK * BLOCK_BYTES;
        let rows = bytes.len() / row_bytes;
        q8_0::pack(&mut bytes, rows, row_bytes);
        Some(Heads {
            weights: HeadWeights::Q8Packed(std::rc::Rc::new(bytes)),
            ..self.clone_shape()
        })
    }

    /// These heads' shape and kernel, with no weights.
    fn clone_shape(&self) -> Heads {
        Heads {
            weights: HeadWeights::F32(Vec::new()),
            n_codes: self.n_codes,
            width: self.width,
            kernel: self.kernel,
        }
    }

    /// The kernel in use.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Uses `kernel` from now on.
    pub fn set_kernel(&mut self, kernel: Kernel) {
        self.kernel = kernel;
    }

    /// Whether the weights are q8_0 (packed or not).
    pub fn is_q8(&self) -> bool {
        matches!(self.weights, HeadWeights::Q8(_) | HeadWeights::Q8Packed(_))
    }

    /// The packed heads' bytes, head after head (`n_codes` packed rows each), when packed.
    pub(crate) fn packed_bytes(&self) -> Option<std::rc::Rc<Vec<u8>>> {
        match &self.weights {
            HeadWeights::Q8Packed(b) => Some(b.clone()),
            _ => None,
        }
    }

    /// Whether the weights are packed for the packed q8_0 kernel.
    pub fn is_packed(&self) -> bool {
        matches!(self.weights, HeadWeights::Q8Packed(_))
    }

    /// Logits of head `group` for hidden state `h` (length `width`) into `out` (length `n_codes`).
    ///
    /// # Real-time safety
    /// No lock, no system call; time linear in `n_codes · width`. No allocation, but for packed
    /// heads on a thread's first call (the kernel's scratch for the quantized input).
    pub fn logits(&self, group: usize, h: &[f32], out: &mut [f32]) {
        match &self.weights {
            HeadWeights::Q8Packed(bytes) => {
                let row_bytes = self.width / q8_0::BLOCK * q8_0::BLOCK_BYTES;
                let head = &bytes[group * self.n_codes * row_bytes..][..self.n_codes * row_bytes];
                assert!(h.len() == self.width && out.len() >= self.n_codes);
                // `to_packed` made these heads only where the tier has the kernel.
                let Some(kernel) = quant::packed_kernel(QType::Q8_0, crate::kernels::caps()) else {
                    return;
                };
                // SAFETY: `head` is n_codes packed rows of width weights (whole groups, see
                // `to_packed`), one input of width floats, n_codes outputs; the kernel is the
                // tier's, whose features the CPU has.
                unsafe {
                    kernel(
                        head.as_ptr(),
                        row_bytes,
                        self.n_codes,
                        self.width,
                        h.as_ptr(),
                        1,
                        out.as_mut_ptr(),
                        self.n_codes,
                    )
                }
            }
            HeadWeights::F32(w) => {
                let base = group * self.n_codes * self.width;
                let rows = w[base..base + self.n_codes * self.width].chunks_exact(self.width);
                for (o, row) in out.iter_mut().zip(rows) {
                    *o = self.kernel.dot(row, h);
                }
            }
            HeadWeights::Q8(blocks) => {
                let per_row = self.width / 32;
                let base = group * self.n_codes * per_row;
                let rows = blocks[base..base + self.n_codes * per_row].chunks_exact(per_row);
                for (o, row) in out.iter_mut().zip(rows) {
                    *o = self.kernel.dot_q8(row, h);
                }
            }
        }
    }
}
