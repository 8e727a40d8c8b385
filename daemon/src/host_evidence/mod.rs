//! What a statement reports about this host, read from the kernel and the system, never
//! changing anything: the limiter ([`limiter`]: programs, attach points, caps, counters, gaps,
//! the producer's identity) and the bypass surface ([`bypass`]).

pub mod bypass;
pub mod limiter;

pub use limiter::{limiter_report, producer};
