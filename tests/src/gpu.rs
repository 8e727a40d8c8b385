//! Checks shared by the GPU wipe tests on the CUDA test double (`tests/tests/gpu_double.rs`)
//! and on a real card (`tests/tests/gpu.rs`).

use std::sync::atomic::AtomicBool;

use rackwarden::wipe::{
    cuda::{Cuda, DeviceInfo},
    gpu,
    stream::KeyedStream,
};

/// The first device of the driver that `RACKWARDEN_LIBCUDA` (or `libcuda.so.1`) names, or why
/// there is none.
pub fn first_device() -> Result<(Cuda, DeviceInfo), String> {
    let cuda = Cuda::load().map_err(|e| e.to_string())?;
    let d = cuda
        .devices()
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("CUDA driver present, no device")?;
    Ok((cuda, d))
}

/// Fills up to `limit` bytes of the first device with the GPU kernels, reads back `sample`
/// bytes at the start, middle and end of every allocation (all of it when `None`) and
/// compares them with the host's stream at the same offsets: the GPU writes the very bytes
/// the host would. Returns the bytes compared.
pub fn fill_equals_host_stream(limit: Option<u64>, sample: Option<u64>) -> u64 {
    let (cuda, d) = first_device().expect("a CUDA device");
    let id = gpu::device_id(&d);
    let nonce = [0x7eu8; 32];
    let ctx = cuda.context(d.handle).expect("context");
    let k = gpu::load_kernels(&ctx, &d).expect("kernels");
    let t = gpu::take(&ctx, limit).expect("memory");
    let host = KeyedStream::new(&nonce, &id);
    gpu::upload_seeds(&ctx, &t, &host, 2).expect("seeds");
    let filled = gpu::fill(&ctx, &k, &t, &AtomicBool::new(false), |_| {}).expect("fill");
    assert_eq!(filled, t.covered());
    let mut compared = 0;
    for (ptr, bytes, offset) in t.chunks() {
        let spans = match sample {
            None => vec![(0, bytes)],
            Some(n) => {
                let n = n.min(bytes) & !15;
                let mid = (bytes / 2) & !15;
                vec![(0, n), (mid.min(bytes - n), n), (bytes - n, n)]
            }
        };
        for (at, n) in spans {
            let mut got = vec![0u8; n as usize];
            ctx.download(&mut got, ptr + at).expect("download");
            let mut want = vec![0u8; n as usize];
            host.fill(offset + at, &mut want);
            if got != want {
                let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                panic!(
                    "GPU fill differs from the host stream at stream offset {} (allocation at \
                     offset {offset}, {bytes} B)",
                    offset + at + i as u64
                );
            }
            compared += n;
        }
    }
    compared
}
