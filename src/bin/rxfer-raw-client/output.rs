//! What the client prints: one stable, greppable line per event.

use rdma_xfer::proto::Message;
use std::io::Write;

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The one-line form of a received message (strings Debug-quoted, so a
/// hostile reason can never break the line).
#[allow(unreachable_patterns)] // a newer protocol may add message kinds
pub(crate) fn describe(msg: &Message) -> String {
    match msg {
        Message::Hello(h) => format!(
            "HELLO version={} caps={} name={:?} size={} mode={:o} digest={}",
            h.version, h.caps, h.name, h.size, h.mode, h.digest
        ),
        Message::Mr(r) => format!(
            "MR addr={:#x} rkey={:#x} slot_size={} slot_count={}",
            r.addr, r.rkey, r.slot_size, r.slot_count
        ),
        Message::Reject(r) => format!("REJECT code={} reason={:?}", r.code.slug(), r.reason),
        Message::Credit { count } => format!("CREDIT count={count}"),
        Message::Fin(f) => format!(
            "FIN bytes={} chunks={} digest={}",
            f.bytes, f.chunks, f.digest
        ),
        Message::Ack(a) => format!("ACK status={} reason={:?}", a.status.slug(), a.reason),
        Message::Bye => "BYE".into(),
        Message::Challenge(c) => format!(
            "CHALLENGE flags={:#06x} auth_required={} nonce={}",
            c.flags,
            c.auth_required(),
            hex(&c.nonce)
        ),
        Message::Auth { mac } => format!("AUTH mac={}", hex(mac)),
        other => format!("{} {other:?}", other.kind()),
    }
}

pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
