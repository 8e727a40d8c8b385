//! The kernel's active LSMs: whether BPF LSM can hold the guard's programs, and what
//! `status` and statements report of it. A leaf of its own because both the guard (which
//! picks its program type by it) and the limiter's protection report read it.

const SECURITYFS: &str = "/sys/kernel/security";
const LSM_LIST: &str = "/sys/kernel/security/lsm";

/// The kernel's active LSMs, as `/sys/kernel/security/lsm` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LsmList {
    Active(Vec<String>),
    /// The list could not be read, even after mounting securityfs: why.
    Unreadable(String),
}

impl LsmList {
    /// Reads the list, mounting securityfs first where nothing is mounted on it (minimal
    /// hosts and guests boot without it, and an empty directory there reads as "no LSM").
    pub fn read() -> LsmList {
        if let Ok(text) = std::fs::read_to_string(LSM_LIST) {
            return LsmList::parse(&text);
        }
        if let Err(e) = nix::mount::mount(
            Some("securityfs"),
            SECURITYFS,
            Some("securityfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        ) {
            return LsmList::Unreadable(format!(
                "{LSM_LIST} is missing and securityfs cannot be mounted on {SECURITYFS}: {e}"
            ));
        }
        log::info!("securityfs was not mounted; mounted it on {SECURITYFS} to read the LSM list");
        match std::fs::read_to_string(LSM_LIST) {
            Ok(text) => LsmList::parse(&text),
            Err(e) => LsmList::Unreadable(format!("{LSM_LIST}: {e}")),
        }
    }

    fn parse(text: &str) -> LsmList {
        LsmList::Active(
            text.trim()
                .split(',')
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }

    pub fn has_bpf(&self) -> bool {
        matches!(self, LsmList::Active(l) if l.iter().any(|l| l == "bpf"))
    }
}

/// Whether `bpf` is an active LSM (`/sys/kernel/security/lsm`, securityfs mounted if needed).
pub fn bpf_lsm_active() -> bool {
    LsmList::read().has_bpf()
}

#[cfg(test)]
mod tests {
    use super::LsmList;

    #[test]
    fn the_lsm_list_is_read_as_the_kernel_writes_it() {
        let l = LsmList::parse("lockdown,capability,landlock,yama,bpf\n");
        assert!(l.has_bpf());
        assert!(!LsmList::parse("capability,yama").has_bpf());
        assert!(!LsmList::Unreadable("x".into()).has_bpf());
    }
}
