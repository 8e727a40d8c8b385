//! The rack limiter: a tc policer for egress and ingress of each frontend interface (the
//! policer itself is `policer.rs`), and the `setsockopt` refusals that keep traffic on tc.
//! The tapped variant of this object is `tap.rs`.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

use aya_ebpf::{macros::classifier, programs::TcContext};
use rackwarden_common::{DIR_EGRESS, DIR_INGRESS};

mod policer;
mod sockopt;

/// Without taps, a packet the bucket passes goes on as it is.
#[inline(always)]
fn untapped(_: &TcContext, _: u32, _: u64) -> Result<(), policer::TapFailure> {
    Ok(())
}

#[classifier]
pub fn rw_egress(ctx: TcContext) -> i32 {
    policer::police(&ctx, DIR_EGRESS, untapped)
}

#[classifier]
pub fn rw_ingress(ctx: TcContext) -> i32 {
    policer::police(&ctx, DIR_INGRESS, untapped)
}

mod panic;

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
