//! The auditor's pages as server-rendered HTML (maud escapes every value it interpolates:
//! rack and host ids, finding text, anything a host controls). No script; the page reloads
//! itself every 30 s. Timelines are inline SVG.

use maud::{DOCTYPE, Markup, PreEscaped, html};
use rackwarden_attest::{
    traffic::{EpochStart, SpoolState, TrafficReport},
    units::{fmt_bytes, fmt_duration, fmt_rate, fmt_size, fmt_unix_ms},
};

use super::{
    inventory::{Disclosure, VERIFIER_HOLDS},
    scorecard::{InferenceOverhead, SLOWDOWN_TARGET, TrainingBound},
    view::{EpochPoint, HostView, RackView, RootOfTrustView},
};
use crate::appraisal::{Status, state_bound::StateBound, traffic::drops_detail};

const STYLE: &str = r#"
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1b1f24;max-width:1100px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px} h3{font-size:15px;margin:18px 0 6px}
.meta{color:#57606a} table{border-collapse:collapse} td,th{padding:3px 10px 3px 0;text-align:left;vertical-align:top}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;font-weight:600;color:#fff}
.affirming{background:#1a7f37}.warning{background:#9a6700}.contraindicated{background:#cf222e}
.cards{display:flex;gap:14px;flex-wrap:wrap}.card{border:1px solid #d0d7de;border-radius:8px;padding:12px 14px;flex:1 1 300px}
.number{font-size:26px;font-weight:700}.math{font-family:ui-monospace,monospace;font-size:12px;color:#24292f;white-space:pre-wrap}
.legend{list-style:none;padding:0;margin:2px 0 8px;display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12px;color:#57606a}
.swatch{display:inline-block;width:10px;height:10px;margin:0 4px 0 2px;border-radius:2px;vertical-align:middle}
.finding code{font-weight:600}.why{color:#57606a}.host{border-top:1px solid #d0d7de;margin-top:18px}
"#;

fn percent_path(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn badge(s: Status) -> Markup {
    html! { span class={"badge " (s.name())} { (s.name()) } }
}

fn page(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="refresh" content="30";
                title { (title) }
                style { (PreEscaped(STYLE)) }
            }
            body { (body) }
        }
    }
}

/// `/`: every rack and its verdict.
pub fn index(racks: &[(String, Status, usize)], policy_id: &str, now_ms: u64) -> Markup {
    page(
        "rackwarden verifier",
        html! {
            h1 { "Racks" }
            p.meta { "policy " (policy_id) " · " (fmt_unix_ms(now_ms)) " · reloads every 30 s" }
            table #racks {
                tr { th { "rack" } th { "verdict" } th { "hosts" } }
                @for (rack, status, hosts) in racks {
                    tr data-rack=(rack) {
                        td { a href={"/racks/" (percent_path(rack))} { (rack) } }
                        td.verdict data-status=(status.name()) { (badge(*status)) }
                        td { (hosts) }
                    }
                }
            }
            @if racks.is_empty() { p { "No rack has an agreement or an enrolled host yet." } }
        },
    )
}

fn factor(x: f64) -> String {
    if !x.is_finite() {
        "∞".into()
    } else if x >= 100.0 {
        format!("{x:.0}×")
    } else {
        format!("{x:.3}×")
    }
}

/// The state bound the rack's verdict is judged by (`appraisal::state_bound`), term by term:
/// the card and the verdict read the same value, so they cannot disagree.
fn state_card(b: &StateBound, policy: &crate::config::Policy) -> Markup {
    use crate::appraisal::state_bound::PersistentTerm;
    let total = b.total_bytes;
    let mut math = String::new();
    for h in &b.hosts {
        math.push_str(&format!("{}:\n", h.host));
        if h.memory.is_none() {
            math.push_str("  no wipe reported in its last statement: its memory is NOT bounded\n");
        }
        for (name, bytes) in h.terms() {
            math.push_str(&format!("  {name:<34} {}\n", fmt_size(bytes)));
        }
        match &h.persistent {
            PersistentTerm::NotReported => math.push_str(
                "  no storage inventory (the policy does not require one): its disks are not in this bound\n",
            ),
            PersistentTerm::Counted { excluded, .. } => {
                for (label, bytes, why) in excluded {
                    math.push_str(&format!(
                        "  of which excluded from max_residue_persistent by the operator, counted here all the same: {label} {} ({why})\n",
                        fmt_size(*bytes)
                    ));
                }
            }
        }
        if let Some(t) = h.total_bytes() {
            math.push_str(&format!("  = {}\n", fmt_size(t)));
        }
    }
    math.push_str(&format!(
        "rack: {}; policy allows max_epoch_fraction x trainable_state = {} x {} = {}",
        total.map_or("unbounded".to_string(), fmt_size),
        policy.max_epoch_fraction,
        fmt_size(policy.trainable_state_bytes),
        fmt_size(b.limit_bytes)
    ));
    html! {
        div.card #score-state {
            h3 { "State that can survive from one wipe to the next" }
            p.number data-value=(total.map_or("unbounded".to_string(), |t| t.to_string())) {
                (total.map_or("unbounded".to_string(), fmt_size))
            }
            p { @match b.fraction_of(policy.trainable_state_bytes) {
                    Some(f) => { (format!("{f:.6}")) " of the trainable state; the policy allows " (policy.max_epoch_fraction) ": " }
                    None => { "the policy allows " (policy.max_epoch_fraction) " of the trainable state: " }
                }
                strong #state-verdict { @if b.exceeded() { "EXCEEDED: the rack is contraindicated" } @else { "within the policy" } } }
            div.math { (math) }
        }
    }
}

fn training_card(t: &Option<TrainingBound>) -> Markup {
    html! {
        div.card #score-training {
            h3 { "1. Training slowdown bound" }
            @match t {
                None => { p.number data-value="" { "no data" } p { "No host has reported the caps it enforces yet." } },
                Some(t) => {
                    p.number data-value=(format!("{:.0}", t.slowdown_factor)) { (factor(t.slowdown_factor)) }
                    p { "slower than over the reference interconnect; target ≥ " (factor(SLOWDOWN_TARGET)) ": "
                        strong { @if t.meets_target { "met" } @else { "NOT met" } } }
                    div.math { (format!(
"enforced caps (sum of hosts' last statements): egress {}, ingress {}
fastest measured epoch (sum over hosts):        {}
rate r = max(caps, measured)                  = {}
reference interconnect R (policy)             = {}
slowdown = R / r = {} / {}                     = {}
time to move the trainable state S = {} through r: S / r = {}
largest ingress one host measured in one epoch = {}",
                        fmt_rate(t.egress_caps_bytes_per_s as f64), fmt_rate(t.ingress_caps_bytes_per_s as f64),
                        fmt_rate(t.measured_peak_bytes_per_s.round()),
                        fmt_rate(t.rate_bytes_per_s.round()),
                        fmt_rate(t.reference_bytes_per_s as f64),
                        fmt_rate(t.reference_bytes_per_s as f64), fmt_rate(t.rate_bytes_per_s.round()), factor(t.slowdown_factor),
                        fmt_bytes(t.state_bytes as f64), fmt_duration(std::time::Duration::from_secs_f64(t.time_to_move_state_s.min(1e12))),
                        fmt_bytes(t.measured_max_epoch_ingress_bytes as f64),
                    )) }
                }
            }
        }
    }
}

fn inference_card(i: &Option<InferenceOverhead>, forced: &Option<InferenceOverhead>) -> Markup {
    html! {
        div.card #score-inference {
            h3 { "2. Inference overhead" }
            @match i {
                None => { p.number data-value="" { "no data" } p { "No scheduled epoch in the window reports its downtime." } },
                Some(i) => {
                    p.number data-value=(format!("{:.4}", i.fraction * 100.0)) { (format!("{:.3}%", i.fraction * 100.0)) }
                    p { "of the time inference was stopped for scheduled wipes: serving takes " (factor(i.factor)) " as long" }
                    div.math { (format!(
"downtime / wipe interval over the last {} scheduled epochs (all hosts)
  = {} / {} = {:.6}
factor = elapsed / (elapsed − downtime) = {}
the limiter's own cost is not in the statements: not counted here",
                        i.epochs, fmt_ms(i.downtime_ms), fmt_ms(i.elapsed_ms), i.fraction, factor(i.factor))) }
                }
            }
            @match forced {
                None => { p.meta { "No forced epoch (wipe-now, or redone after an interruption) in the window." } },
                Some(f) => {
                    p #score-inference-forced data-value=(format!("{:.4}", f.fraction * 100.0)) data-epochs=(f.epochs) {
                        "Apart from the schedule: " (count(f.epochs, "forced epoch", "forced epochs"))
                        " (wipe-now, or redone after an interruption) stopped inference for " (fmt_ms(f.downtime_ms))
                        " of " (fmt_ms(f.elapsed_ms)) " (" (format!("{:.3}%", f.fraction * 100.0)) ")."
                    }
                }
            }
        }
    }
}

/// `1 host`, `2 hosts`.
fn count(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

fn fmt_ms(ms: u64) -> String {
    fmt_duration(std::time::Duration::from_millis(ms))
}

fn secrets_card(v: &RackView) -> Markup {
    let inv = &v.inventory;
    html! {
        div.card #score-secrets {
            h3 { "3. Secrets shared" }
            p.number data-value=(inv.fields) { (inv.fields) " fields" }
            p { "are all a statement can carry, each a name, digest, nonce, counter, time, setting or diagnostic line. "
                strong { "No statement carries weights, prompts or outputs" } ": images appear only as their Merkle SHA3-256 digest." }
            @if v.policy.taps.samples > 0 {
                p #openings-disclosure { strong { "Openings do." } " On hosts with taps, the records the verifier samples ("
                    (v.policy.taps.samples) " byte offsets per direction of each epoch, so whole prompts and responses among them) are sent to the verifier and kept for "
                    (rackwarden_attest::units::fmt_duration(v.policy.taps.keep_openings)) ", then deleted; only their digests and outcomes stay." }
            }
            p.math { "shared secrets: none. The host holds its ed25519 signing key; the verifier holds only public keys." }
            p { strong { "Fields that can point at people or processes" } " (what they are for):" }
            ul #identifying-fields {
                @for (field, what, why) in IDENTIFYING {
                    li { code { (field) } ": " (what) ". " span.why { (why) } }
                }
            }
            @if !inv.unclassified.is_empty() {
                p { strong { "Unclassified fields: " } (inv.unclassified.join(", ")) }
            }
        }
    }
}

/// Statement fields that can identify a person or a process on the host: what each can
/// reveal, and why the statement carries it.
const IDENTIFYING: [(&str, &str, &str); 4] = [
    (
        "last_tgid",
        "the process id of the last process refused a path around the policer",
        "so an operator can find who tried to bypass the cap",
    ),
    (
        "last_cgroup_id",
        "the cgroup (service, container or user session) of that process",
        "so the refusal can be tied to a workload",
    ),
    (
        "cgroup",
        "the cgroup path the refusal programs are attached to (it can name a service or a user slice)",
        "so a verifier can tell whether they cover the workloads or only a test cgroup",
    ),
    (
        "detail, reason, finding",
        "free text the daemon wrote (it can quote paths, device names or commands)",
        "to say why something failed or was refused; nothing else is put in it",
    ),
];

const EGRESS: &str = "#0969da";
const INGRESS: &str = "#1f883d";
const OVER: &str = "#cf222e";
const DOWNTIME: &str = "#9a6700";
const IDLE: &str = "#8c959f";

fn status_colour(s: Status) -> &'static str {
    match s {
        Status::Affirming => "#1a7f37",
        Status::Warning => DOWNTIME,
        Status::Contraindicated => OVER,
    }
}

/// The seqs the x axis labels: the first, the last, and one between when there is room.
fn axis_ticks(epochs: &[EpochPoint]) -> Vec<(usize, &EpochPoint)> {
    let mut idx = vec![0, epochs.len() / 2, epochs.len().saturating_sub(1)];
    idx.dedup();
    idx.into_iter()
        .filter_map(|i| Some((i, epochs.get(i)?)))
        .collect()
}

/// The epoch that used the most of its agreed bound, either direction: its bytes and share.
fn peak_share(epochs: &[EpochPoint]) -> Option<(u64, f64)> {
    epochs
        .iter()
        .flat_map(|e| {
            [
                e.egress_bytes.zip(e.agreed_egress_bound),
                e.ingress_bytes.zip(e.agreed_ingress_bound),
            ]
        })
        .flatten()
        .filter(|(b, _)| *b > 0)
        .map(|(b, m)| (b, b as f64 / m.max(1.0)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

fn svg_timeline(epochs: &[EpochPoint]) -> Markup {
    let n = epochs.len().max(1) as f64;
    let (w, top, band) = (720.0f64, 18.0f64, 72.0f64);
    let col = (w - 20.0) / n;
    let y_of = |ratio: f64| top + band - ratio.min(1.25) * band / 1.0 * 0.8;
    html! {
        svg.timeline xmlns="http://www.w3.org/2000/svg" width=(w) height="190" viewBox={"0 0 " (w) " 190"} role="img" {
            title { "bytes passed per epoch against the agreed cap × elapsed + burst; wipe downtime below; x: seq" }
            line x1="10" x2=(w - 10.0) y1=(y_of(1.0)) y2=(y_of(1.0)) stroke=(OVER) stroke-dasharray="4 3" {}
            text x="12" y=(y_of(1.0) - 3.0) font-size="10" fill=(OVER) { "agreed bound (100%)" }
            line x1="10" x2=(w - 10.0) y1=(top + band) y2=(top + band) stroke=(IDLE) {}
            text x=(w - 12.0) y=(top + band - 3.0) font-size="10" fill="#57606a" text-anchor="end" { "0% of the bound" }
            @if let Some((bytes, ratio)) = peak_share(epochs) {
                // At low traffic the bars are a few pixels: the largest one, in words.
                text.peak x=(w - 12.0) y=(top - 4.0) font-size="10" fill="#57606a" text-anchor="end" {
                    "largest epoch: " (fmt_size(bytes)) ", " (format!("{:.3}", ratio * 100.0)) "% of its bound" }
            }
            @for (i, e) in epochs.iter().enumerate() {
                @let x = 10.0 + i as f64 * col;
                @let eg = e.egress_bytes.zip(e.agreed_egress_bound).map(|(b, m)| b as f64 / m.max(1.0));
                @let ing = e.ingress_bytes.zip(e.agreed_ingress_bound).map(|(b, m)| b as f64 / m.max(1.0));
                @let down = e.downtime_ms.filter(|_| e.duration_ms > 0).map(|d| d as f64 / e.duration_ms as f64);
                g.epoch data-seq=(e.seq) data-status=(e.status.name()) data-idle=(e.idle()) {
                    title { (epoch_tooltip(e, eg, ing, down)) }
                    @if e.missing_before > 0 {
                        rect.gap x=(x - 1.0) y=(top - 10.0) width="2" height=(band + 14.0) fill=(OVER) {}
                        text x=(x + 2.0) y=(top - 2.0) font-size="9" fill=(OVER) { (e.missing_before) " missing" }
                    }
                    @if e.idle() {
                        rect.idle x=(x + col * 0.1) y=(top + band - 3.0) width=(col * 0.78) height="3" fill=(IDLE) {}
                    }
                    // A bar is at least 2 px tall when anything passed: traffic far below
                    // the bound still shows as a bar, not as nothing.
                    @if let Some(r) = eg.filter(|_| !e.idle()) {
                        @let h = (top + band - y_of(r)).max(if r > 0.0 { 2.0 } else { 0.0 });
                        rect x=(x + col * 0.1) y=(top + band - h) width=(col * 0.38) height=(h) fill=(if r > 1.0 { OVER } else { EGRESS }) {}
                    }
                    @if let Some(r) = ing.filter(|_| !e.idle()) {
                        @let h = (top + band - y_of(r)).max(if r > 0.0 { 2.0 } else { 0.0 });
                        rect x=(x + col * 0.5) y=(top + band - h) width=(col * 0.38) height=(h) fill=(if r > 1.0 { OVER } else { INGRESS }) {}
                    }
                    @if let Some(d) = down {
                        rect x=(x + col * 0.1) y="104" width=(col * 0.78) height=(d.min(1.0) * 30.0 + 0.5) fill=(DOWNTIME) {}
                    }
                    circle cx=(x + col * 0.5) cy="142" r=(col.min(8.0) * 0.4) fill=(status_colour(e.status)) {}
                }
            }
            text x="12" y="100" font-size="10" fill="#57606a" { "wipe downtime / epoch" }
            g.axis.x data-axis="seq" {
                line x1="10" x2=(w - 10.0) y1="154" y2="154" stroke=(IDLE) {}
                @for (i, e) in axis_ticks(epochs) {
                    @let x = 10.0 + (i as f64 + 0.5) * col;
                    @let anchor = if i == 0 && epochs.len() > 1 { "start" } else if i + 1 == epochs.len() && i > 0 { "end" } else { "middle" };
                    line x1=(x) x2=(x) y1="154" y2="158" stroke=(IDLE) {}
                    text x=(x) y="169" font-size="10" fill="#57606a" text-anchor=(anchor) { "seq " (e.seq) }
                    text x=(x) y="182" font-size="9" fill="#57606a" text-anchor=(anchor) { (fmt_unix_ms(e.end_ms)) }
                }
            }
        }
        ul.legend {
            li { span.swatch style={"background:" (EGRESS)} {} "egress bytes / agreed bound" }
            li { span.swatch style={"background:" (INGRESS)} {} "ingress bytes / agreed bound" }
            li { span.swatch style={"background:" (OVER)} {} "over the agreed bound" }
            li { span.swatch style={"background:" (IDLE)} {} "idle epoch (nothing passed)" }
            li { span.swatch style={"background:" (DOWNTIME)} {} "wipe downtime / epoch time" }
            li { span.swatch style={"background:" (OVER)} {} "| n missing: seqs that never arrived" }
            li { "dot: the epoch's verdict (" span.swatch style={"background:" (status_colour(Status::Affirming))} {} "affirming "
                span.swatch style={"background:" (status_colour(Status::Warning))} {} "warning "
                span.swatch style={"background:" (status_colour(Status::Contraindicated))} {} "contraindicated)" }
            li { "x axis: seq, with each labelled epoch's end (UTC)" }
        }
    }
}

fn epoch_tooltip(e: &EpochPoint, eg: Option<f64>, ing: Option<f64>, down: Option<f64>) -> String {
    let mut s = format!(
        "seq {} ({}), {}",
        e.seq,
        fmt_unix_ms(e.end_ms),
        e.status.name()
    );
    if e.forked {
        s += ", FORK: another statement has this seq";
    }
    if e.missing_before > 0 {
        s += &format!(", {} seq(s) missing before it", e.missing_before);
    }
    if e.idle() {
        s += ", idle: nothing passed";
    }
    if e.forced() {
        s += ", forced (wipe-now, or redone after an interruption)";
    }
    for (dir, bytes, ratio, bound) in [
        ("egress", e.egress_bytes, eg, e.agreed_egress_bound),
        ("ingress", e.ingress_bytes, ing, e.agreed_ingress_bound),
    ] {
        if let (Some(b), Some(r), Some(m)) = (bytes, ratio, bound) {
            s += &format!(
                "; {dir} {} of {} ({:.1}% of the agreed bound)",
                fmt_bytes(b as f64),
                fmt_bytes(m.round()),
                r * 100.0
            );
        }
    }
    if let Some(hb) = e.host_egress_bound {
        s += &format!("; host's own egress bound {}", fmt_bytes(hb.round()));
    }
    if let (Some(d), Some(f)) = (e.downtime_ms, down) {
        s += &format!("; downtime {d} ms ({:.2}% of the epoch)", f * 100.0);
    }
    if let Some(t) = &e.traffic {
        s += &format!("; {}", traffic_line(t));
    }
    if let Some(sa) = &e.sampling {
        s += &format!("; {}", sampling_line(sa));
    }
    if let Some(r) = &e.replay {
        s += &format!("; {}", replay_line(r));
    }
    s
}

/// What the replay of an epoch's opened exchanges found: how many were replayed, how many
/// failed, and the covert channel the tolerance left in the ones that passed.
fn replay_line(r: &crate::appraisal::replay::ReplayFigures) -> String {
    format!(
        "replayed {} opened record{}: {} failed, {} in flight and not judged, {} completion{} passed ({} tokens; at most {:.2} bits could hide in them at tolerance {})",
        r.replayed,
        if r.replayed == 1 { "" } else { "s" },
        r.failed,
        r.unjudged,
        r.generated,
        if r.generated == 1 { "" } else { "s" },
        r.tokens,
        r.covert_bits,
        r.tolerance
    )
}

/// What was sampled of an epoch's traffic and what became of it.
fn sampling_line(sa: &crate::store::SampleAndAnswer) -> String {
    use rackwarden_attest::traffic::OpeningsOutcome;
    let d = &sa.sample.demand;
    let sampled = format!("sampled {} offsets per direction", d.per_direction);
    let late = |at: u64| {
        if at > d.deadline_ms {
            " after the deadline"
        } else {
            ""
        }
    };
    match &sa.answer {
        Some(a) => match &a.outcome {
            OpeningsOutcome::Matched { records, .. } => format!(
                "{sampled}: opened{}, {records} record{} matched",
                late(a.received_ms),
                if *records == 1 { "" } else { "s" }
            ),
            OpeningsOutcome::Refused { reason } => {
                format!(
                    "{sampled}: openings refused{}: {reason}",
                    late(a.received_ms)
                )
            }
        },
        None => format!(
            "{sampled}: no openings received (due by {})",
            fmt_unix_ms(d.deadline_ms)
        ),
    }
}

/// What an epoch's statement says its tap committed: the records, the bytes they cover per
/// direction, the bytes no record covers, and the tap's drops.
fn traffic_line(t: &TrafficReport) -> String {
    let (s, spool) = match t {
        TrafficReport::Failed { reason } => return format!("traffic not committed: {reason}"),
        TrafficReport::Committed { summary, spool } => (summary, spool),
    };
    let mut line = format!(
        "traffic committed: {} record{}, tapped egress {}, ingress {}; unaccounted egress {}, ingress {}; tap drops: {}",
        s.root.records,
        if s.root.records == 1 { "" } else { "s" },
        fmt_size(s.root.bytes[0]),
        fmt_size(s.root.bytes[1]),
        fmt_size(s.unaccounted[0]),
        fmt_size(s.unaccounted[1]),
        drops_detail(&s.tap_drops).unwrap_or_else(|| "none".into())
    );
    if s.start == EpochStart::FirstStart {
        line += "; the first epoch since the daemon started counting: bytes passed before it are in no epoch";
    }
    if let SpoolState::NotKept { reason } = spool {
        line += &format!("; records not kept, none can be opened: {reason}");
    }
    line
}

/// The host's root of trust: the level verified, what the host said, and what stays on the
/// daemon's word.
fn root_of_trust_line(r: &RootOfTrustView, boot_judged: bool) -> Markup {
    use rackwarden_attest::result::GuardBasis;
    use rackwarden_attest::tpm::{CmdlineWitness, MeasuredCmdline, RootOfTrust, TrustLevel};
    let level = r.verified.unwrap_or(TrustLevel::None);
    html! {
        p.root-of-trust data-level=(level.name()) {
            "root of trust: " strong { (level.name()) } " (verified by this verifier)"
            @match &r.claimed {
                Some(RootOfTrust::None { reason }) => { " · the host says it has none: " q { (reason) } }
                Some(RootOfTrust::Tpm { vendor, .. }) => { " · TPM vendor " code { (vendor.trim()) } }
                None => { " · the host states nothing" }
            }
            @if level == TrustLevel::None {
                " · everything on this host rests on its daemon's word: its signing key is readable by the host's root"
            } @else if !boot_judged && r.guard_sealed {
                " · boot not appraised (the policy names no reference PCRs or boot sets): the kernel, its command line (lsm=…bpf) and so the guard's sealed state rest on the daemon's word"
            } @else if !boot_judged {
                " · boot not appraised (the policy names no reference PCRs or boot sets): the kernel and its command line rest on the daemon's word; this host reports no sealed guard"
            }
            @if let Some((reset_count, seq, m)) = &r.boot {
                br;
                span.measured-boot {
                    "measured boot (event log replayed to the quoted PCRs 0-9 with statement " (seq) ", TPM resetCount " (reset_count) "): "
                    "started (PCR 4) "
                    @for (i, a) in m.applications.iter().enumerate() { @if i > 0 { " → " } code { (short(a)) } }
                    " · loaded (PCR 9) "
                    @for (i, l) in m.loaded.iter().enumerate() { @if i > 0 { ", " } code { (short(l)) } }
                    @match &m.cmdline {
                        MeasuredCmdline::Measured { cmdline, by } => {
                            " · command line " code { (cmdline) }
                            (match by { CmdlineWitness::EfiStub => " (measured by the kernel's EFI stub)", CmdlineWitness::Grub => " (measured by GRUB)" })
                        }
                        MeasuredCmdline::Mismatch { .. } => { " · command line: the host's does not hash to the measured one" }
                        MeasuredCmdline::NotMeasured => { " · command line not measured" }
                    }
                    " · Secure Boot " (match m.secure_boot.enabled { Some(true) => "on", Some(false) => "off", None => "not measured" })
                }
            }
            @if r.guard_sealed {
                br;
                span.guard-basis data-guard=(r.guard.map_or("daemon_word", |g| g.name())) {
                    @match r.guard {
                        Some(GuardBasis::ProvenByBoot) => { "guard sealed: proven by the boot (the TPM quoted a boot that runs it; IMA, the accepted daemon that sealed it)" }
                        Some(GuardBasis::ContradictedByBoot) => { "guard sealed, says the daemon: contradicted by the measured boot" }
                        Some(GuardBasis::DaemonWord) => { "guard sealed: on the daemon's word (the measured boot does not show what it needs, or IMA does not prove the daemon)" }
                        None => { "guard sealed: on the daemon's word (no verified boot log)" }
                    }
                    @if r.tpm_kept {
                        " · it keeps the TPM for the daemon: no other process can quote with the daemon's AK"
                    } @else if r.tpm_held_elsewhere > 0 {
                        " · it refuses the TPM to other processes, but " (r.tpm_held_elsewhere) " descriptors opened before it sealed are held elsewhere: their holders can quote with the daemon's AK"
                    }
                }
            }
        }
    }
}

/// The first 12 hex digits of a digest, for a line a reader scans (the API has the rest).
fn short(d: &str) -> &str {
    d.get(..12).unwrap_or(d)
}

/// Beside the verdict, in the page's first line: whether it rests on the daemon's word alone
/// (no host's last statement was quoted by a TPM this verifier verified), for how many hosts.
fn trust_basis(hosts: &[HostView]) -> Markup {
    use rackwarden_attest::tpm::TrustLevel;
    let on_word = hosts
        .iter()
        .filter(|h| h.root_of_trust.verified.unwrap_or(TrustLevel::None) == TrustLevel::None)
        .count();
    html! {
        @if hosts.is_empty() {
        } @else if on_word == hosts.len() {
            span #trust-basis data-daemon-word=(on_word) { " · rests on the daemon's word alone: no host's statements are quoted by a TPM" }
        } @else if on_word > 0 {
            span #trust-basis data-daemon-word=(on_word) { " · " (on_word) " of " (hosts.len()) " hosts on their daemon's word alone" }
        }
    }
}

fn host_section(rack: &str, h: &HostView, boot_judged: bool) -> Markup {
    let s = &h.standing;
    let base = format!(
        "/v1/hosts/{}/{}/statements",
        percent_path(rack),
        percent_path(&s.host)
    );
    html! {
        section.host data-host=(s.host) data-status=(s.status.name()) {
            h3 { (s.host) " " (badge(s.status)) }
            p.meta {
                @match (s.last_seq, s.last_epoch_end_ms) {
                    (Some(q), Some(t)) => { "last statement seq " (q) ", epoch ended " (fmt_unix_ms(t)) }
                    _ => { "no statement yet" }
                }
                @if let Some(c) = &h.caps {
                    " · enforcing egress " (fmt_rate(c.egress_bytes_per_s as f64)) " (burst " (fmt_bytes(c.egress_burst_bytes as f64)) "), ingress "
                    (fmt_rate(c.ingress_bytes_per_s as f64)) " (burst " (fmt_bytes(c.ingress_burst_bytes as f64)) ")"
                }
            }
            (root_of_trust_line(&h.root_of_trust, boot_judged))
            @if let Some((seq, t)) = h.epochs.last().and_then(|e| Some((e.seq, e.traffic.as_ref()?))) {
                p.meta.traffic data-seq=(seq) { "seq " (seq) ": " (traffic_line(t)) }
            }
            @if let Some((seq, sa)) = h.epochs.iter().rev().find_map(|e| Some((e.seq, e.sampling.as_ref()?))) {
                p.meta.sampling data-seq=(seq) { "last sampled epoch, seq " (seq) ": " (sampling_line(sa)) }
            }
            @if let Some((seq, r)) = h.epochs.iter().rev().find_map(|e| Some((e.seq, e.replay.as_ref()?))) {
                p.meta.replay data-seq=(seq) { "last replayed epoch, seq " (seq) ": " (replay_line(r)) }
            }
            @if !s.clearances.is_empty() {
                ul.clearances {
                    @for c in &s.clearances {
                        li.clearance {
                            "cleared by " (c.by.as_deref().unwrap_or("(name not recorded)")) " at " (fmt_unix_ms(c.cleared_ms))
                            ": " q { (c.reason) }
                            @if c.cleared.is_empty() { " (nothing contraindicated was pending)" }
                            @for st in &c.cleared {
                                " · " a href={(base) "/" (st.seq)} { "seq " (st.seq) }
                                @for code in &st.codes { " " code.cleared { (code.name()) } }
                            }
                        }
                    }
                }
            }
            @if !s.findings.is_empty() {
                ul.standing { @for f in &s.findings { li { (f) } } }
            }
            @if !h.findings.is_empty() {
                ul.findings {
                    @for f in &h.findings {
                        li.finding data-code=(f.finding.code.name()) data-severity=(f.finding.severity.name()) {
                            (badge(f.finding.severity)) " " code { (f.finding.code.name()) } " "
                            span.why { (f.finding.code.explain()) } ". " (f.finding.detail) " "
                            a href={(base) "/" (f.seq)} { "statement seq " (f.seq) }
                        }
                    }
                }
            }
            @if h.epochs.is_empty() { p { "no epochs stored" } } @else { (svg_timeline(&h.epochs)) }
            p.meta { a href={(base) "?limit=100"} { "statements (JSON)" } }
        }
    }
}

/// `/racks/{rack}`: the verdict, the scorecard, each host and what the parties share.
pub fn rack(v: &RackView) -> Markup {
    let st = &v.standing;
    page(
        &format!("rack {} — {}", st.rack, st.status.name()),
        html! {
            p { a href="/" { "← all racks" } }
            h1 { "Rack " (st.rack) " " span #verdict data-status=(st.status.name()) { (badge(st.status)) }
                (trust_basis(&v.hosts)) }
            p.meta { "policy " (st.policy_id) " · " (count(st.hosts.len(), "host", "hosts")) " · last " (v.window) " epochs each · "
                (fmt_unix_ms(v.generated_ms)) " · reloads every 30 s" }
            @if let Some(a) = v.policy.racks.get(&st.rack) {
                p { "Agreement: egress " (fmt_rate(a.egress_bytes_per_s as f64)) ", ingress " (fmt_rate(a.ingress_bytes_per_s as f64))
                    ", burst at most " (fmt_bytes(a.max_burst_bytes as f64)) " per host; wipe at least every "
                    (fmt_duration(v.policy.max_wipe_interval)) "." }
            }
            // The reasons first, above everything else: the rack's own (agreement, state
            // bound), then each host's (silence, gaps, uncleared statements, last findings).
            @let reasons = st.reasons();
            @if !reasons.is_empty() {
                ul #rack-findings { @for f in &reasons { li { (f) } } }
            }
            h2 { "Scorecard" }
            div.cards {
                (state_card(&v.standing.state_bound, &v.policy))
                (training_card(&v.score.training))
                (inference_card(&v.score.inference, &v.score.forced))
                (secrets_card(v))
            }
            h2 { "Hosts" }
            @for h in &v.hosts { (host_section(&st.rack, h, !v.policy.boot_pcrs.is_empty() || v.policy.boot_log.is_some())) }
            h2 #inventory { "What is shared" }
            p { "Derived from the evidence schema: every field a signed statement can carry, by kind." }
            table {
                @for c in Disclosure::ALL {
                    tr {
                        th { (c.name()) }
                        td { span.why { (c.explain()) } br;
                            span.math { (v.inventory.by_class.get(&c).map(|f| f.join(", ")).unwrap_or_default()) } }
                    }
                }
            }
            h3 { "What the verifier holds" }
            table { @for (what, detail) in VERIFIER_HOLDS { tr { th { (what) } td { (detail) } } } }
        },
    )
}

#[cfg(test)]
mod tests {
    use rackwarden_attest::tpm::TrustLevel;

    use super::*;

    fn epoch(seq: u64, bytes: u64) -> EpochPoint {
        EpochPoint {
            seq,
            end_ms: 1_800_000_000_000 + seq * 900_000,
            duration_ms: 900_000,
            elapsed_ms: Some(900_000),
            status: Status::Affirming,
            egress_bytes: Some(bytes),
            ingress_bytes: Some(bytes),
            agreed_egress_bound: Some(9_000_000_000.0),
            agreed_ingress_bound: Some(9_000_000_000.0),
            host_egress_bound: None,
            downtime_ms: Some(20),
            trigger: None,
            wipe_interval_ms: Some(900_000),
            missing_before: 0,
            forked: false,
            traffic: None,
            sampling: None,
            replay: None,
        }
    }

    /// Issue 42: at low traffic the timeline was dots and a lone "0 B". A few kB against a
    /// 9 GB bound is a bar at least 2 px tall, and the largest epoch is said in words.
    #[test]
    fn a_quiet_timeline_still_shows_its_bars_and_says_its_peak() {
        let svg = svg_timeline(&[epoch(0, 3_000), epoch(1, 45_000)]).into_string();
        assert!(!svg.contains(">0 B<"), "{svg}");
        assert!(svg.contains("0% of the bound"), "{svg}");
        assert!(
            svg.contains("largest epoch: 43.95 KiB, 0.001% of its bound")
                && svg.contains("height=\"2\""),
            "{svg}"
        );
        // Every drawn bar of a non-idle epoch is at least 2 px tall.
        let heights: Vec<f64> = svg
            .split("<rect ")
            .skip(1)
            .filter(|r| r.contains("fill=\"#") && !r.contains("class=\"idle\""))
            .filter_map(|r| r.split("height=\"").nth(1)?.split('"').next()?.parse().ok())
            .collect();
        assert!(heights.len() >= 4, "{svg}");
        assert!(heights.iter().all(|h| *h >= 0.5), "{heights:?}");
    }

    /// Each epoch's tooltip says what its statement committed of its traffic: records, tapped
    /// and unaccounted bytes per direction, and the tap's drops.
    #[test]
    fn an_epoch_with_traffic_says_what_was_committed() {
        use rackwarden_attest::traffic::{DropCount, TapDrops, TrafficRoot, TrafficSummary};
        let mut e = epoch(7, 3_000);
        e.traffic = Some(TrafficReport::Committed {
            summary: Box::new(TrafficSummary {
                root: TrafficRoot {
                    sha3_256: [0x5a; 32],
                    bytes: [1 << 20, 3 << 20],
                    records: 12,
                },
                passed: [(1 << 20) + 300, 3 << 20],
                unaccounted: [300, 0],
                tap_drops: TapDrops {
                    ring_full: DropCount {
                        frames: [2, 0],
                        bytes: [300, 0],
                    },
                    ..TapDrops::default()
                },
                held: [0, 0],
                start: EpochStart::FirstStart,
            }),
            spool: SpoolState::Kept { bytes: 4 << 20 },
        });
        let svg = svg_timeline(&[epoch(6, 3_000), e.clone()]).into_string();
        assert!(
            svg.contains(
                "traffic committed: 12 records, tapped egress 1 MiB, ingress 3 MiB; unaccounted egress 300 B, ingress 0 B; tap drops: ring full: egress 2 frames (300 B)"
            ) && svg.contains("the first epoch since the daemon started counting"),
            "{svg}"
        );
        // Only the epoch that carries a report says so.
        assert_eq!(svg.matches("traffic committed").count(), 1, "{svg}");
        e.traffic = Some(TrafficReport::Failed {
            reason: "the reader thread exited".into(),
        });
        assert!(
            epoch_tooltip(&e, None, None, None)
                .ends_with("; traffic not committed: the reader thread exited")
        );
    }

    /// Issue 42: a TPM host that runs no guard was told its guard's sealed state rests on the
    /// daemon's word.
    #[test]
    fn the_guard_is_named_only_where_one_is_sealed() {
        let mut r = RootOfTrustView {
            verified: Some(TrustLevel::Tpm),
            claimed: None,
            guard_sealed: false,
            ..Default::default()
        };
        let without = root_of_trust_line(&r, false).into_string();
        assert!(
            !without.contains("guard's sealed state")
                && without.contains("reports no sealed guard"),
            "{without}"
        );
        r.guard_sealed = true;
        let with = root_of_trust_line(&r, false).into_string();
        assert!(
            with.contains("the guard's sealed state rest on the daemon's word"),
            "{with}"
        );
        // With the boot appraised, neither.
        assert!(
            !root_of_trust_line(&r, true)
                .into_string()
                .contains("boot not appraised")
        );
    }
}
