//! Everything besides memory where a host can keep state across a wipe (issue 25): the
//! inventory every statement carries (`inventory`), turning swap off before a wipe
//! (`swap`), and erasing scratch volumes by key (`erase`). Read from sysfs, PID 1's mount table, `/proc/swaps` and `statfs`; nothing is
//! shelled out.

pub mod erase;
pub mod inventory;
pub mod swap;

pub use inventory::{EpochStorage, take};
