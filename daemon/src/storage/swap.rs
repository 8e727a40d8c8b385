//! `[wipe] swap = "off"`: every active swap area is turned off before the wipe, so that
//! what the workloads had paged out comes back into RAM (where the wipe and its residue
//! count it) and nothing new is paged out to a disk during the epoch's wipe. The statement
//! names each area turned off, or the kernel's refusal (the area then stays on and is
//! residue in the inventory).

use std::ffi::CString;

use rackwarden_attest::storage::SwapOff;

use super::inventory;

/// Turns off every swap area `/proc/swaps` lists, in its order.
pub fn turn_off_all() -> Vec<SwapOff> {
    let (areas, unreadable) = inventory::swap_lines(inventory::PROC_SWAPS);
    let mut out: Vec<SwapOff> = unreadable
        .into_iter()
        .map(|e| SwapOff {
            path: inventory::PROC_SWAPS.into(),
            error: Some(e),
        })
        .collect();
    for a in areas {
        let error = match CString::new(a.path.as_bytes()) {
            Err(_) => Some("the path holds a NUL byte".to_string()),
            // SAFETY: a valid NUL-terminated path; swapoff(2) only reads it.
            Ok(c) => match unsafe { libc::swapoff(c.as_ptr()) } {
                0 => None,
                _ => Some(std::io::Error::last_os_error().to_string()),
            },
        };
        match &error {
            None => log::info!("swap {} turned off before the wipe", a.path),
            Some(e) => log::error!("swap {} could not be turned off: {e}", a.path),
        }
        out.push(SwapOff {
            path: a.path,
            error,
        });
    }
    out
}
