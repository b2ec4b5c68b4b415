//! The `qtts` command's tests: each runs the built binary as a process, as a user would.

#[allow(dead_code)]
#[path = "../../../../tests/it/common.rs"]
mod common;

#[allow(dead_code)]
#[path = "../../../../tests/it/cases.rs"]
mod cases;

mod cache;
mod cli;
mod fake_hub;
mod pull;
mod surfaces;
mod voice;
