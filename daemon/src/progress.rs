//! A progress line on stderr for long digests and wipes, shown only when stderr is a terminal.

use std::{
    io::Write,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub struct Progress {
    pub done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts drawing `label: x / total (GB/s)` every 200 ms if stderr is a terminal.
    pub fn start(label: String, total: u64) -> Progress {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let handle = tty.then(|| {
            let (done, stop) = (done.clone(), stop.clone());
            std::thread::spawn(move || {
                let t0 = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let d = done.load(Ordering::Relaxed);
                    let pct = if total == 0 {
                        100.0
                    } else {
                        100.0 * d as f64 / total as f64
                    };
                    let rate = d as f64 / t0.elapsed().as_secs_f64().max(1e-9) / 1e9;
                    let width = 30usize;
                    let filled = ((pct / 100.0) * width as f64) as usize;
                    eprint!(
                        "\r{label}: [{}{}] {pct:5.1}% {rate:.2} GB/s ",
                        "#".repeat(filled.min(width)),
                        " ".repeat(width - filled.min(width))
                    );
                    let _ = std::io::stderr().flush();
                    std::thread::sleep(Duration::from_millis(200));
                }
                eprint!("\r{}\r", " ".repeat(label.len() + 60));
            })
        });
        Progress { done, stop, handle }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
