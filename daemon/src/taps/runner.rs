//! The tap's thread: it reads the ring without pause, and at each statement commits the
//! epoch (cut, records, sum tree, spool) when the epoch loop asks.
//!
//! A reader that falls behind only lets the ring fill, and the policer then drops (fail
//! closed). A reader that stops (the daemon is down) leaves the frames in the pinned ring for
//! the next start; what it read and never committed shows as unaccounted.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::Duration,
};

use rackwarden_attest::traffic::{SpoolState, SumTree, TrafficSummary};

use super::{TapError, TapReader, records::RecordMaker, spool::TapSpool, summary};
use crate::{
    config::taps::TapsConfig,
    pins::{PinPaths, StatePaths},
};

/// What `rackwarden status` shows of the tap.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TapStatus {
    /// Frame bytes read into the epoch in progress, egress and ingress.
    pub tapped_bytes: [u64; 2],
    /// Payload bytes held in memory for the epoch in progress.
    pub buffered_bytes: u64,
    /// Bytes in the spool of committed records.
    pub spool_bytes: u64,
    pub spool_limit: u64,
    /// The last committed epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<LastCommit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LastCommit {
    pub seq: u64,
    pub records: u64,
    pub root: String,
    pub tapped_bytes: [u64; 2],
    pub unaccounted_bytes: [u64; 2],
    pub dropped_frames: u64,
}

enum Command {
    Commit {
        seq: u64,
        reply: mpsc::Sender<Result<(TrafficSummary, SpoolState), TapError>>,
    },
}

pub struct TapHandle {
    tx: mpsc::Sender<Command>,
    status: Arc<Mutex<TapStatus>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How long a commit may take before the statement goes out saying the tap did not answer.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

impl TapHandle {
    /// Opens the tapped policer's ring under `pins` and starts reading it.
    pub fn start(
        pins: &PinPaths,
        state: &StatePaths,
        cfg: &TapsConfig,
    ) -> Result<TapHandle, TapError> {
        let reader = TapReader::open(pins, state.tap_cut(), cfg.spool_limit)?;
        let spool = TapSpool::open(state.tap_spool(), cfg.spool_limit)?;
        let maker = RecordMaker::new(cfg.inference.clone());
        let (tx, rx) = mpsc::channel();
        let status = Arc::new(Mutex::new(TapStatus {
            spool_limit: cfg.spool_limit,
            ..TapStatus::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (status.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("tap".into())
            .spawn(move || run(reader, spool, maker, rx, st, sp))
            .map_err(|e| TapError::Thread(e.to_string()))?;
        Ok(TapHandle {
            tx,
            status,
            stop,
            thread: Some(thread),
        })
    }

    /// Ends epoch `seq`: its records are committed, spooled and summarised for the
    /// statement.
    pub fn commit(&self, seq: u64) -> Result<(TrafficSummary, SpoolState), TapError> {
        let (reply, answer) = mpsc::channel();
        self.tx
            .send(Command::Commit { seq, reply })
            .map_err(|_| TapError::Thread("the tap thread has stopped".into()))?;
        answer.recv_timeout(COMMIT_TIMEOUT).map_err(|_| {
            TapError::Thread(format!(
                "no answer from the tap thread in {COMMIT_TIMEOUT:?}"
            ))
        })?
    }

    pub fn status(&self) -> TapStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for TapHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    mut reader: TapReader,
    mut spool: TapSpool,
    mut maker: RecordMaker,
    rx: mpsc::Receiver<Command>,
    status: Arc<Mutex<TapStatus>>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        reader.poll(Duration::from_millis(50));
        if let Ok(mut s) = status.lock() {
            s.tapped_bytes = reader.tapped_so_far();
            s.buffered_bytes = reader.buffered();
            s.spool_bytes = spool.bytes();
        }
        while let Ok(Command::Commit { seq, reply }) = rx.try_recv() {
            let result = commit(&mut reader, &mut spool, &mut maker, seq);
            if let Ok(mut s) = status.lock() {
                match &result {
                    Ok((sum, _)) => {
                        s.last = Some(LastCommit {
                            seq,
                            records: sum.root.records,
                            root: hex::encode(sum.root.sha3_256),
                            tapped_bytes: sum.root.bytes,
                            unaccounted_bytes: sum.unaccounted,
                            dropped_frames: summary::dropped_frames(sum),
                        });
                        s.error = None;
                    }
                    Err(e) => s.error = Some(e.to_string()),
                }
                s.spool_bytes = spool.bytes();
            }
            let _ = reply.send(result);
        }
    }
}

fn commit(
    reader: &mut TapReader,
    spool: &mut TapSpool,
    maker: &mut RecordMaker,
    seq: u64,
) -> Result<(TrafficSummary, SpoolState), TapError> {
    let epoch = reader.cut()?;
    let held = epoch
        .flows
        .iter()
        .fold([0, 0], |a, f| [a[0] + f.held[0], a[1] + f.held[1]]);
    let records = maker.records(seq, epoch.flows.clone());
    let leaves: Vec<_> = records.iter().map(|r| r.leaf).collect();
    let tree = SumTree::build(&leaves).map_err(|e| TapError::Records(e.to_string()))?;
    let root = tree.root();
    if root.bytes != epoch.tapped {
        // The records must carry every tapped byte; this is a bug, and the statement says so.
        return Err(TapError::Records(format!(
            "the records carry {:?} frame bytes but {:?} were tapped",
            root.bytes, epoch.tapped
        )));
    }
    let kept = spool.keep(seq, &records);
    Ok((summary::of(&epoch, root, held), kept))
}
