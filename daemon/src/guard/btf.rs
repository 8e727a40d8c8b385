//! Just enough of the kernel's BTF (`/sys/kernel/btf/vmlinux`) for the guard: struct member
//! offsets (so one guard build reads `task_struct`, `inode`, `sk_buff`... on any kernel) and
//! LSM hook signatures (so a hook whose arguments are not what the guard reads is never
//! attached: `bpf` has 3 arguments on 6.1 and 4 on newer kernels).
//!
//! Format: a header, a type section (each type a 12-byte `btf_type` plus a kind-specific
//! tail), a string section. Type ids start at 1, in section order.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("kernel BTF, byte offset {offset}: {what}")]
    Malformed { offset: usize, what: String },
    #[error("kernel BTF has no struct `{0}`")]
    NoStruct(String),
    #[error("kernel BTF: struct `{strukt}` has no member `{member}`")]
    NoMember { strukt: String, member: String },
    #[error("kernel BTF: `{strukt}.{member}` is {found} bytes, the guard reads {want}")]
    MemberSize {
        strukt: String,
        member: String,
        found: u32,
        want: u32,
    },
    #[error("kernel BTF: `{0}` is a bitfield, the guard reads whole bytes")]
    Bitfield(String),
    #[error("kernel BTF has no LSM hook `{hook}` (no function `{function}`)")]
    NoHook { hook: String, function: String },
    #[error("`{function}` takes ({found}); the guard reads ({want}, ...)")]
    HookSignature {
        function: String,
        found: String,
        want: String,
    },
}

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, Clone)]
struct Member {
    name: u32,
    ty: u32,
    /// In bits; `bitfield` is set when the member is one.
    bit_offset: u32,
    bitfield: bool,
}

#[derive(Debug, Clone)]
enum Ty {
    /// A named scalar (int, enum, float) and its size in bytes.
    Scalar {
        name: u32,
        size: u32,
    },
    Ptr {
        to: u32,
    },
    Array {
        elem: u32,
        len: u32,
    },
    Record {
        name: u32,
        size: u32,
        union: bool,
        members: Vec<Member>,
    },
    Fwd {
        name: u32,
        union: bool,
    },
    Typedef {
        name: u32,
        to: u32,
    },
    /// const, volatile, restrict, type tags: transparent.
    Modifier {
        to: u32,
    },
    Func {
        name: u32,
        proto: u32,
    },
    Proto {
        params: Vec<u32>,
    },
    Other,
}

pub struct KernelBtf {
    /// Index 0 is `void`.
    types: Vec<Ty>,
    strings: Vec<u8>,
}

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

fn malformed(offset: usize, what: &str) -> BtfError {
    BtfError::Malformed {
        offset,
        what: what.into(),
    }
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, BtfError> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| malformed(off, "truncated"))
}

/// The type record at `off`, and the offset of the next one.
fn parse_type(b: &[u8], off: usize) -> Result<(Ty, usize), BtfError> {
    let name = u32_at(b, off)?;
    let info = u32_at(b, off + 4)?;
    let size_or_type = u32_at(b, off + 8)?;
    let vlen = (info & 0xffff) as usize;
    let kind = (info >> 24) & 0x1f;
    let kind_flag = info >> 31 == 1;
    let tail = off + 12;
    let (ty, tail_len) = match kind {
        KIND_INT => (
            Ty::Scalar {
                name,
                size: size_or_type,
            },
            4,
        ),
        KIND_ENUM => (
            Ty::Scalar {
                name,
                size: size_or_type,
            },
            vlen * 8,
        ),
        KIND_ENUM64 => (
            Ty::Scalar {
                name,
                size: size_or_type,
            },
            vlen * 12,
        ),
        KIND_FLOAT => (
            Ty::Scalar {
                name,
                size: size_or_type,
            },
            0,
        ),
        KIND_PTR => (Ty::Ptr { to: size_or_type }, 0),
        KIND_ARRAY => (
            Ty::Array {
                elem: u32_at(b, tail)?,
                len: u32_at(b, tail + 8)?,
            },
            12,
        ),
        KIND_STRUCT | KIND_UNION => {
            let mut members = Vec::with_capacity(vlen);
            for i in 0..vlen {
                let m = tail + i * 12;
                let raw = u32_at(b, m + 8)?;
                members.push(Member {
                    name: u32_at(b, m)?,
                    ty: u32_at(b, m + 4)?,
                    bit_offset: if kind_flag { raw & 0xff_ffff } else { raw },
                    bitfield: kind_flag && raw >> 24 != 0,
                });
            }
            (
                Ty::Record {
                    name,
                    size: size_or_type,
                    union: kind == KIND_UNION,
                    members,
                },
                vlen * 12,
            )
        }
        KIND_FWD => (
            Ty::Fwd {
                name,
                union: kind_flag,
            },
            0,
        ),
        KIND_TYPEDEF => (
            Ty::Typedef {
                name,
                to: size_or_type,
            },
            0,
        ),
        KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
            (Ty::Modifier { to: size_or_type }, 0)
        }
        KIND_FUNC => (
            Ty::Func {
                name,
                proto: size_or_type,
            },
            0,
        ),
        KIND_FUNC_PROTO => {
            let params = (0..vlen)
                .map(|i| u32_at(b, tail + i * 8 + 4))
                .collect::<Result<_, _>>()?;
            (Ty::Proto { params }, vlen * 8)
        }
        KIND_VAR | KIND_DECL_TAG => (Ty::Other, 4),
        KIND_DATASEC => (Ty::Other, vlen * 12),
        k => return Err(malformed(off, &format!("unknown BTF kind {k}"))),
    };
    Ok((ty, tail + tail_len))
}

impl KernelBtf {
    pub fn load(path: &Path) -> Result<KernelBtf, BtfError> {
        let bytes = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        KernelBtf::parse(&bytes)
    }

    pub fn parse(b: &[u8]) -> Result<KernelBtf, BtfError> {
        if b.len() < 24 || b[0..2] != [0x9f, 0xeb] {
            return Err(malformed(0, "not little-endian BTF (magic 0xeb9f)"));
        }
        let hdr_len = u32_at(b, 4)? as usize;
        let (type_off, type_len) = (u32_at(b, 8)? as usize, u32_at(b, 12)? as usize);
        let (str_off, str_len) = (u32_at(b, 16)? as usize, u32_at(b, 20)? as usize);
        let strings = b
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or_else(|| malformed(hdr_len + str_off, "string section past the end"))?
            .to_vec();
        let start = hdr_len + type_off;
        let end = start + type_len;
        if end > b.len() {
            return Err(malformed(start, "type section past the end"));
        }
        let mut types = vec![Ty::Other];
        let mut off = start;
        while off < end {
            let (ty, next) = parse_type(b, off)?;
            types.push(ty);
            off = next;
        }
        Ok(KernelBtf { types, strings })
    }

    fn name(&self, off: u32) -> &str {
        let s = self.strings.get(off as usize..).unwrap_or_default();
        let end = s.iter().position(|c| *c == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("?")
    }

    fn ty(&self, id: u32) -> &Ty {
        self.types.get(id as usize).unwrap_or(&Ty::Other)
    }

    /// Follows typedefs and modifiers.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.ty(id) {
                Ty::Typedef { to, .. } | Ty::Modifier { to } => id = *to,
                _ => break,
            }
        }
        id
    }

    fn size_of(&self, id: u32) -> Option<u32> {
        match self.ty(self.resolve(id)) {
            Ty::Scalar { size, .. } | Ty::Record { size, .. } => Some(*size),
            Ty::Ptr { .. } => Some(8),
            Ty::Array { elem, len } => self.size_of(*elem).map(|s| s * len),
            _ => None,
        }
    }

    fn find_struct(&self, name: &str) -> Option<u32> {
        self.types.iter().enumerate().find_map(|(i, t)| match t {
            Ty::Record {
                name: n,
                union: false,
                members,
                ..
            } if !members.is_empty() && self.name(*n) == name => Some(i as u32),
            _ => None,
        })
    }

    /// A member of a record, looking inside anonymous struct and union members: its bit
    /// offset from the record's start, whether it is a bitfield, and its type.
    fn member(&self, record: u32, name: &str) -> Option<(u32, bool, u32)> {
        let Ty::Record { members, .. } = self.ty(self.resolve(record)) else {
            return None;
        };
        for m in members {
            if m.name != 0 && self.name(m.name) == name {
                return Some((m.bit_offset, m.bitfield, m.ty));
            }
            if m.name == 0
                && let Some((o, bf, t)) = self.member(m.ty, name)
            {
                return Some((m.bit_offset + o, bf, t));
            }
        }
        None
    }

    /// The byte offset of `path` (members of embedded structs joined by `.`) in struct
    /// `strukt`, checking that the last member is `size` bytes.
    pub fn offset(&self, strukt: &str, path: &str, size: u32) -> Result<u32, BtfError> {
        let mut record = self
            .find_struct(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.into()))?;
        let mut bits = 0;
        let mut last_ty = record;
        for part in path.split('.') {
            let (o, bitfield, ty) =
                self.member(record, part)
                    .ok_or_else(|| BtfError::NoMember {
                        strukt: strukt.into(),
                        member: path.into(),
                    })?;
            if bitfield || o % 8 != 0 {
                return Err(BtfError::Bitfield(format!("{strukt}.{path}")));
            }
            bits += o;
            record = ty;
            last_ty = ty;
        }
        let found = self.size_of(last_ty).unwrap_or(0);
        if found != size {
            return Err(BtfError::MemberSize {
                strukt: strukt.into(),
                member: path.into(),
                found,
                want: size,
            });
        }
        Ok(bits / 8)
    }

    /// A type as C spells it, e.g. `union bpf_attr *`, `unsigned int`.
    fn type_name(&self, id: u32) -> String {
        match self.ty(id) {
            Ty::Other if id == 0 => "void".into(),
            Ty::Scalar { name, .. } => self.name(*name).into(),
            Ty::Ptr { to } => format!("{} *", self.type_name(*to)),
            Ty::Array { elem, len } => format!("{}[{len}]", self.type_name(*elem)),
            Ty::Record { name, union, .. } | Ty::Fwd { name, union } => format!(
                "{} {}",
                if *union { "union" } else { "struct" },
                self.name(*name)
            ),
            Ty::Typedef { name, .. } => self.name(*name).into(),
            Ty::Modifier { to } => self.type_name(*to),
            _ => "?".into(),
        }
    }

    /// The parameter types of LSM hook `hook` where `attach` attaches to it (`bpf_lsm_<hook>`
    /// or `security_<hook>`), checked to begin with `want`. Returns the function's BTF type
    /// id (what a program attaches to) and its number of parameters (the previous program's
    /// return value is in the slot after the last one).
    pub fn check_hook_at(
        &self,
        attach: HookFunction,
        hook: &str,
        want: &[&str],
    ) -> Result<(u32, usize), BtfError> {
        let func = attach.function(hook);
        let (id, proto) = self
            .types
            .iter()
            .enumerate()
            .find_map(|(id, t)| match t {
                Ty::Func { name, proto } if self.name(*name) == func => Some((id as u32, *proto)),
                _ => None,
            })
            .ok_or_else(|| BtfError::NoHook {
                hook: hook.into(),
                function: func.clone(),
            })?;
        let Ty::Proto { params } = self.ty(proto) else {
            return Err(BtfError::NoHook {
                hook: hook.into(),
                function: func,
            });
        };
        let found: Vec<String> = params.iter().map(|p| self.type_name(*p)).collect();
        if found.len() < want.len() || found.iter().zip(want).any(|(f, w)| f != w) {
            return Err(BtfError::HookSignature {
                function: func,
                found: found.join(", "),
                want: want.join(", "),
            });
        }
        Ok((id, found.len()))
    }
}

/// The kernel function a guard program attaches to for an LSM hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookFunction {
    /// `bpf_lsm_<hook>`: the BPF LSM's own hook, called only where `bpf` is an active LSM.
    BpfLsm,
    /// `security_<hook>`: the function every caller of the hook goes through, whatever LSMs
    /// are active (an `fmod_ret` program there replaces its return value).
    Security,
}

impl HookFunction {
    pub fn function(self, hook: &str) -> String {
        match self {
            HookFunction::BpfLsm => format!("bpf_lsm_{hook}"),
            HookFunction::Security => format!("security_{hook}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's BTF: every offset the guard needs resolves, at its size, and
    /// each hook has the signature the guard reads. Runs wherever the kernel has BTF (this
    /// project's machines all do; so does every Debian kernel since 5.x).
    #[test]
    fn the_running_kernel_has_every_member_and_hook_the_guard_reads() {
        let btf = KernelBtf::load(Path::new(VMLINUX)).expect("kernel BTF");
        let off = super::super::kernel_offsets(&btf).expect("offsets");
        assert!(
            off.task_mm > 0 && off.inode_sb > 0 && off.skb_data > 0,
            "{off:?}"
        );
        for (_, hook, args) in super::super::HOOK_SIGNATURES {
            let (_, n) = btf
                .check_hook_at(HookFunction::BpfLsm, hook, args)
                .expect(hook);
            assert!(n >= args.len());
            // The fmod_ret guard's attach point takes the same leading arguments.
            let (id, m) = btf
                .check_hook_at(HookFunction::Security, hook, args)
                .expect(hook);
            assert!(
                id > 0 && m >= args.len(),
                "security_{hook}: id {id}, {m} args"
            );
        }
        let (_, n) = btf
            .check_hook_at(HookFunction::BpfLsm, "bpf", &["int"])
            .unwrap();
        assert!(n == 3 || n == 4, "bpf hook arity {n}");
    }

    #[test]
    fn a_wrong_signature_or_member_is_named() {
        let btf = KernelBtf::load(Path::new(VMLINUX)).expect("kernel BTF");
        let e = btf
            .check_hook_at(HookFunction::BpfLsm, "file_open", &["struct inode *"])
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("`bpf_lsm_file_open` takes (struct file *)"),
            "{e}"
        );
        let e = btf.offset("inode", "i_nonexistent", 8).unwrap_err();
        assert!(e.to_string().contains("`i_nonexistent`"), "{e}");
        let e = btf.offset("inode", "i_ino", 4).unwrap_err();
        assert!(e.to_string().contains("is 8 bytes"), "{e}");
        let e = KernelBtf::parse(&[0u8; 30]).err().unwrap();
        assert!(e.to_string().contains("byte offset 0"), "{e}");
    }
}
