//! GPU memory through the CUDA driver API, loaded at run time (`libcuda.so.1`): nothing CUDA
//! is needed to build or test the rest.
//!
//! State of this backend: it finds the driver and the devices and reports each device's total
//! memory. The fill and verify kernels (the same AES-128-CTR stream, carried as PTX) are not
//! in this build yet, so every GPU is reported `unsupported` with its whole memory as residue,
//! never as wiped. No driver or no device: one `absent` entry with the reason.

use std::{ffi::CStr, sync::atomic::AtomicBool};

use rackwarden_attest::evidence::WipeDeviceReport;

use super::{WipeRequest, not_wiped};

type CuResult = i32;

struct Driver {
    handle: *mut libc::c_void,
}

impl Driver {
    fn open() -> Result<Driver, String> {
        // SAFETY: dlopen with a constant name; checked for null.
        let h =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            // SAFETY: dlerror returns a thread-local C string or null.
            let e = unsafe { libc::dlerror() };
            let msg = if e.is_null() {
                "unknown error".into()
            } else {
                unsafe { CStr::from_ptr(e) }.to_string_lossy().to_string()
            };
            return Err(format!("CUDA driver not loadable: {msg}"));
        }
        Ok(Driver { handle: h })
    }

    /// # Safety
    /// `T` must be the C signature of `name` in the CUDA driver API.
    unsafe fn sym<T: Copy>(&self, name: &CStr) -> Result<T, String> {
        // SAFETY: handle is a live dlopen handle.
        let p = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        if p.is_null() {
            return Err(format!("libcuda.so.1 has no {}", name.to_string_lossy()));
        }
        // SAFETY: the caller guarantees T is the function's type; fn pointers are pointer-sized.
        Ok(unsafe { std::mem::transmute_copy(&p) })
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // SAFETY: closing our own handle.
        unsafe { libc::dlclose(self.handle) };
    }
}

fn devices() -> Result<Vec<(String, u64)>, String> {
    let drv = Driver::open()?;
    // SAFETY: signatures from cuda.h (CUresult is int, CUdevice is int, size_t totals).
    unsafe {
        let cu_init: extern "C" fn(u32) -> CuResult = drv.sym(c"cuInit")?;
        let count: extern "C" fn(*mut i32) -> CuResult = drv.sym(c"cuDeviceGetCount")?;
        let get: extern "C" fn(*mut i32, i32) -> CuResult = drv.sym(c"cuDeviceGet")?;
        let total: extern "C" fn(*mut usize, i32) -> CuResult = drv.sym(c"cuDeviceTotalMem_v2")?;
        let name: extern "C" fn(*mut libc::c_char, i32, i32) -> CuResult =
            drv.sym(c"cuDeviceGetName")?;
        let r = cu_init(0);
        if r != 0 {
            return Err(format!("cuInit failed with CUresult {r}"));
        }
        let mut n = 0;
        let r = count(&mut n);
        if r != 0 {
            return Err(format!("cuDeviceGetCount failed with CUresult {r}"));
        }
        let mut out = Vec::new();
        for i in 0..n {
            let mut dev = 0;
            if get(&mut dev, i) != 0 {
                continue;
            }
            let mut bytes = 0usize;
            let _ = total(&mut bytes, dev);
            let mut buf = [0 as libc::c_char; 128];
            let _ = name(buf.as_mut_ptr(), 128, dev);
            let nm = CStr::from_ptr(buf.as_ptr()).to_string_lossy().to_string();
            out.push((format!("gpu{i} ({nm})"), bytes as u64));
        }
        Ok(out)
    }
}

pub fn wipe(_req: &WipeRequest, _stop: &AtomicBool) -> Vec<WipeDeviceReport> {
    match devices() {
        Err(reason) => vec![not_wiped("gpu", "gpu", "absent", 0, reason)],
        Ok(d) if d.is_empty() => vec![not_wiped("gpu", "gpu", "absent", 0, "CUDA driver present, no device".into())],
        Ok(d) => d
            .into_iter()
            .map(|(dev, total)| {
                not_wiped(
                    "gpu",
                    &dev,
                    "unsupported",
                    total,
                    "GPU fill/verify kernels are not in this build: nothing on this device was wiped".into(),
                )
            })
            .collect(),
    }
}
