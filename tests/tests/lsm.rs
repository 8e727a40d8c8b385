//! `status` and every statement say whether BPF LSM is active. A host that booted with `bpf`
//! in its LSM list but has no securityfs mounted must not read as "not active": the daemon
//! mounts securityfs and reads the real list.

use std::process::Command;

use rackwarden::lsm::{LsmList, bpf_lsm_active};

#[test]
fn the_lsm_list_is_read_even_where_securityfs_is_not_mounted() {
    rackwarden_tests::require_root();
    let here = LsmList::read();
    let LsmList::Active(list) = &here else {
        panic!("this host's LSM list is unreadable: {here:?}");
    };
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "lsm_child_without_securityfs",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env("RW_LSM_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = format!(
        "RW_LSM_CHILD bpf_lsm_active={}",
        list.iter().any(|l| l == "bpf")
    );
    assert!(
        text.contains(&want),
        "want {want:?} (host list {list:?}), child said:\n{text}"
    );
}

/// In a mount namespace of its own, with securityfs unmounted there: what the daemon reads.
#[test]
#[ignore = "a child of the_lsm_list_is_read_even_where_securityfs_is_not_mounted"]
fn lsm_child_without_securityfs() {
    if std::env::var_os("RW_LSM_CHILD").is_none() {
        return;
    }
    // SAFETY: unshare(2) with no pointers: this thread gets a mount namespace of its own.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS) }, 0, "unshare");
    let st = Command::new("mount")
        .args(["--make-rprivate", "/"])
        .status()
        .unwrap();
    assert!(st.success());
    // Unmount every securityfs stacked there.
    while std::path::Path::new("/sys/kernel/security/lsm").exists() {
        let st = Command::new("umount")
            .arg("/sys/kernel/security")
            .status()
            .unwrap();
        assert!(st.success(), "umount /sys/kernel/security");
    }
    println!("RW_LSM_CHILD bpf_lsm_active={}", bpf_lsm_active());
}
