pub mod api;
pub mod check;
pub mod config;
pub mod recheck;
pub mod serve;
pub mod status;
pub mod store;
