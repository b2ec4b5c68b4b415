//! x86-64 kernels, one file per feature level; only their families (the parent module's) call
//! them, after checking the CPU's features.

pub mod amx;
pub mod avx2;
pub mod avx512;
pub mod avx512_bf16;
pub mod avx512_vnni;
pub mod avx_vnni;
