//! The reference inference server and the verifier's replay of what it served.
//!
//! - [`model`]: a Llama-architecture decoder on candle's CPU backend;
//! - [`tokenizer`], [`files`]: a model directory and the digest that names it;
//! - [`protocol`]: the verifiable completions protocol, rendered byte for byte;
//! - [`generate`]: serving one completion with the shared sampler;
//! - [`serve`]: the HTTP/1.1 server;
//! - [`replay`]: judging a recorded exchange by rerunning the model teacher-forced;
//! - [`bundled`]: the small model the demo and the tests serve, written and trained here;
//! - [`client`]: a request as a client sends it, a response as it crossed;
//! - [`calibrate`], [`attacks`]: honest margins, and what dishonest hosts do, for the benchmark
//!   and the attack tests.

pub mod attacks;
pub mod bundled;
pub mod calibrate;
pub mod client;
pub mod files;
pub mod generate;
pub mod model;
pub mod protocol;
pub mod replay;
pub mod serve;
pub mod tokenizer;
