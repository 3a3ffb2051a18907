//! Fuzzing of the channel agent's frame decoder, on stable Rust: proptest
//! generates what a peer may send an [`Agent`] over TCP, and every case
//! checks that the agent survives it.
//!
//! What is sent, one connection per case:
//! - structured frames ([`Case::Frames`]), after the handshake: op codes
//!   mostly of the protocol (`OP_OPEN`..`OP_UCX_HELLO`, the one-sided
//!   `OP_WRITE`/`OP_READ`), sometimes any byte; fields sometimes valid (small
//!   handles, lanes and tokens; zero, small, "negative" and huge lengths and
//!   offsets; weights and targets; timeouts mostly of 0..50 ms, sometimes -1
//!   or anything; nonblocking flags; namespaces, names and keys of random
//!   bytes, invalid UTF-8 included, behind length prefixes that sometimes
//!   lie); frames sometimes truncated, with trailing garbage or a lying frame
//!   length. 1..30 frames, usually after a valid `OP_OPEN` that creates a
//!   fresh channel (and `OP_LANE`), often then a whole valid put and take,
//!   with coherent reserve/write/publish and take/read/release runs mixed in,
//!   so that the deep paths run ([`generators_reach_the_deep_paths`] checks
//!   they do); `OP_WRITE` frames carry up to 6 KiB of payload;
//! - raw random byte streams ([`Case::Raw`]) after the handshake, often behind
//!   a length prefix (small, `wire::MAX_FRAME`, above it, `u32::MAX`);
//! - random bytes instead of the handshake ([`Case::Greeting`]): garbage, the
//!   greeting's magic then garbage, or magic, nonce and a wrong proof.
//!
//! Replies are read with a 2 s timeout; a timeout, reset or close is fine (the
//! agent may close a connection on a malformed frame, and waits up to
//! `agent::MAX_REQUEST_WAIT` on a blocking request). The property, after every
//! case: no agent thread panicked during it, and a fresh, well-behaved
//! [`RemoteChannel`] session on the same agent puts and gets an item with
//! exact bytes. After all cases every connection thread ends (no hang).
//! [`traffic_survives_concurrent_garbage`] checks that a real producer and
//! consumer lose, duplicate and corrupt nothing while garbage flows beside
//! them.
//!
//! Run (short: a few seconds, well under 30 s on two cores):
//!
//! ```text
//! cargo test -p rlinf-channel --test agent_fuzz
//! PROPTEST_CASES=5000 cargo test -p rlinf-channel --release --test agent_fuzz   # more cases per test
//! ```
//!
//! Long mode: `long_mode` generates and runs cases on several threads until
//! `RLINF_FUZZ_SECONDS` have passed (threads: `RLINF_FUZZ_THREADS`, default
//! 4), prints the cases run and how their connections ended, and checks that
//! the process's resident memory (VmRSS) stays under 2 GiB and does not grow
//! steadily (late median within 1.5x + 64 MiB of the early one). Keep
//! overflow checks on in release, so that arithmetic on peer input that
//! overflows panics instead of wrapping:
//!
//! ```text
//! CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true RLINF_FUZZ_SECONDS=600 \
//!     cargo test -p rlinf-channel --release --test agent_fuzz -- --nocapture long_mode
//! ```
//!
//! A failing case is shrunk and printed (long mode), or shrunk and recorded
//! by proptest in `tests/agent_fuzz.proptest-regressions` (default mode; keep
//! that file in git, its cases rerun first). Each finding also stays as a
//! named `regression_*` test at the end of this file.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

use rlinf_channel::agent::{MAX_REQUEST_WAIT, MAX_SESSION_CHANNELS};
use rlinf_channel::channel::parse_message;
use rlinf_channel::protocol::*;
use rlinf_channel::transport::tcp::{OP_READ, OP_WRITE, connect_stream};
use rlinf_channel::wire::{self, MAX_FRAME, Writer};
use rlinf_channel::{Agent, Channel, ChannelOptions, RemoteChannel, TcpTransport};

/// How long a case waits for the agent's replies (and its close).
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);
/// The greeting's magic (`auth::MAGIC`, private there).
const AUTH_MAGIC: &[u8; 8] = b"RLINFAU1";
/// Largest `OP_WRITE` payload sent after a frame.
const MAX_PAYLOAD: u64 = 6 << 10;

// ---------------------------------------------------------------------------
// Panics of agent threads

static AGENT_PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HOOK: Once = Once::new();

/// Records panics of the agent's threads (named `rlinf-agent*`): they would
/// otherwise only end that thread, unseen by the test.
fn watch_agent_panics() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            if let Some(name) = thread.name().filter(|n| n.starts_with("rlinf-agent")) {
                AGENT_PANICS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(format!("{name}: {info}"));
            }
            previous(info);
        }));
    });
}

fn agent_panics() -> Vec<String> {
    AGENT_PANICS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Agent panics recorded after the first `since`.
fn panics_since(since: usize) -> Vec<String> {
    let mut all = agent_panics();
    all.split_off(since.min(all.len()))
}

// ---------------------------------------------------------------------------
// Cases

/// One field of a control frame.
#[derive(Debug, Clone)]
enum Field {
    U8(u8),
    U32(u32),
    U64(u64),
    I64(i64),
    /// Length-prefixed bytes.
    Bytes(Vec<u8>),
    /// Bytes behind a length prefix that lies.
    Lie {
        declared: u32,
        actual: Vec<u8>,
    },
    /// The namespace of the fuzzed channels (filled in when sent).
    FuzzNs,
    /// A channel name no other case uses (filled in when sent).
    FreshName,
}

/// How a frame is damaged.
#[derive(Debug, Clone)]
enum Damage {
    None,
    /// Keeps `n % (len + 1)` bytes of the body.
    Truncate(usize),
    /// Appends garbage to the body.
    Trailing(Vec<u8>),
    /// Declares the body `delta` bytes longer than it is (wrapping).
    LengthLie(i32),
}

/// The bytes that follow an `OP_WRITE` frame: `len` bytes drawn from
/// `seed` (their values do not matter to the agent; this keeps cases small
/// to shrink and to print).
#[derive(Debug, Clone, Copy, Default)]
struct Payload {
    len: usize,
    seed: u64,
}

/// One control frame, and for `OP_WRITE` the payload that follows it.
#[derive(Debug, Clone)]
struct Frame {
    op: u8,
    fields: Vec<Field>,
    damage: Damage,
    payload: Payload,
}

/// Which greeting a pre-handshake case starts with.
#[derive(Debug, Clone, Copy)]
enum Greet {
    /// Just the random bytes.
    Garbage,
    /// The magic, then the random bytes.
    Magic,
    /// Magic, random nonce, random (wrong) proof, then the random bytes.
    WrongProof,
}

/// What one connection sends.
#[derive(Debug, Clone)]
enum Case {
    /// Structured frames after the handshake; `hangup`: close at once
    /// instead of waiting for the agent's replies.
    Frames { frames: Vec<Frame>, hangup: bool },
    /// Random bytes after the handshake, behind an optional length prefix.
    Raw {
        prefix: Option<u32>,
        bytes: Vec<u8>,
        hangup: bool,
    },
    /// Random bytes to a fresh connection, instead of the handshake.
    Greeting { greet: Greet, bytes: Vec<u8> },
}

/// What a case's bytes need from the fixture.
struct Ctx<'a> {
    ns: &'a str,
    fresh: &'a str,
}

fn put_bytes(out: &mut Vec<u8>, declared: u32, bytes: &[u8]) {
    out.extend_from_slice(&declared.to_le_bytes());
    out.extend_from_slice(bytes);
}

impl Frame {
    fn encode(&self, ctx: &Ctx<'_>, out: &mut Vec<u8>) {
        let mut body = vec![self.op];
        for f in &self.fields {
            match f {
                Field::U8(v) => body.push(*v),
                Field::U32(v) => body.extend_from_slice(&v.to_le_bytes()),
                Field::U64(v) => body.extend_from_slice(&v.to_le_bytes()),
                Field::I64(v) => body.extend_from_slice(&v.to_le_bytes()),
                Field::Bytes(b) => put_bytes(&mut body, b.len() as u32, b),
                Field::Lie { declared, actual } => put_bytes(&mut body, *declared, actual),
                Field::FuzzNs => put_bytes(&mut body, ctx.ns.len() as u32, ctx.ns.as_bytes()),
                Field::FreshName => {
                    put_bytes(&mut body, ctx.fresh.len() as u32, ctx.fresh.as_bytes())
                }
            }
        }
        let mut declared = body.len() as u32;
        match &self.damage {
            Damage::None => {}
            Damage::Truncate(n) => {
                let keep = n % (body.len() + 1);
                body.truncate(keep);
                declared = keep as u32;
            }
            Damage::Trailing(junk) => {
                body.extend_from_slice(junk);
                declared = body.len() as u32;
            }
            Damage::LengthLie(delta) => declared = declared.wrapping_add(*delta as u32),
        }
        out.extend_from_slice(&declared.to_le_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&pattern(self.payload.seed, self.payload.len));
    }
}

impl Case {
    /// The bytes this case sends, and whether it authenticates first.
    fn bytes(&self, ctx: &Ctx<'_>) -> (bool, Vec<u8>) {
        match self {
            Case::Frames { frames, .. } => {
                let mut out = Vec::new();
                for f in frames {
                    f.encode(ctx, &mut out);
                }
                (true, out)
            }
            Case::Raw { prefix, bytes, .. } => {
                let mut out = Vec::new();
                if let Some(p) = prefix {
                    out.extend_from_slice(&p.to_le_bytes());
                }
                out.extend_from_slice(bytes);
                (true, out)
            }
            Case::Greeting { greet, bytes } => {
                let mut out = Vec::new();
                match greet {
                    Greet::Garbage => {}
                    Greet::Magic => out.extend_from_slice(AUTH_MAGIC),
                    Greet::WrongProof => {
                        out.extend_from_slice(AUTH_MAGIC);
                        // Nonce, then a wrong proof (the agent's challenge
                        // comes in between; the proof is read after it).
                        out.extend((0..64u32).map(|i| (i * 7 + bytes.len() as u32) as u8));
                    }
                }
                out.extend_from_slice(bytes);
                (false, out)
            }
        }
    }

    fn hangup(&self) -> bool {
        match self {
            Case::Frames { hangup, .. } | Case::Raw { hangup, .. } => *hangup,
            Case::Greeting { .. } => false,
        }
    }
}

// ---------------------------------------------------------------------------
// Generators

fn handle() -> BoxedStrategy<u32> {
    prop_oneof![12 => 0u32..3, 1 => Just(u32::MAX), 1 => any::<u32>()].boxed()
}

fn lane() -> BoxedStrategy<u32> {
    prop_oneof![12 => 0u32..3, 1 => Just(u32::MAX), 1 => any::<u32>()].boxed()
}

fn token() -> BoxedStrategy<u64> {
    prop_oneof![12 => 0u64..5, 1 => Just(u64::MAX), 1 => any::<u64>()].boxed()
}

/// Sizes the generators share, so that writes often match reservations.
const SIZES: &[u64] = &[1, 16, 64, 100, 1000, 4096];

/// A length or total: zero, small, "negative" (two's complement), huge.
fn length() -> BoxedStrategy<u64> {
    prop_oneof![
        3 => Just(0u64),
        8 => prop::sample::select(SIZES),
        3 => 1u64..5000,
        1 => Just(u64::MAX),
        1 => Just(-4096i64 as u64),
        1 => Just(1u64 << 40),
        1 => Just(u64::from(MAX_FRAME) + 1),
        1 => any::<u64>(),
    ]
    .boxed()
}

fn offset() -> BoxedStrategy<u64> {
    prop_oneof![
        8 => Just(0u64),
        4 => 0u64..5000,
        1 => Just(u64::MAX),
        1 => Just(u64::MAX - 15),
        1 => any::<u64>(),
    ]
    .boxed()
}

fn weight() -> BoxedStrategy<i64> {
    prop_oneof![
        8 => 0i64..4,
        1 => Just(-1i64),
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => any::<i64>(),
    ]
    .boxed()
}

fn target() -> BoxedStrategy<i64> {
    prop_oneof![
        8 => Just(0i64),
        4 => 1i64..5,
        1 => Just(-1i64),
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => any::<i64>(),
    ]
    .boxed()
}

/// Timeouts in ms: mostly short, sometimes -1 (none: the agent caps it at
/// `MAX_REQUEST_WAIT`) or anything.
fn timeout() -> BoxedStrategy<i64> {
    prop_oneof![40 => 0i64..50, 1 => Just(-1i64), 1 => any::<i64>()].boxed()
}

fn flag() -> BoxedStrategy<u8> {
    prop_oneof![4 => Just(1u8), 3 => Just(0u8), 1 => any::<u8>()].boxed()
}

/// Length-prefixed bytes, whose prefix sometimes lies.
fn bytes_field(inner: BoxedStrategy<Vec<u8>>) -> BoxedStrategy<Field> {
    let lie = prop_oneof![
        0u32..64,
        Just(u32::MAX),
        Just(MAX_FRAME),
        Just(MAX_FRAME + 1),
        any::<u32>(),
    ];
    prop_oneof![
        12 => inner.clone().prop_map(Field::Bytes),
        1 => (lie, inner).prop_map(|(declared, actual)| Field::Lie { declared, actual }),
    ]
    .boxed()
}

/// Random bytes with invalid UTF-8 and name-breaking characters likely.
fn junk_bytes(max: usize) -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..max),
        vec(prop::sample::select(b"ab.-_/\0\xff\xc3".to_vec()), 0..max),
    ]
    .boxed()
}

fn ns_field() -> BoxedStrategy<Field> {
    prop_oneof![
        8 => Just(Field::FuzzNs),
        2 => bytes_field(junk_bytes(12)),
        1 => bytes_field(Just(vec![b'n'; 300]).boxed()),
    ]
    .boxed()
}

fn name_field() -> BoxedStrategy<Field> {
    prop_oneof![
        6 => Just(Field::FreshName),
        4 => bytes_field(prop::sample::select(vec![b"x0".to_vec(), b"x1".to_vec()]).boxed()),
        3 => bytes_field(junk_bytes(12)),
        1 => bytes_field(Just(vec![b'c'; 300]).boxed()),
    ]
    .boxed()
}

fn key_field() -> BoxedStrategy<Field> {
    prop_oneof![
        6 => bytes_field(prop::sample::select(vec![b"a".to_vec(), b"b".to_vec(), vec![]]).boxed()),
        3 => bytes_field(junk_bytes(24)),
        1 => bytes_field(vec(any::<u8>(), 100..140).boxed()),
    ]
    .boxed()
}

/// `OP_OPEN` sizes: mostly small and valid, sometimes out of range. Arenas
/// stay small or absurd (never gigabytes that `/dev/shm` could hold).
fn open_sizes() -> BoxedStrategy<(u32, u32, u32, u64)> {
    let small = |hi: u32| prop_oneof![10 => 1u32..hi, 1 => Just(0u32), 1 => any::<u32>()];
    let arena = prop_oneof![
        10 => prop::sample::select(vec![1u64 << 16, 1 << 18, 1 << 20]),
        1 => Just(0u64),
        1 => 1u64..(1 << 16),
        1 => Just(u64::MAX),
        1 => Just(1u64 << 50),
    ];
    (small(5), small(5), small(33), arena).boxed()
}

fn open_fields(ns: BoxedStrategy<Field>, name: BoxedStrategy<Field>) -> BoxedStrategy<Vec<Field>> {
    (
        ns,
        name,
        prop_oneof![3 => Just(1u8), 1 => Just(0u8), 1 => any::<u8>()],
        open_sizes(),
        any::<u32>(),
    )
        .prop_map(|(ns, name, create, (lanes, cap, blocks, arena), tag)| {
            vec![
                ns,
                name,
                Field::U8(create),
                Field::U32(lanes),
                Field::U32(cap),
                Field::U32(blocks),
                Field::U64(arena),
                Field::U32(tag),
            ]
        })
        .boxed()
}

fn any_field() -> BoxedStrategy<Field> {
    prop_oneof![
        any::<u8>().prop_map(Field::U8),
        any::<u32>().prop_map(Field::U32),
        any::<u64>().prop_map(Field::U64),
        any::<i64>().prop_map(Field::I64),
        bytes_field(junk_bytes(16)),
    ]
    .boxed()
}

/// The fields of operation `op` (random ones for unknown codes).
fn op_fields(op: u8) -> BoxedStrategy<Vec<Field>> {
    use Field::*;
    match op {
        OP_OPEN => open_fields(ns_field(), name_field()),
        OP_LANE => (handle(), key_field())
            .prop_map(|(h, k)| vec![U32(h), k])
            .boxed(),
        OP_RESERVE => (handle(), lane(), length(), weight(), timeout(), flag())
            .prop_map(|(h, l, n, w, t, nb)| vec![U32(h), U32(l), U64(n), I64(w), I64(t), U8(nb)])
            .boxed(),
        OP_PUBLISH | OP_RELEASE => token().prop_map(|t| vec![U64(t)]).boxed(),
        OP_TAKE => (handle(), lane(), target(), timeout(), flag())
            .prop_map(|(h, l, g, t, nb)| vec![U32(h), U32(l), I64(g), I64(t), U8(nb)])
            .boxed(),
        OP_QSIZE => (handle(), lane())
            .prop_map(|(h, l)| vec![U32(h), U32(l)])
            .boxed(),
        OP_CLOSE | OP_CLOSED | OP_RECLAIM | OP_STATS => handle().prop_map(|h| vec![U32(h)]).boxed(),
        OP_WAIT_READABLE => (handle(), lane(), timeout())
            .prop_map(|(h, l, t)| vec![U32(h), U32(l), I64(t)])
            .boxed(),
        OP_UCX_HELLO => Just(vec![]).boxed(),
        OP_READ => (token(), offset(), length())
            .prop_map(|(t, o, n)| vec![U64(t), U64(o), U64(n)])
            .boxed(),
        _ => vec(any_field(), 0..6).boxed(),
    }
}

fn damage() -> BoxedStrategy<Damage> {
    prop_oneof![
        16 => Just(Damage::None),
        2 => any::<usize>().prop_map(Damage::Truncate),
        2 => vec(any::<u8>(), 1..16).prop_map(Damage::Trailing),
        1 => (-8i32..8).prop_map(Damage::LengthLie),
        1 => any::<i32>().prop_map(Damage::LengthLie),
    ]
    .boxed()
}

/// A payload for a write of `len` bytes: all of it, a part, or any length.
fn payload_for(len: u64) -> BoxedStrategy<Payload> {
    let fit = len.min(MAX_PAYLOAD) as usize;
    let len = prop_oneof![
        6 => Just(fit),
        1 => 0..=fit,
        1 => 0..MAX_PAYLOAD as usize,
    ];
    (len, any::<u64>())
        .prop_map(|(len, seed)| Payload { len, seed })
        .boxed()
}

fn write_frame() -> BoxedStrategy<Frame> {
    (token(), offset(), length(), damage())
        .prop_flat_map(|(t, o, n, damage)| {
            payload_for(n).prop_map(move |payload| Frame {
                op: OP_WRITE,
                fields: vec![Field::U64(t), Field::U64(o), Field::U64(n)],
                damage: damage.clone(),
                payload,
            })
        })
        .boxed()
}

fn op_code() -> BoxedStrategy<u8> {
    prop_oneof![
        3 => Just(OP_OPEN),
        4 => Just(OP_LANE),
        5 => Just(OP_RESERVE),
        4 => Just(OP_PUBLISH),
        5 => Just(OP_TAKE),
        3 => Just(OP_RELEASE),
        2 => Just(OP_QSIZE),
        1 => Just(OP_CLOSE),
        2 => Just(OP_CLOSED),
        2 => Just(OP_RECLAIM),
        2 => Just(OP_WAIT_READABLE),
        2 => Just(OP_STATS),
        1 => Just(OP_UCX_HELLO),
        5 => Just(OP_WRITE),
        5 => Just(OP_READ),
        4 => any::<u8>(),
    ]
    .boxed()
}

fn frame() -> BoxedStrategy<Frame> {
    op_code()
        .prop_flat_map(|op| {
            if op == OP_WRITE {
                write_frame()
            } else {
                (op_fields(op), damage())
                    .prop_map(move |(fields, damage)| Frame {
                        op,
                        fields,
                        damage,
                        payload: Payload::default(),
                    })
                    .boxed()
            }
        })
        .boxed()
}

fn plain(op: u8, fields: Vec<Field>) -> Frame {
    Frame {
        op,
        fields,
        damage: Damage::None,
        payload: Payload::default(),
    }
}

/// A coherent put on handle 0: reserve, write all of it, publish (the token
/// is a guess: tokens count up from 1 per connection).
fn put_run() -> BoxedStrategy<Vec<Frame>> {
    use Field::*;
    (
        0u32..2,
        prop::sample::select(SIZES),
        1u64..5,
        0i64..3,
        0u8..2,
    )
        .prop_flat_map(|(lane, total, token, weight, nb)| {
            any::<u64>().prop_map(move |seed| {
                let payload = Payload {
                    len: total as usize,
                    seed,
                };
                vec![
                    plain(
                        OP_RESERVE,
                        vec![U32(0), U32(lane), U64(total), I64(weight), I64(10), U8(nb)],
                    ),
                    Frame {
                        op: OP_WRITE,
                        fields: vec![U64(token), U64(0), U64(total)],
                        damage: Damage::None,
                        payload,
                    },
                    plain(OP_PUBLISH, vec![U64(token)]),
                ]
            })
        })
        .boxed()
}

/// A coherent take on handle 0: take, read (a guessed token and length),
/// release.
fn take_run() -> BoxedStrategy<Vec<Frame>> {
    use Field::*;
    (
        0u32..2,
        prop_oneof![3 => Just(0i64), 1 => 1i64..4],
        1u64..5,
        prop_oneof![1 => prop::sample::select(SIZES), 1 => 1u64..17],
        prop_oneof![3 => Just(0u64), 1 => 1u64..3],
    )
        .prop_map(|(lane, target, token, len, offset)| {
            vec![
                plain(
                    OP_TAKE,
                    vec![U32(0), U32(lane), I64(target), I64(10), U8(1)],
                ),
                plain(OP_READ, vec![U64(token), U64(offset), U64(len)]),
                plain(OP_RELEASE, vec![U64(token)]),
            ]
        })
        .boxed()
}

/// A valid `OP_OPEN` that creates a fresh channel in the fuzz namespace, then
/// `OP_LANE` for key "a" (lane 0) and maybe key "b" (lane 1).
fn prefix() -> BoxedStrategy<Vec<Frame>> {
    use Field::*;
    (
        1u32..5,
        1u32..5,
        1u32..33,
        prop::sample::select(vec![1u64 << 16, 1 << 20]),
        any::<bool>(),
    )
        .prop_map(|(lanes, cap, blocks, arena, second)| {
            let mut v = vec![
                plain(
                    OP_OPEN,
                    vec![
                        FuzzNs,
                        FreshName,
                        U8(1),
                        U32(lanes),
                        U32(cap),
                        U32(blocks),
                        U64(arena),
                        U32(0),
                    ],
                ),
                plain(OP_LANE, vec![U32(0), Bytes(b"a".to_vec())]),
            ];
            if second {
                v.push(plain(OP_LANE, vec![U32(0), Bytes(b"b".to_vec())]));
            }
            v
        })
        .boxed()
}

/// A whole valid round trip as the first puts and takes of a connection
/// (so its tokens are 1 and 2): put on lane 0, take it, read it all, and
/// maybe release it (else the lease ends with the connection).
fn round_trip() -> BoxedStrategy<Vec<Frame>> {
    use Field::*;
    (prop::sample::select(SIZES), any::<bool>())
        .prop_flat_map(|(total, release)| {
            any::<u64>().prop_map(move |seed| {
                let payload = Payload {
                    len: total as usize,
                    seed,
                };
                let mut v = vec![
                    plain(
                        OP_RESERVE,
                        vec![U32(0), U32(0), U64(total), I64(1), I64(10), U8(1)],
                    ),
                    Frame {
                        op: OP_WRITE,
                        fields: vec![U64(1), U64(0), U64(total)],
                        damage: Damage::None,
                        payload,
                    },
                    plain(OP_PUBLISH, vec![U64(1)]),
                    plain(OP_TAKE, vec![U32(0), U32(0), I64(0), I64(10), U8(1)]),
                    plain(OP_READ, vec![U64(2), U64(0), U64(total)]),
                ];
                if release {
                    v.push(plain(OP_RELEASE, vec![U64(2)]));
                }
                v
            })
        })
        .boxed()
}

fn frames_case() -> BoxedStrategy<Case> {
    let chunk = prop_oneof![
        10 => frame().prop_map(|f| vec![f]),
        3 => put_run(),
        3 => take_run(),
    ];
    (
        prop::option::weighted(0.8, prefix()),
        prop::option::weighted(0.4, round_trip()),
        vec(chunk, 1..16),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(prefix, round_trip, chunks, hangup)| {
            let mut frames = prefix.unwrap_or_default();
            frames.extend(round_trip.unwrap_or_default());
            frames.extend(chunks.into_iter().flatten());
            frames.truncate(30);
            Case::Frames { frames, hangup }
        })
        .boxed()
}

fn raw_case() -> BoxedStrategy<Case> {
    let prefix = prop_oneof![
        2 => Just(None),
        2 => (0u32..64).prop_map(Some),
        1 => Just(Some(MAX_FRAME)),
        1 => Just(Some(MAX_FRAME + 1)),
        1 => Just(Some(u32::MAX)),
        1 => any::<u32>().prop_map(Some),
    ];
    (prefix, vec(any::<u8>(), 0..2048), prop::bool::weighted(0.1))
        .prop_map(|(prefix, bytes, hangup)| Case::Raw {
            prefix,
            bytes,
            hangup,
        })
        .boxed()
}

fn greeting_case() -> BoxedStrategy<Case> {
    let greet = prop_oneof![
        Just(Greet::Garbage),
        Just(Greet::Magic),
        Just(Greet::WrongProof)
    ];
    (greet, vec(any::<u8>(), 0..256))
        .prop_map(|(greet, bytes)| Case::Greeting { greet, bytes })
        .boxed()
}

fn any_case() -> BoxedStrategy<Case> {
    prop_oneof![6 => frames_case(), 2 => raw_case(), 1 => greeting_case()].boxed()
}

// ---------------------------------------------------------------------------
// Running cases

/// How a case's connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The agent closed the connection (after our end of input, or earlier).
    Closed,
    /// The connection was reset or failed.
    Reset,
    /// The agent did not close within [`REPLY_TIMEOUT`] (a capped wait).
    TimedOut,
    /// We hung up without waiting.
    HungUp,
    /// The handshake itself failed (counted, not a failure: the agent may
    /// refuse while at its connection cap).
    NoSession,
}

#[derive(Default)]
struct Tally {
    cases: AtomicU64,
    closed: AtomicU64,
    reset: AtomicU64,
    timed_out: AtomicU64,
    hung_up: AtomicU64,
    no_session: AtomicU64,
    reply_bytes: AtomicU64,
}

impl Tally {
    fn add(&self, outcome: Outcome, reply_bytes: u64) {
        self.cases.fetch_add(1, Ordering::Relaxed);
        self.reply_bytes.fetch_add(reply_bytes, Ordering::Relaxed);
        let counter = match outcome {
            Outcome::Closed => &self.closed,
            Outcome::Reset => &self.reset,
            Outcome::TimedOut => &self.timed_out,
            Outcome::HungUp => &self.hung_up,
            Outcome::NoSession => &self.no_session,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn summary(&self) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{} cases: {} closed by the agent, {} reset, {} timed out (capped waits), \
             {} hung up, {} without a session; {} reply bytes",
            g(&self.cases),
            g(&self.closed),
            g(&self.reset),
            g(&self.timed_out),
            g(&self.hung_up),
            g(&self.no_session),
            g(&self.reply_bytes),
        )
    }
}

static NAMES: AtomicU64 = AtomicU64::new(0);

fn fresh(prefix: &str) -> String {
    format!("{prefix}{}", NAMES.fetch_add(1, Ordering::Relaxed))
}

/// Deterministic bytes for item `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Lanes of the check channel: one per thread that checks (long mode runs
/// checks on several threads at once).
const CHECK_LANES: u32 = 64;

/// This thread's lane in the check channel.
fn check_lane() -> u32 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static LANE: u32 = (NEXT.fetch_add(1, Ordering::Relaxed) % u64::from(CHECK_LANES)) as u32;
    }
    LANE.with(|l| *l)
}

/// An agent under fuzz, and a channel that well-behaved sessions use to
/// check on it (in a namespace the generators never name).
struct Fixture {
    agent: Agent,
    fuzz_ns: String,
    check_ns: String,
    check_name: String,
    _home: Channel,
    checks: AtomicU64,
    tally: Tally,
}

impl Fixture {
    fn new() -> Self {
        watch_agent_panics();
        let pid = std::process::id();
        let check_ns = format!("fzck{pid}");
        let check_name = fresh("h");
        let home = Channel::create(
            &check_ns,
            &check_name,
            ChannelOptions {
                max_lanes: CHECK_LANES,
                lane_capacity: 8,
                max_blocks: 64,
                arena_bytes: 4 << 20,
                user_tag: 0,
            },
        )
        .unwrap();
        Self {
            agent: Agent::start("127.0.0.1:0").unwrap(),
            fuzz_ns: format!("fz{pid}"),
            check_ns,
            check_name,
            _home: home,
            checks: AtomicU64::new(0),
            tally: Tally::default(),
        }
    }

    /// Sends `case` over one connection and waits (at most
    /// [`REPLY_TIMEOUT`]) for the agent to close it.
    fn run(&self, case: &Case) -> Outcome {
        let fresh_name = fresh("f");
        let ctx = Ctx {
            ns: &self.fuzz_ns,
            fresh: &fresh_name,
        };
        let (authenticate, bytes) = case.bytes(&ctx);
        let stream = if authenticate {
            connect_stream(self.agent.address(), Duration::from_secs(5))
        } else {
            TcpStream::connect(self.agent.address())
        };
        let Ok(mut stream) = stream else {
            self.tally.add(Outcome::NoSession, 0);
            return Outcome::NoSession;
        };
        let _ = stream.set_write_timeout(Some(REPLY_TIMEOUT));
        let _ = stream.set_read_timeout(Some(REPLY_TIMEOUT));
        // A failed write (the agent closed early) shows in the reads below.
        let _ = stream.write_all(&bytes);
        if case.hangup() {
            drop(stream);
            self.tally.add(Outcome::HungUp, 0);
            return Outcome::HungUp;
        }
        let _ = stream.shutdown(Shutdown::Write);
        let deadline = Instant::now() + REPLY_TIMEOUT;
        let mut buf = [0u8; 16 << 10];
        let mut received = 0u64;
        let outcome = loop {
            if Instant::now() >= deadline {
                break Outcome::TimedOut;
            }
            match stream.read(&mut buf) {
                Ok(0) => break Outcome::Closed,
                Ok(n) => received += n as u64,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    break Outcome::TimedOut;
                }
                Err(_) => break Outcome::Reset,
            }
        };
        self.tally.add(outcome, received);
        outcome
    }

    /// The property: no agent thread panicked (after the first `panics_before`
    /// recorded), and a fresh well-behaved session puts and gets an item with
    /// exact bytes.
    fn check(&self, panics_before: usize) -> Result<(), String> {
        let panics = panics_since(panics_before);
        if !panics.is_empty() {
            return Err(format!("agent thread(s) panicked: {panics:?}"));
        }
        let seq = self.checks.fetch_add(1, Ordering::Relaxed);
        let remote = RemoteChannel::connect(
            Arc::new(TcpTransport),
            self.agent.address(),
            &self.check_ns,
            &self.check_name,
            None,
        )
        .map_err(|e| format!("a well-behaved session cannot connect: {e}"))?;
        let lane = remote
            .lane(format!("check{}", check_lane()).as_bytes())
            .map_err(|e| format!("lane failed: {e}"))?;
        let header = seq.to_le_bytes();
        let body = pattern(seq, 1 + (seq as usize * 131) % 20_000);
        remote
            .put(
                lane,
                &header,
                &[&body],
                0,
                Some(Duration::from_secs(10)),
                false,
            )
            .map_err(|e| format!("put failed: {e}"))?;
        let items = remote
            .take(lane, 0, Some(Duration::from_secs(10)), false)
            .map_err(|e| format!("get failed: {e}"))?;
        let [image] = items.as_slice() else {
            return Err(format!("got {} items, wanted 1", items.len()));
        };
        let m = parse_message(image).map_err(|e| format!("bad image: {e}"))?;
        let (ho, hl) = m.header;
        if image[ho..ho + hl] != header || m.buffers.len() != 1 {
            return Err("the item's header or buffer count changed".into());
        }
        let (bo, bl) = m.buffers[0];
        if image[bo..bo + bl] != body[..] {
            return Err("the item's bytes changed".into());
        }
        Ok(())
    }

    /// Runs `case`, then checks the property (panics during this case only,
    /// so that shrinking finds the case that panics).
    fn run_and_check(&self, case: &Case) -> Result<(), String> {
        let panics_before = agent_panics().len();
        self.run(case);
        self.check(panics_before)
    }

    /// Waits for every connection to the agent to end: a thread still
    /// serving one long after its peer left is a hang.
    fn assert_all_connections_end(&self) {
        let deadline = Instant::now() + MAX_REQUEST_WAIT + REPLY_TIMEOUT + Duration::from_secs(3);
        while self.agent.live_connections() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            self.agent.live_connections(),
            0,
            "agent connection threads still live long after their peers left (a hang)"
        );
        assert!(agent_panics().is_empty(), "{:?}", agent_panics());
    }
}

/// Cases per default-mode test: `PROPTEST_CASES`, else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(default_cases: u32) -> Config {
    Config {
        cases: cases(default_cases),
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        max_shrink_iters: 4096,
        max_shrink_time: 120_000,
        ..Config::default()
    }
}

fn fuzz(strategy: BoxedStrategy<Case>, default_cases: u32) {
    let fx = Fixture::new();
    let mut runner = TestRunner::new(config(default_cases));
    let result = runner.run(&strategy, |case| {
        fx.run_and_check(&case).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!("{}", fx.tally.summary());
    fx.assert_all_connections_end();
}

// ---------------------------------------------------------------------------
// Default mode

#[test]
fn structured_frames_never_break_the_agent() {
    fuzz(frames_case(), 512);
}

#[test]
fn raw_streams_after_the_handshake_never_break_the_agent() {
    fuzz(raw_case(), 256);
}

#[test]
fn garbage_instead_of_the_handshake_never_breaks_the_agent() {
    fuzz(greeting_case(), 128);
}

#[test]
fn traffic_survives_concurrent_garbage() {
    const ITEMS: u64 = 400;
    let fx = Arc::new(Fixture::new());
    let name = fresh("t");
    let _home = Channel::create(
        &fx.check_ns,
        &name,
        ChannelOptions {
            max_lanes: 4,
            lane_capacity: 4,
            max_blocks: 64,
            arena_bytes: 4 << 20,
            user_tag: 0,
        },
    )
    .unwrap();
    let connect = || {
        RemoteChannel::connect(
            Arc::new(TcpTransport),
            fx.agent.address(),
            &fx.check_ns,
            &name,
            None,
        )
        .unwrap()
    };
    let (producer, consumer) = (connect(), connect());
    let lane = producer.lane(b"numbered").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let garbage = std::thread::spawn({
        let (fx, stop) = (Arc::clone(&fx), Arc::clone(&stop));
        move || {
            let mut runner = TestRunner::new(Config::default());
            let strategy = any_case();
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) {
                let case = strategy.new_tree(&mut runner).unwrap().current();
                fx.run(&case);
                n += 1;
            }
            n
        }
    });
    let size = |i: u64| match i % 10 {
        0 => 64 << 10,
        1 => 0,
        _ => (i as usize * 97) % 5000,
    };
    let put = std::thread::spawn(move || {
        for i in 0..ITEMS {
            let body = pattern(i, size(i));
            producer
                .put(
                    lane,
                    &i.to_le_bytes(),
                    &[&body],
                    0,
                    Some(Duration::from_secs(20)),
                    false,
                )
                .unwrap_or_else(|e| panic!("put {i}: {e}"));
            if i % 8 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    for i in 0..ITEMS {
        let items = consumer
            .take(lane, 0, Some(Duration::from_secs(20)), false)
            .unwrap_or_else(|e| panic!("get {i}: {e}"));
        assert_eq!(items.len(), 1);
        let image = &items[0];
        let m = parse_message(image).unwrap();
        let (ho, hl) = m.header;
        let got = u64::from_le_bytes(image[ho..ho + hl].try_into().unwrap());
        assert_eq!(got, i, "items lost, duplicated or reordered");
        let (bo, bl) = m.buffers[0];
        assert!(
            image[bo..bo + bl] == pattern(i, size(i))[..],
            "item {i} corrupted"
        );
    }
    put.join().unwrap();
    assert!(
        matches!(
            consumer.take(lane, 0, None, true),
            Err(rlinf_channel::ChannelError::Empty)
        ),
        "an item arrived twice"
    );
    stop.store(true, Ordering::Release);
    let garbage_cases = garbage.join().unwrap();
    eprintln!("{garbage_cases} garbage cases ran beside {ITEMS} items");
    assert!(garbage_cases > 0);
    drop((consumer, _home));
    fx.check(0).unwrap();
    fx.assert_all_connections_end();
}

/// What the agent answered OK, per op code, to `frames` sent well-formed
/// (undamaged, each `OP_WRITE` with exactly its payload), reading each reply
/// in turn.
fn ok_replies(fx: &Fixture, frames: &[Frame], counts: &mut HashMap<u8, u32>) {
    let fresh_name = fresh("p");
    let ctx = Ctx {
        ns: &fx.fuzz_ns,
        fresh: &fresh_name,
    };
    let mut s = control(fx);
    for f in frames {
        let mut bytes = Vec::new();
        f.encode(&ctx, &mut bytes);
        if s.write_all(&bytes).is_err() {
            return;
        }
        let ok = match f.op {
            OP_WRITE | OP_RELEASE => continue,
            OP_READ => {
                let Field::U64(len) = f.fields[2] else {
                    unreachable!()
                };
                let mut status = [0u8];
                if s.read_exact(&mut status).is_err() {
                    return;
                }
                let ok = status[0] == OK;
                let mut data = vec![0u8; if ok { len as usize } else { 0 }];
                if s.read_exact(&mut data).is_err() {
                    return;
                }
                ok
            }
            _ => {
                let mut reply = Vec::new();
                if wire::read_frame(&mut s, &mut reply).is_err() {
                    return;
                }
                reply.first() == Some(&OK)
            }
        };
        if ok {
            *counts.entry(f.op).or_default() += 1;
        }
    }
}

/// The generators reach the deep paths: over well-formed versions of
/// generated cases, some puts are published and some leases read back.
#[test]
fn generators_reach_the_deep_paths() {
    let fx = Fixture::new();
    let mut runner = TestRunner::new(Config::default());
    let strategy = frames_case();
    let mut counts = HashMap::new();
    for _ in 0..cases(48) {
        let Case::Frames { frames, .. } = strategy.new_tree(&mut runner).unwrap().current() else {
            unreachable!()
        };
        let frames: Vec<Frame> = frames
            .into_iter()
            .filter_map(|mut f| {
                f.damage = Damage::None;
                if f.op == OP_WRITE {
                    let Field::U64(len) = f.fields[2] else {
                        unreachable!()
                    };
                    if len > MAX_PAYLOAD {
                        return None;
                    }
                    f.payload.len = len as usize;
                }
                Some(f)
            })
            .collect();
        ok_replies(&fx, &frames, &mut counts);
    }
    let mut listed: Vec<_> = counts.iter().collect();
    listed.sort();
    eprintln!("OK replies per op code: {listed:?}");
    for op in [OP_OPEN, OP_LANE, OP_RESERVE, OP_PUBLISH, OP_TAKE, OP_READ] {
        assert!(
            counts.get(&op).copied().unwrap_or(0) > 0,
            "no OK reply to op {op}"
        );
    }
    fx.check(0).unwrap();
    fx.assert_all_connections_end();
}

// ---------------------------------------------------------------------------
// Long mode

/// The resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Shrinks a failing case (bounded), returning the simplest failing one.
fn shrink(fx: &Fixture, mut tree: impl ValueTree<Value = Case>, why: String) -> (Case, String) {
    let mut best = (tree.current(), why);
    for _ in 0..256 {
        if !tree.simplify() {
            break;
        }
        loop {
            match fx.run_and_check(&tree.current()) {
                Err(why) => {
                    best = (tree.current(), why);
                    break;
                }
                Ok(()) => {
                    if !tree.complicate() {
                        return best;
                    }
                }
            }
        }
    }
    best
}

#[test]
fn long_mode() {
    let Some(seconds) = std::env::var("RLINF_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        eprintln!("long_mode: skipped (set RLINF_FUZZ_SECONDS=N to fuzz for N seconds)");
        return;
    };
    let threads: usize = std::env::var("RLINF_FUZZ_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let fx = Arc::new(Fixture::new());
    let duration = Duration::from_secs(seconds);
    let start = Instant::now();
    let failed = Arc::new(AtomicBool::new(false));
    let checks_done = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (fx, failed, checks_done) = (
                Arc::clone(&fx),
                Arc::clone(&failed),
                Arc::clone(&checks_done),
            );
            std::thread::spawn(move || -> Option<(Case, String)> {
                let mut runner = TestRunner::new(Config::default());
                let strategy = any_case();
                while start.elapsed() < duration && !failed.load(Ordering::Acquire) {
                    let tree = strategy.new_tree(&mut runner).unwrap();
                    if let Err(why) = fx.run_and_check(&tree.current()) {
                        failed.store(true, Ordering::Release);
                        return Some(shrink(&fx, tree, why));
                    }
                    checks_done.fetch_add(1, Ordering::Relaxed);
                }
                None
            })
        })
        .collect();
    // Sample the resident memory while the workers run.
    let mut samples: Vec<(u64, u64)> = Vec::new();
    while workers.iter().any(|w| !w.is_finished()) {
        std::thread::sleep(Duration::from_millis(500));
        let t = start.elapsed().as_secs();
        if samples.last().is_none_or(|&(last, _)| t >= last + 5) {
            samples.push((t, rss_kib()));
            eprintln!(
                "long_mode: {t:>5} s, {} cases, VmRSS {} MiB",
                fx.tally.cases.load(Ordering::Relaxed),
                rss_kib() >> 10
            );
        }
    }
    let failures: Vec<(Case, String)> = workers
        .into_iter()
        .filter_map(|w| w.join().unwrap())
        .collect();
    if let Some((case, why)) = failures.first() {
        panic!("long_mode: a case breaks the agent: {why}\nminimal case: {case:#?}");
    }
    samples.push((start.elapsed().as_secs(), rss_kib()));
    let max_rss = samples.iter().map(|s| s.1).max().unwrap_or(0);
    eprintln!(
        "long_mode: {} s, {} threads; {}; {} checks passed; max VmRSS {} MiB, final {} MiB",
        start.elapsed().as_secs(),
        threads,
        fx.tally.summary(),
        checks_done.load(Ordering::Relaxed),
        max_rss >> 10,
        samples.last().map_or(0, |s| s.1) >> 10,
    );
    fx.assert_all_connections_end();
    // Bounded: under a generous cap, and no steady growth (the last third
    // of the run no higher than the first third, give or take).
    const RSS_CAP_KIB: u64 = 2 << 20;
    assert!(
        max_rss < RSS_CAP_KIB,
        "VmRSS reached {max_rss} KiB (cap {RSS_CAP_KIB} KiB)"
    );
    if samples.len() >= 9 {
        let third = samples.len() / 3;
        let median = |s: &[(u64, u64)]| {
            let mut v: Vec<u64> = s.iter().map(|x| x.1).collect();
            v.sort_unstable();
            v[v.len() / 2]
        };
        let (early, late) = (
            median(&samples[1..third + 1]),
            median(&samples[samples.len() - third..]),
        );
        eprintln!(
            "long_mode: median VmRSS {} MiB early, {} MiB late",
            early >> 10,
            late >> 10
        );
        assert!(
            late <= early + early / 2 + (64 << 10),
            "VmRSS grew steadily: median {early} KiB early, {late} KiB late"
        );
    }
}

// ---------------------------------------------------------------------------
// Regressions: findings of this fuzzer (and of the review of the decoder
// that came with it), each as the smallest exchange that shows it. The
// `wire::read_frame` finding (a length prefix alone allocated the whole
// frame) is a unit test in src/wire.rs.

/// An authenticated control connection to the fixture's agent.
fn control(fx: &Fixture) -> TcpStream {
    let s = connect_stream(fx.agent.address(), Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// One request and its reply; an error means the agent dropped the
/// connection instead of answering.
fn call(s: &mut TcpStream, request: &[u8]) -> std::io::Result<Vec<u8>> {
    wire::write_frame(s, request)?;
    let mut reply = Vec::new();
    wire::read_frame(s, &mut reply)?;
    Ok(reply)
}

fn open_request(ns: &str, name: &str, arena: u64) -> Vec<u8> {
    Writer::new(OP_OPEN)
        .bytes(ns.as_bytes())
        .bytes(name.as_bytes())
        .u8(1)
        .u32(1)
        .u32(1)
        .u32(4)
        .u64(arena)
        .u32(0)
        .finish()
}

/// Found by `structured_frames_never_break_the_agent`: `OP_OPEN` creating a
/// channel with `arena_bytes` within a page of `u64::MAX` overflowed the
/// page rounding of the segment layout (a panic of the connection thread in
/// debug builds; in release, an arena that wrapped to 0 bytes).
#[test]
fn regression_open_with_an_arena_near_u64_max_is_refused() {
    let fx = Fixture::new();
    let mut s = control(&fx);
    for arena in [u64::MAX, u64::MAX - 4094, u64::MAX - (1 << 16)] {
        let reply = call(&mut s, &open_request(&fx.fuzz_ns, &fresh("r"), arena))
            .unwrap_or_else(|e| panic!("arena {arena}: the agent dropped the connection: {e}"));
        assert_eq!(reply[0], 7, "arena {arena}: wanted an Invalid reply");
    }
    let reply = call(&mut s, &open_request(&fx.fuzz_ns, &fresh("r"), 1 << 16)).unwrap();
    assert_eq!(reply[0], OK, "the connection still serves");
    drop(s);
    fx.check(0).unwrap();
    fx.assert_all_connections_end();
}

fn request_ok(s: &mut TcpStream, request: &[u8]) -> Vec<u8> {
    let reply = call(s, request).expect("the agent dropped the connection");
    assert_eq!(reply[0], OK, "request {:?} refused: {reply:?}", request[0]);
    reply
}

/// Found while writing the generators (review of `one_sided_write`): an
/// `OP_WRITE` to a token with no reservation recorded a "poisoned" token
/// anyway, so the reservation that later got that token failed to publish
/// (and the records of such writes grew without bound on a connection).
#[test]
fn regression_a_write_to_an_unknown_token_does_not_poison_a_later_put() {
    let fx = Fixture::new();
    let mut s = control(&fx);
    request_ok(&mut s, &open_request(&fx.fuzz_ns, &fresh("r"), 1 << 16));
    let reply = request_ok(&mut s, &Writer::new(OP_LANE).u32(0).bytes(b"a").finish());
    let lane = u32::from_le_bytes(reply[1..5].try_into().unwrap());
    // A stray write to token 1, which no reservation holds yet.
    let stray = Writer::new(OP_WRITE).u64(1).u64(0).u64(0).finish();
    wire::write_frame(&mut s, &stray).unwrap();
    let reserve = Writer::new(OP_RESERVE)
        .u32(0)
        .u32(lane)
        .u64(16)
        .i64(0)
        .i64(100)
        .u8(0)
        .finish();
    let reply = request_ok(&mut s, &reserve);
    let token = u64::from_le_bytes(reply[1..9].try_into().unwrap());
    assert_eq!(
        token, 1,
        "the first reservation of a connection gets token 1"
    );
    wire::write_frame(
        &mut s,
        &Writer::new(OP_WRITE).u64(1).u64(0).u64(16).finish(),
    )
    .unwrap();
    s.write_all(&[7u8; 16]).unwrap();
    request_ok(&mut s, &Writer::new(OP_PUBLISH).u64(1).finish());
    drop(s);
    fx.check(0).unwrap();
    fx.assert_all_connections_end();
}

/// Found while writing the generators (review of `OP_OPEN`): one connection
/// could open channels without bound, each holding a file descriptor and a
/// mapping of the whole segment, until the process ran out of either (and
/// then every connection failed, not just that one).
#[test]
fn regression_a_connection_opens_a_bounded_number_of_channels() {
    let fx = Fixture::new();
    let name = fresh("r");
    let _home = Channel::create(
        &fx.fuzz_ns,
        &name,
        ChannelOptions {
            max_lanes: 1,
            lane_capacity: 1,
            max_blocks: 1,
            arena_bytes: 1 << 16,
            user_tag: 0,
        },
    )
    .unwrap();
    let attach = Writer::new(OP_OPEN)
        .bytes(fx.fuzz_ns.as_bytes())
        .bytes(name.as_bytes())
        .u8(0)
        .u32(0)
        .u32(0)
        .u32(0)
        .u64(0)
        .u32(0)
        .finish();
    let mut s = control(&fx);
    for _ in 0..MAX_SESSION_CHANNELS {
        request_ok(&mut s, &attach);
    }
    let reply = call(&mut s, &attach).expect("the agent dropped the connection");
    assert_eq!(reply[0], 7, "one open past the limit must be refused");
    // The connection still serves its channels.
    request_ok(&mut s, &Writer::new(OP_CLOSED).u32(0).finish());
    drop(s);
    fx.check(0).unwrap();
    fx.assert_all_connections_end();
}
