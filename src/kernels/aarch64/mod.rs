//! aarch64 kernels; only their families (the parent module's) call them, after checking the
//! CPU's features.

pub mod neon;
