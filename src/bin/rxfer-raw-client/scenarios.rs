//! The named scenarios the hostile-input tests run (`--scenario NAME`).

use crate::steps::{Imm, PLAIN_HELLO_VERSION, Step};
use rdma_xfer::proto::{CAP_NONE, Digest, DigestAlg, Fin, Hello, Message, encode_to_vec};

/// Hostile file names; every one must be refused with REJECT bad-name.
fn hostile_names() -> Vec<String> {
    vec![
        "../x".into(),
        "/etc/passwd".into(),
        "a//b".into(),
        "..".into(),
        ".".into(),
        String::new(),
        "n".repeat(300),
        "a\0b".into(),
        "a\nb".into(),
        "tab\there".into(),
        "esc\x1b[31m".into(),
        "del\x7f".into(),
        "c1\u{85}".into(),
        "back\\slash".into(),
    ]
}

/// A well-formed frame with one header byte changed.
fn patched(msg: &Message, index: usize, value: u8) -> Vec<u8> {
    let mut b = encode_to_vec(msg).unwrap_or_default();
    if let Some(x) = b.get_mut(index) {
        *x = value;
    }
    b
}

fn hello(name: &str, size: u64) -> Message {
    Message::Hello(plain_hello(name, size))
}

fn plain_hello(name: &str, size: u64) -> Hello {
    Hello {
        version: PLAIN_HELLO_VERSION,
        caps: CAP_NONE,
        name: name.into(),
        size,
        mode: 0o644,
        digest: DigestAlg::Crc32,
        mtime: None,
        piece: None,
    }
}

fn expect(kinds: &str) -> Step {
    Step::Expect(kinds.split('|').map(str::to_owned).collect())
}

const ANSWER: &str = "REJECT|ACK";

/// (name, description, steps).
pub(crate) fn scenarios() -> Vec<(&'static str, &'static str, Vec<Step>)> {
    let good_hello = hello("x.bin", 1);
    let mut truncated_body = encode_to_vec(&good_hello).unwrap_or_default();
    truncated_body.truncate(truncated_body.len() - 5);
    let mut trailing = encode_to_vec(&Message::Bye).unwrap_or_default();
    trailing.push(0);
    let mut oversized = encode_to_vec(&Message::Bye).unwrap_or_default();
    oversized.resize(5000, 0x55);
    let mut names = Vec::new();
    for n in hostile_names() {
        names.push(Step::Msg(hello(&n, 1)));
        names.push(expect("REJECT"));
    }
    names.push(Step::Msg(Message::Bye));
    let mib = 1u64 << 20;
    // A directory that exists is answered ACK(ok) every time: answers
    // without end, and no refusal (which would end the session sooner).
    let flood_dir = Message::Hello(Hello {
        caps: rdma_xfer::proto::hello_flags::DIRECTORY,
        ..plain_hello("flood", 0)
    });
    let mut flood: Vec<Step> = std::iter::repeat_n(Step::Msg(flood_dir), 2000).collect();
    flood.push(Step::ExpectDisconnect);
    vec![
        (
            "hello-flood",
            "2000 HELLOs of the directory 'flood' (each answered ACK ok) without waiting \
             for answers (with --no-receives: answers that can never be delivered), then \
             the disconnect",
            flood,
        ),
        (
            "bad-names",
            "a HELLO for every hostile name, each answered by REJECT, then BYE",
            names,
        ),
        (
            "empty-frame",
            "a zero-length SEND",
            vec![Step::Raw(vec![]), expect(ANSWER)],
        ),
        (
            "truncated-header",
            "6 bytes of a header",
            vec![
                Step::Raw(vec![0x52, 0x58, 0x46, 0x52, 1, 1]),
                expect(ANSWER),
            ],
        ),
        (
            "truncated-body",
            "a HELLO missing its last 5 bytes",
            vec![Step::Raw(truncated_body), expect(ANSWER)],
        ),
        (
            "bad-magic",
            "a HELLO whose magic is XXFR",
            vec![Step::Raw(patched(&good_hello, 0, b'X')), expect(ANSWER)],
        ),
        (
            "bad-wire-version",
            "a HELLO framed with wire version 2",
            vec![Step::Raw(patched(&good_hello, 4, 2)), expect(ANSWER)],
        ),
        (
            "bad-protocol-version",
            "a well-framed HELLO offering protocol version 999",
            vec![
                Step::Msg(Message::Hello(Hello {
                    version: 999,
                    caps: CAP_NONE,
                    name: "v.bin".into(),
                    size: 1,
                    mode: 0o644,
                    digest: DigestAlg::Crc32,
                    mtime: None,
                    piece: None,
                })),
                expect(ANSWER),
            ],
        ),
        (
            "unknown-type",
            "a frame of message type 99",
            vec![
                Step::Raw(vec![0x52, 0x58, 0x46, 0x52, 1, 99, 0, 0, 0, 0, 0, 0]),
                expect(ANSWER),
            ],
        ),
        (
            "bad-flags",
            "a BYE with reserved header flags set",
            vec![Step::Raw(patched(&Message::Bye, 7, 1)), expect(ANSWER)],
        ),
        (
            "trailing-bytes",
            "a BYE followed by a stray byte in the same SEND",
            vec![Step::Raw(trailing), expect(ANSWER)],
        ),
        (
            "huge-size",
            "a HELLO announcing u64::MAX bytes",
            vec![Step::Msg(hello("huge.bin", u64::MAX)), expect(ANSWER)],
        ),
        (
            "fin-before-hello",
            "a FIN as the first message",
            vec![
                Step::Msg(Message::Fin(Fin {
                    bytes: 0,
                    chunks: 0,
                    digest: Digest::Crc32(0),
                })),
                expect(ANSWER),
            ],
        ),
        (
            "fin-before-data",
            "HELLO of 1 MiB + 1, MR, then FIN(0 bytes) before any data",
            vec![
                Step::Msg(hello("early-fin.bin", mib + 1)),
                expect("MR"),
                Step::Msg(Message::Fin(Fin {
                    bytes: 0,
                    chunks: 0,
                    digest: Digest::Crc32(0),
                })),
                expect(ANSWER),
            ],
        ),
        (
            "hello-mid-file",
            "HELLO of 3 MiB, MR, one chunk written, then a second HELLO",
            vec![
                Step::Msg(hello("mid.bin", 3 * mib)),
                expect("MR"),
                Step::Writes {
                    count: 1,
                    len: None,
                    imm: Imm::Crc,
                },
                Step::Msg(hello("second.bin", 10)),
                expect(ANSWER),
            ],
        ),
        (
            "bad-chunk-crc",
            "HELLO of 3 MiB, MR, one chunk whose immediate is a wrong CRC32",
            vec![
                Step::Msg(hello("crc.bin", 3 * mib)),
                expect("MR"),
                Step::Writes {
                    count: 1,
                    len: None,
                    imm: Imm::Bad,
                },
                expect(ANSWER),
            ],
        ),
        (
            "chunk-past-size",
            "HELLO of 10 bytes, MR, then a whole slot written",
            vec![
                Step::Msg(hello("small.bin", 10)),
                expect("MR"),
                Step::Writes {
                    count: 1,
                    len: None,
                    imm: Imm::Crc,
                },
                expect(ANSWER),
            ],
        ),
        (
            "oversized-frame",
            "a 5000-byte SEND, larger than any receive buffer \
             (no answer is possible: the receiver's QP fails)",
            vec![Step::Raw(oversized), Step::ExpectDisconnect],
        ),
        (
            "hello-before-auth",
            "for a receiver with a token: a HELLO instead of the AUTH",
            vec![Step::Msg(hello("x.bin", 1)), expect(ANSWER)],
        ),
        (
            "auth-empty",
            "for a receiver with a token: a PROVE without a proof (a sender without a token)",
            vec![
                Step::Prove {
                    token: Vec::new(),
                    nonce_from: None,
                    conn_from: None,
                },
                expect(ANSWER),
            ],
        ),
        (
            "auth-wrong-token",
            "for a receiver with a token: a PROVE under another token",
            vec![
                Step::Prove {
                    token: b"not-the-token-at-all".to_vec(),
                    nonce_from: None,
                    conn_from: None,
                },
                expect(ANSWER),
            ],
        ),
        (
            "auth-v2",
            "for a receiver with a token: protocol 2's AUTH (an older sender)",
            vec![Step::Auth(b"not-the-token-at-all".to_vec()), expect(ANSWER)],
        ),
        (
            "auth-short-mac",
            "an AUTH frame carrying a 5-byte MAC",
            vec![
                Step::Raw(vec![
                    0x52, 0x58, 0x46, 0x52, 1, 9, 0, 0, 0, 0, 0, 7, 0, 5, 1, 2, 3, 4, 5,
                ]),
                expect(ANSWER),
            ],
        ),
        (
            "credit-from-sender",
            "a CREDIT (a receiver-only message) as the first message",
            vec![Step::Msg(Message::Credit { count: 1 }), expect(ANSWER)],
        ),
    ]
}

/// The command-line form of a step (what `parse_step` reads back).
pub(crate) fn scenario_steps(name: &str) -> Result<Vec<Step>, String> {
    scenarios()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, _, steps)| steps)
        .ok_or_else(|| format!("unknown scenario {name:?} (see --list-scenarios)"))
}
