//! The panic handler every eBPF object needs (`no_std`). Nothing here can panic at run time:
//! the verifier rejects a program that could reach this loop.

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
