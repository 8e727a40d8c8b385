//! A rack host with the tap and a verifier that requires it (the taps and replay suites):
//! the verifier draws `samples` offsets per direction, the daemon taps its veth with
//! `tcp:8000` and `tcp:8001` as inference endpoints, its first epoch delivered.

use std::{
    thread,
    time::{Duration, Instant},
};

use crate::{Daemon, Net};

/// A verifier requiring taps and drawing `samples` offsets per direction, and a daemon
/// tapping its veth with `tcp:8000` as the inference endpoint, its first epoch delivered.
pub struct TappedRack {
    _fx: crate::epoch::EpochFixture,
    pub verifier: crate::epoch::Verifier,
    pub cfg: std::path::PathBuf,
    pub sock: std::path::PathBuf,
    pub rack: String,
    pub host: String,
}

impl TappedRack {
    pub fn start(net: &Net, samples: u32) -> (TappedRack, Daemon) {
        use crate::epoch::{EpochFixture, Verifier, ids, wait_epoch, write_epoch_config};
        let fx = EpochFixture::new(&net.dir, 1 << 20);
        let mut verifier = Verifier::configure(net, &fx.manifest, &fx.verifier_pub, "64 GiB");
        verifier.extend_config(
            "",
            &format!("[policy.taps]\nrequired = true\nsamples = {samples}\n"),
        );
        let (rack, host) = ids(net);
        verifier.enroll(&rack, &host, &fx.host_pub);
        verifier.start();
        let mut sections = fx.sections(&verifier.daemon_lines(), "1 h", "32 MiB");
        sections +=
            "\n[taps]\ninference = [\"tcp:8000\", \"tcp:8001\"]\nspool_limit = \"64 MiB\"\n";
        let cfg = write_epoch_config(net, &sections);
        let sock = net.socket_path();
        let d = Daemon::start(&cfg, &sock);
        wait_epoch(&sock, Duration::from_secs(60), "seq 0 delivered", |e| {
            e["delivery"]["delivered_seq"] == 0
        });
        let rack = TappedRack {
            _fx: fx,
            verifier,
            cfg,
            sock,
            rack,
            host,
        };
        (rack, d)
    }

    /// Forces an epoch and waits for the verifier to acknowledge statement `seq`.
    pub fn epoch(&self, seq: u64) {
        crate::epoch::wipe_now(&self.sock);
        crate::epoch::wait_epoch(
            &self.sock,
            Duration::from_secs(60),
            &format!("seq {seq} delivered"),
            |e| e["delivery"]["delivered_seq"] == seq,
        );
    }

    /// The stored statement at `seq`, as the history API gives it.
    pub fn stored(&self, seq: usize) -> serde_json::Value {
        self.verifier.history(&self.rack, &self.host)[seq].clone()
    }

    /// The finding codes of the stored statement at `seq`.
    pub fn codes(&self, seq: usize) -> Vec<String> {
        self.stored(seq)["result"]["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| f["code"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// The openings the verifier received for epoch `seq`, waited for up to a minute, and
    /// matched.
    pub fn openings(&self, seq: u64) -> rackwarden_verifier::store::OpeningsRow {
        let store = rackwarden_verifier::store::Store::connect(&self.verifier.database()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(h) = store.openings(&self.rack, &self.host, seq).unwrap() {
                assert!(
                    matches!(
                        h.outcome,
                        rackwarden_attest::traffic::OpeningsOutcome::Matched { .. }
                    ),
                    "seq {seq}: {:?}",
                    h.outcome
                );
                return h;
            }
            assert!(
                Instant::now() < deadline,
                "no openings for seq {seq} after 60 s"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
}
