//! The GPU wipe on a real card: the PTX kernels compiled by the driver, the whole card
//! filled and read back, what the kernels wrote compared with the host's stream, and a
//! corruption counted. Without a CUDA driver and device each test prints SKIP with the
//! reason: this is the one hardware CI lacks. The host side is tested in CI on the CUDA test
//! double (`gpu_double.rs`).

use std::sync::atomic::AtomicBool;

use rackwarden::wipe::{self, Backend, WipeRequest};
use rackwarden_tests::gpu::{fill_equals_host_stream, first_device};

const GIB: u64 = 1 << 30;

fn gpu_or_skip(test: &str) -> bool {
    if std::env::var_os("RACKWARDEN_LIBCUDA").is_some() {
        println!("SKIP {test}: RACKWARDEN_LIBCUDA is set; this test is for the real driver");
        return false;
    }
    match first_device() {
        Ok((_, d)) => {
            println!(
                "{test}: on gpu{} {} ({} B)",
                d.ordinal, d.name, d.total_bytes
            );
            true
        }
        Err(why) => {
            println!("SKIP {test}: needs a GPU: {why}");
            false
        }
    }
}

fn request(max: Option<u64>) -> WipeRequest {
    rackwarden_tests::wipe::request(vec![Backend::Gpu], max)
}

#[test]
fn whole_card_wipe_on_a_real_gpu() {
    if !gpu_or_skip("whole_card_wipe_on_a_real_gpu") {
        return;
    }
    let r = wipe::run(&request(None), &AtomicBool::new(false));
    for d in &r.devices {
        println!(
            "RESULT {}: {} of {} B verified ({:.2}%), residue {} B, mismatches {}, fill {} ms \
             ({:.1} GB/s), verify {} ms ({:.1} GB/s); {}",
            d.device,
            d.bytes_verified,
            d.bytes_total,
            100.0 * d.bytes_verified as f64 / d.bytes_total as f64,
            d.residue_bytes,
            d.mismatches,
            d.fill_ms,
            d.bytes_filled as f64 / d.fill_ms.max(1) as f64 / 1e6,
            d.verify_ms,
            d.bytes_verified as f64 / d.verify_ms.max(1) as f64 / 1e6,
            d.detail.as_deref().unwrap_or("")
        );
        assert_eq!((d.status.name(), d.mismatches), ("complete", 0), "{d:?}");
        assert_eq!(d.bytes_verified, d.bytes_filled);
        assert_eq!(d.bytes_total, d.bytes_verified + d.residue_bytes);
        assert!(
            d.bytes_verified >= d.bytes_total / 10 * 9,
            "less than 90% of the card covered: {d:?}"
        );
    }
}

#[test]
fn gpu_kernels_write_the_host_stream_on_a_real_gpu() {
    if !gpu_or_skip("gpu_kernels_write_the_host_stream_on_a_real_gpu") {
        return;
    }
    // 3 GiB: three allocations (1 GiB each), 4 MiB compared at the start, middle and end of
    // each, so both the segment arithmetic and the per-allocation seed offsets are checked.
    let n = fill_equals_host_stream(Some(3 * GIB), Some(4 << 20));
    println!("RESULT {n} B read back from the GPU equal the host stream");
}

#[test]
fn a_corrupted_gpu_byte_is_counted_on_a_real_gpu() {
    if !gpu_or_skip("a_corrupted_gpu_byte_is_counted_on_a_real_gpu") {
        return;
    }
    let mut req = request(Some(2 * GIB));
    req.corrupt_byte_for_test = Some(GIB + 12_345);
    let d = &wipe::run(&req, &AtomicBool::new(false)).devices[0];
    assert_eq!((d.status.name(), d.mismatches), ("complete", 1), "{d:?}");
    assert_eq!(d.bytes_verified, 2 * GIB - 16);
}
