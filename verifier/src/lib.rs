pub mod api;
pub mod appraisal;
pub mod config;
pub mod recheck;
pub mod serve;
pub mod service;
pub mod status;
pub mod store;
