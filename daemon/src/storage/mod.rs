//! Everything besides memory where a host can keep state across a wipe (issue 25): the
//! inventory every statement carries (`inventory`), and turning swap off before a wipe
//! (`swap`). Read from sysfs, PID 1's mount table, `/proc/swaps` and `statfs`; nothing is
//! shelled out.

pub mod inventory;
pub mod swap;

pub use inventory::take;
