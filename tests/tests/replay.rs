//! Replay end to end (needs root: network namespaces, BPF): the reference server serves the
//! bundled model on a tapped rack; the tap commits the exchanges, the verifier samples them,
//! the daemon opens them, the replay service reruns the model over each, and the next
//! statement's verdict has a `replay` aspect. Not in a VM group: the model and the
//! repository's docs it is trained on live on the host, and its binary (candle) would crowd
//! the guests' memory.

use rackwarden_tests::{tapped::TappedRack, *};

/// Issue 28, end to end: the reference server serves the bundled model on the rack, seeded
/// from the daemon's sampling key; the tap commits the exchanges, the verifier samples them,
/// the daemon opens them, the replay service reruns the model over each, and the next
/// statement's verdict has a `replay` aspect. Honest exchanges pass; a response served for
/// another request fails at its seed and a response with bytes appended fails at the byte
/// its tokens do not determine, each named by record.
#[test]
fn served_exchanges_are_replayed_and_forged_ones_fail_with_their_findings() {
    use rackwarden_sampler::verdict::{ExchangeReplay, StructuralFinding};
    use rackwarden_tests::serving::{
        ask, bundled_model, completion_request, replay_pending, serve_in,
    };
    let model_dir = bundled_model();
    let net = Net::new("replay");
    let (r, _d) = TappedRack::start(&net, 64);
    let key_file = r.sock.parent().unwrap().join("sampling-key.json");

    // The honest server: three connections on port 8000, in the rack's namespace.
    let served = serve_in(&net.rack_ns, &model_dir, key_file, 8000, 3);
    let honest = ask(&net, 8000, completion_request("The verifier draws", 32));
    assert!(
        honest.starts_with(b"HTTP/1.1 200 OK\r\n"),
        "{}",
        String::from_utf8_lossy(&honest)
    );
    ask(&net, 8000, completion_request("The daemon opens", 32));
    let third = ask(
        &net,
        8000,
        completion_request("Every byte is committed", 32),
    );
    served.join().expect("the server");
    // A dishonest host on port 8001: the first response answering another request, and the
    // third with bytes appended.
    http_exchange(
        &net,
        8001,
        completion_request("A different prompt", 32),
        honest.clone(),
    );
    let mut appended = third.clone();
    appended.extend_from_slice(b"\x00hidden");
    http_exchange(
        &net,
        8001,
        completion_request("Every byte is committed", 32),
        appended,
    );

    r.epoch(1);
    r.openings(1);
    assert_eq!(replay_pending(&r.verifier.database(), &model_dir), 1);
    let store = rackwarden_verifier::store::Store::connect(&r.verifier.database()).unwrap();
    let row = store
        .replay(&r.rack, &r.host, 1)
        .unwrap()
        .expect("replayed");
    println!("replay of epoch 1: {} records", row.records.len());
    let (mut passed, mut seed, mut unrequested) = (0, 0, 0);
    for rec in &row.records {
        println!(
            "  record {}: {}",
            rec.index,
            serde_json::to_string(&rec.replay)
                .unwrap()
                .chars()
                .take(200)
                .collect::<String>()
        );
        match &rec.replay {
            ExchangeReplay::Replayed { trailing, .. } => {
                assert!(
                    trailing.is_empty(),
                    "an honest response trails: {trailing:?}"
                );
                passed += 1;
            }
            ExchangeReplay::Failed {
                finding: StructuralFinding::SeedNotDerived { .. },
            } => seed += 1,
            // The tap cut the response where its content-length ends: the appended bytes
            // are the connection's rest, sent with no request pending.
            ExchangeReplay::Failed {
                finding: StructuralFinding::UnrequestedOutput { bytes },
            } => {
                assert_eq!(*bytes, 7, "the appended bytes");
                unrequested += 1
            }
            other => panic!("record {}: {other:?}", rec.index),
        }
    }
    assert_eq!(
        (passed, seed, unrequested),
        (4, 1, 1),
        "every exchange was opened and replayed"
    );

    // The next statement judges the replay: contraindicated, each forged record named.
    r.epoch(2);
    let result = &r.stored(2)["result"];
    println!("seq 2 verdict: {:#}", result["trustworthiness"]);
    assert_eq!(
        result["trustworthiness"]["replay"], "contraindicated",
        "{result:#}"
    );
    let details: Vec<String> = result["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "replay_failed")
        .map(|f| f["detail"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(details.len(), 2, "{details:?}");
    assert!(details.iter().any(|d| d.contains("seed")), "{details:?}");
    assert!(
        details.iter().any(|d| d.contains("no request pending")),
        "{details:?}"
    );
    // The rack's page says what the replay found for the epoch.
    let page = r
        .verifier
        .get_text(&format!("/racks/{}", r.rack))
        .expect("the rack page");
    let line = page
        .lines()
        .find(|l| l.contains("last replayed epoch"))
        .unwrap_or_else(|| panic!("no replay line on the page:\n{page}"));
    println!("page: {line}");
    assert!(
        line.contains(
            "replayed 6 opened records: 2 failed, 0 in flight and not judged, 4 completions passed (128 tokens"
        ),
        "{line}"
    );
}
