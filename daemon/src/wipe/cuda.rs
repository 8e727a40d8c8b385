//! The slice of the CUDA driver API the GPU wipe uses, loaded at run time with `dlopen`, so
//! the build and every other test need nothing CUDA. Each call's result is checked and turned
//! into a [`CudaError`] that names the call and the driver's error name; device memory,
//! modules and contexts are released by `Drop`, whatever path the wipe takes out.
//!
//! The library is `libcuda.so.1`, or the path in `RACKWARDEN_LIBCUDA` (a driver installed
//! outside the loader's path, or the test driver `tests/cuda-double`).

use std::ffi::{CStr, CString, c_char, c_void};

/// `CUresult`.
type CuResult = i32;
const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CUDA_ERROR_NO_DEVICE: CuResult = 100;
/// `CUdeviceptr`.
pub type DevPtr = u64;
type Handle = *mut c_void;

/// `CU_DEVICE_ATTRIBUTE_*`.
pub const ATTR_MULTIPROCESSOR_COUNT: i32 = 16;
pub const ATTR_COMPUTE_CAPABILITY_MAJOR: i32 = 75;
pub const ATTR_COMPUTE_CAPABILITY_MINOR: i32 = 76;
/// `CU_JIT_ERROR_LOG_BUFFER`, `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES`.
const JIT_ERROR_LOG_BUFFER: i32 = 5;
const JIT_ERROR_LOG_BUFFER_SIZE_BYTES: i32 = 6;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA driver not loadable: {0}")]
    Load(String),
    #[error("{call} failed: {name} (CUresult {code})")]
    Call {
        call: &'static str,
        code: i32,
        name: String,
    },
    #[error("the driver could not compile the wipe kernels: {0}")]
    Jit(String),
}

impl CudaError {
    pub fn code(&self) -> Option<i32> {
        match self {
            CudaError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

macro_rules! driver_api {
    ($($field:ident = $sym:literal : fn($($arg:ty),*);)*) => {
        /// The loaded driver: one C function pointer per call we make.
        pub struct Cuda {
            lib: Handle,
            $($field: unsafe extern "C" fn($($arg),*) -> CuResult,)*
            get_error_name: Option<unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult>,
            device_get_uuid: Option<unsafe extern "C" fn(*mut [u8; 16], i32) -> CuResult>,
        }

        impl Cuda {
            /// Opens the driver and resolves every symbol; a missing one is an error that
            /// names it (a driver too old for us).
            pub fn load() -> Result<Cuda, CudaError> {
                let lib = open()?;
                // SAFETY: each symbol is cast to its prototype in cuda.h (CUresult = int,
                // CUdevice = int, CUdeviceptr = unsigned long long, handles are pointers).
                unsafe {
                    Ok(Cuda {
                        $($field: std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CuResult>(sym(lib, $sym)?),)*
                        get_error_name: sym(lib, c"cuGetErrorName").ok().map(|p| std::mem::transmute::<*mut c_void, unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult>(p)),
                        device_get_uuid: sym(lib, c"cuDeviceGetUuid").ok().map(|p| std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut [u8; 16], i32) -> CuResult>(p)),
                        lib,
                    })
                }
            }
        }
    };
}

driver_api! {
    init = c"cuInit": fn(u32);
    device_get_count = c"cuDeviceGetCount": fn(*mut i32);
    device_get = c"cuDeviceGet": fn(*mut i32, i32);
    device_get_name = c"cuDeviceGetName": fn(*mut c_char, i32, i32);
    device_get_attribute = c"cuDeviceGetAttribute": fn(*mut i32, i32, i32);
    device_total_mem = c"cuDeviceTotalMem_v2": fn(*mut usize, i32);
    primary_ctx_retain = c"cuDevicePrimaryCtxRetain": fn(*mut Handle, i32);
    primary_ctx_release = c"cuDevicePrimaryCtxRelease_v2": fn(i32);
    ctx_set_current = c"cuCtxSetCurrent": fn(Handle);
    ctx_synchronize = c"cuCtxSynchronize": fn();
    mem_get_info = c"cuMemGetInfo_v2": fn(*mut usize, *mut usize);
    mem_alloc = c"cuMemAlloc_v2": fn(*mut DevPtr, usize);
    mem_free = c"cuMemFree_v2": fn(DevPtr);
    memcpy_htod = c"cuMemcpyHtoD_v2": fn(DevPtr, *const c_void, usize);
    memcpy_dtoh = c"cuMemcpyDtoH_v2": fn(*mut c_void, DevPtr, usize);
    memset_d32 = c"cuMemsetD32_v2": fn(DevPtr, u32, usize);
    module_load_data_ex = c"cuModuleLoadDataEx": fn(*mut Handle, *const c_void, u32, *mut i32, *mut *mut c_void);
    module_unload = c"cuModuleUnload": fn(Handle);
    module_get_function = c"cuModuleGetFunction": fn(*mut Handle, Handle, *const c_char);
    launch_kernel = c"cuLaunchKernel": fn(Handle, u32, u32, u32, u32, u32, u32, u32, Handle, *mut *mut c_void, *mut *mut c_void);
}

fn open() -> Result<Handle, CudaError> {
    let name = std::env::var_os("RACKWARDEN_LIBCUDA")
        .map(|p| CString::new(p.as_encoded_bytes().to_vec()))
        .unwrap_or_else(|| Ok(c"libcuda.so.1".to_owned()))
        .map_err(|_| CudaError::Load("RACKWARDEN_LIBCUDA contains a NUL byte".into()))?;
    // SAFETY: dlopen with a NUL-terminated name; checked for null.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a thread-local C string or null.
        let e = unsafe { libc::dlerror() };
        let msg = if e.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: `e` is non-null and points to dlerror's NUL-terminated message.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().to_string()
        };
        return Err(CudaError::Load(msg));
    }
    Ok(h)
}

/// # Safety
/// `lib` is a live dlopen handle.
unsafe fn sym(lib: Handle, name: &CStr) -> Result<*mut c_void, CudaError> {
    // SAFETY: per the contract.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return Err(CudaError::Load(format!(
            "the driver has no {} (too old?)",
            name.to_string_lossy()
        )));
    }
    Ok(p)
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: closing our own handle; every object made through it is gone (they borrow
        // the `Cuda`).
        unsafe { libc::dlclose(self.lib) };
    }
}

/// A device's identity and size.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: i32,
    pub handle: i32,
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints it; stable across
    /// `CUDA_VISIBLE_DEVICES`, so it (not the ordinal) keys the device's wipe stream.
    pub uuid: Option<String>,
    pub total_bytes: u64,
    pub sm_count: u32,
    pub compute_capability: (i32, i32),
}

impl Cuda {
    fn check(&self, call: &'static str, r: CuResult) -> Result<(), CudaError> {
        if r == CUDA_SUCCESS {
            return Ok(());
        }
        let mut name = format!("error {r}");
        if let Some(f) = self.get_error_name {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: cuGetErrorName writes a pointer to a static string.
            if unsafe { f(r, &mut p) } == CUDA_SUCCESS && !p.is_null() {
                // SAFETY: on success `p` is non-null and points to a static C string.
                name = unsafe { CStr::from_ptr(p) }.to_string_lossy().to_string();
            }
        }
        Err(CudaError::Call {
            call,
            code: r,
            name,
        })
    }

    pub fn devices(&self) -> Result<Vec<DeviceInfo>, CudaError> {
        // SAFETY: cuInit takes flags only (0) and touches no memory of ours.
        self.check("cuInit", unsafe { (self.init)(0) })?;
        let mut n = 0;
        // SAFETY: `n` is a live i32, the out-pointer type cuda.h names.
        self.check("cuDeviceGetCount", unsafe {
            (self.device_get_count)(&mut n)
        })?;
        let mut out = Vec::new();
        for ordinal in 0..n {
            let mut dev = 0;
            // SAFETY: `dev` is a live CUdevice (int) out-pointer; `ordinal` < the count.
            self.check("cuDeviceGet", unsafe {
                (self.device_get)(&mut dev, ordinal)
            })?;
            let mut buf = [0 as c_char; 256];
            // SAFETY: the driver writes at most `len - 1` bytes plus a NUL into `buf`.
            self.check("cuDeviceGetName", unsafe {
                (self.device_get_name)(buf.as_mut_ptr(), buf.len() as i32 - 1, dev)
            })?;
            // SAFETY: `buf` ends in a NUL (zeroed, and the driver writes at most len - 1).
            let name = unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .to_string();
            let mut total = 0usize;
            // SAFETY: `total` is a live size_t out-pointer.
            self.check("cuDeviceTotalMem_v2", unsafe {
                (self.device_total_mem)(&mut total, dev)
            })?;
            let uuid = self.device_get_uuid.and_then(|f| {
                let mut u = [0u8; 16];
                // SAFETY: `u` is the 16-byte CUuuid the call writes.
                (unsafe { f(&mut u, dev) } == CUDA_SUCCESS).then(|| format_uuid(&u))
            });
            out.push(DeviceInfo {
                ordinal,
                handle: dev,
                name,
                uuid,
                total_bytes: total as u64,
                sm_count: self.attribute(dev, ATTR_MULTIPROCESSOR_COUNT)?.max(1) as u32,
                compute_capability: (
                    self.attribute(dev, ATTR_COMPUTE_CAPABILITY_MAJOR)?,
                    self.attribute(dev, ATTR_COMPUTE_CAPABILITY_MINOR)?,
                ),
            });
        }
        Ok(out)
    }

    fn attribute(&self, dev: i32, attr: i32) -> Result<i32, CudaError> {
        let mut v = 0;
        // SAFETY: out-pointer to a local int.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.device_get_attribute)(&mut v, attr, dev)
        })?;
        Ok(v)
    }

    /// Makes the device's primary context current on this thread until the guard drops.
    pub fn context(&self, dev: i32) -> Result<Context<'_>, CudaError> {
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local handle.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.primary_ctx_retain)(&mut ctx, dev)
        })?;
        let guard = Context { cuda: self, dev };
        // SAFETY: a context the driver just gave us.
        self.check("cuCtxSetCurrent", unsafe { (self.ctx_set_current)(ctx) })?;
        Ok(guard)
    }
}

/// `GPU-` and the 16 bytes as 8-4-4-4-12 hex, like nvidia-smi.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h = hex::encode(u);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The current primary context of one device.
pub struct Context<'a> {
    cuda: &'a Cuda,
    dev: i32,
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: releasing the retain made in `Cuda::context`.
        unsafe {
            (self.cuda.ctx_set_current)(std::ptr::null_mut());
            (self.cuda.primary_ctx_release)(self.dev);
        }
    }
}

impl<'a> Context<'a> {
    pub fn mem_info(&self) -> Result<(u64, u64), CudaError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers to locals.
        self.cuda.check("cuMemGetInfo_v2", unsafe {
            (self.cuda.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    pub fn alloc(&self, bytes: u64) -> Result<DeviceBuffer<'a>, CudaError> {
        let mut ptr: DevPtr = 0;
        // SAFETY: out-pointer to a local.
        self.cuda.check("cuMemAlloc_v2", unsafe {
            (self.cuda.mem_alloc)(&mut ptr, bytes as usize)
        })?;
        Ok(DeviceBuffer {
            cuda: self.cuda,
            ptr,
            bytes,
        })
    }

    /// Loads PTX; a compile error comes back with the driver's log.
    pub fn load_module(&self, ptx: &str) -> Result<Module<'a>, CudaError> {
        let image = CString::new(ptx).map_err(|_| CudaError::Jit("PTX contains a NUL".into()))?;
        let mut log = vec![0u8; 16 << 10];
        let mut opts = [JIT_ERROR_LOG_BUFFER, JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
        let mut vals = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
        let mut module: Handle = std::ptr::null_mut();
        // SAFETY: image is NUL-terminated PTX; options and values are parallel arrays; the log
        // buffer outlives the call.
        let r = unsafe {
            (self.cuda.module_load_data_ex)(
                &mut module,
                image.as_ptr() as *const c_void,
                opts.len() as u32,
                opts.as_mut_ptr(),
                vals.as_mut_ptr(),
            )
        };
        if let Err(e) = self.cuda.check("cuModuleLoadDataEx", r) {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]).trim().to_string();
            return Err(if text.is_empty() {
                e
            } else {
                CudaError::Jit(format!("{e}: {text}"))
            });
        }
        Ok(Module {
            cuda: self.cuda,
            module,
        })
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: no arguments.
        self.cuda
            .check("cuCtxSynchronize", unsafe { (self.cuda.ctx_synchronize)() })
    }

    pub fn upload<T: Copy>(&self, dst: DevPtr, src: &[T]) -> Result<(), CudaError> {
        // SAFETY: `src` is `size_of_val(src)` readable bytes; the caller sizes `dst`.
        self.cuda.check("cuMemcpyHtoD_v2", unsafe {
            (self.cuda.memcpy_htod)(dst, src.as_ptr() as *const c_void, size_of_val(src))
        })
    }

    pub fn download<T: Copy>(&self, dst: &mut [T], src: DevPtr) -> Result<(), CudaError> {
        // SAFETY: `dst` is `size_of_val(dst)` writable bytes of a plain-data type.
        self.cuda.check("cuMemcpyDtoH_v2", unsafe {
            (self.cuda.memcpy_dtoh)(dst.as_mut_ptr() as *mut c_void, src, size_of_val(dst))
        })
    }

    pub fn memset_d32(&self, dst: DevPtr, value: u32, words: u64) -> Result<(), CudaError> {
        // SAFETY: the caller's buffer holds `words` 32-bit words.
        self.cuda.check("cuMemsetD32_v2", unsafe {
            (self.cuda.memset_d32)(dst, value, words as usize)
        })
    }
}

/// Device memory, freed on drop.
pub struct DeviceBuffer<'a> {
    cuda: &'a Cuda,
    pub ptr: DevPtr,
    pub bytes: u64,
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: our allocation; its context is still current (Context outlives it).
        unsafe { (self.cuda.mem_free)(self.ptr) };
    }
}

pub struct Module<'a> {
    cuda: &'a Cuda,
    module: Handle,
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        // SAFETY: our module.
        unsafe { (self.cuda.module_unload)(self.module) };
    }
}

/// One kernel argument, as `cuLaunchKernel` wants it: a pointer to its value.
pub enum Arg {
    U64(u64),
    U32(u32),
}

impl<'a> Module<'a> {
    pub fn function(&self, name: &CStr) -> Result<Kernel<'a>, CudaError> {
        let mut f: Handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; name is NUL-terminated.
        self.cuda.check("cuModuleGetFunction", unsafe {
            (self.cuda.module_get_function)(&mut f, self.module, name.as_ptr())
        })?;
        Ok(Kernel { cuda: self.cuda, f })
    }
}

/// A kernel of a loaded module (valid while the module is).
#[derive(Clone, Copy)]
pub struct Kernel<'a> {
    cuda: &'a Cuda,
    f: Handle,
}

impl Kernel<'_> {
    /// Launches on the default stream; returns once queued (synchronize to wait).
    pub fn launch(&self, grid: u32, block: u32, args: &mut [Arg]) -> Result<(), CudaError> {
        let mut ptrs: Vec<*mut c_void> = args
            .iter_mut()
            .map(|a| match a {
                Arg::U64(v) => v as *mut u64 as *mut c_void,
                Arg::U32(v) => v as *mut u32 as *mut c_void,
            })
            .collect();
        // SAFETY: one pointer per kernel parameter, in order, each to a value of the
        // parameter's size; they live until the call returns (the driver copies them).
        self.cuda.check("cuLaunchKernel", unsafe {
            (self.cuda.launch_kernel)(
                self.f,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                std::ptr::null_mut(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}
