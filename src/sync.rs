//! The synchronisation primitives of the lock-free code the loom model checks (`audio::handoff`):
//! std's here; the model compiles the same files against loom's.

pub(crate) use std::sync::atomic;
