//! The guard on kernels booted without BPF LSM: the same compiled programs, loaded as
//! `fmod_ret` tracing programs on the kernel's `security_<hook>` functions instead of as LSM
//! programs on `bpf_lsm_<hook>`.
//!
//! Why the same programs do the same job there: every caller of an LSM hook goes through
//! `security_<hook>`, whatever LSMs are active; an `fmod_ret` program sees that function's
//! arguments exactly as an LSM program sees the hook's (one u64 per argument, in order), and
//! a non-zero return is the function's result without its body running, so `-EPERM` refuses
//! the call before any LSM, or the caller, acts on it. The kernel's verifier accepts
//! `fmod_ret` on any `security_*` function whatever `lsm=` says (`check_attach_modify_return`;
//! 6.1 and 6.12 alike), and Debian's kernels have the BPF trampolines it runs on.
//!
//! aya 0.14 cannot load this program type (BPF_PROG_TYPE_TRACING with BPF_MODIFY_RETURN), so
//! this module takes each program's instructions from the guard object, points its map
//! references at the maps aya created for the same object (so configuring and freezing the
//! guard is the same code for both), and loads and attaches it with `bpf()` itself.

use std::{
    collections::HashSet,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
};

use super::{GuardError, HOOK_SIGNATURES, program_error};
use crate::bpf_syscall;

/// A guard program loaded for `security_<hook>`, not yet attached.
pub struct FmodRetProgram {
    pub name: &'static str,
    pub hook: &'static str,
    pub fd: OwnedFd,
}

/// The fd of one of the guard's maps (the guard has arrays only).
fn map_fd(name: &str, map: &aya::maps::Map) -> Result<i32, GuardError> {
    match map {
        aya::maps::Map::Array(d) | aya::maps::Map::PerCpuArray(d) => Ok(d.fd().as_fd().as_raw_fd()),
        _ => Err(GuardError::Map {
            name: "guard object",
            detail: format!(
                "map `{name}` is not an array; the fmod_ret loader relocates arrays only"
            ),
        }),
    }
}

/// Loads every guard program (`HOOK_SIGNATURES`) from `object` as `fmod_ret` on
/// `security_<hook>`, whose BTF ids are `security_ids` (checked, in the same order), its map
/// references bound to the maps of `ebpf` (aya's load of the same object).
pub fn load(
    object: &[u8],
    ebpf: &aya::Ebpf,
    security_ids: &[u32],
) -> Result<Vec<FmodRetProgram>, GuardError> {
    let obj_err = |detail: String| GuardError::Map {
        name: "guard object",
        detail,
    };
    let mut obj = aya_obj::Object::parse(object).map_err(|e| obj_err(e.to_string()))?;
    let defs = obj.maps.clone();
    let mut maps = Vec::new();
    for (name, map) in ebpf.maps() {
        let def = defs
            .get(name)
            .ok_or_else(|| obj_err(format!("aya created map `{name}`, which the object lacks")))?;
        maps.push((name, map_fd(name, map)?, def));
    }
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    obj.relocate_maps(maps.into_iter(), &text_sections)
        .map_err(|e| obj_err(format!("relocating map references: {e}")))?;
    obj.relocate_calls(&text_sections)
        .map_err(|e| obj_err(format!("relocating calls: {e}")))?;

    let mut loaded = Vec::new();
    for ((name, hook, _), attach_btf_id) in HOOK_SIGNATURES.into_iter().zip(security_ids) {
        let perr = program_error(name, hook);
        let prog = obj
            .programs
            .get(name)
            .ok_or_else(|| perr("not in the guard object".into()))?;
        let function = obj
            .functions
            .get(&prog.function_key())
            .ok_or_else(|| perr("its function is not in the guard object".into()))?;
        let insns: Vec<u64> = function
            .instructions
            .iter()
            .map(|i| {
                // SAFETY: `bpf_insn` is the kernel's 8-byte `#[repr(C)]` instruction with no
                // padding; the kernel reads the same 8 bytes.
                u64::from_ne_bytes(unsafe {
                    std::mem::transmute::<aya_obj::generated::bpf_insn, [u8; 8]>(*i)
                })
            })
            .collect();
        let fd = bpf_syscall::prog_load(&bpf_syscall::ProgLoad {
            prog_type: bpf_syscall::PROG_TYPE_TRACING,
            expected_attach_type: bpf_syscall::ATTACH_MODIFY_RETURN,
            attach_btf_id: *attach_btf_id,
            insns: &insns,
            name,
        })
        .map_err(|e| perr(format!("fmod_ret on `security_{hook}`: {e}")))?;
        loaded.push(FmodRetProgram { name, hook, fd });
    }
    Ok(loaded)
}
