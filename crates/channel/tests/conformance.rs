//! The same behaviour over every path: local shared memory, and a remote
//! client reaching the channel through the agent (the cross-node path) over
//! TCP and, with the `ucx` feature, over UCX restricted to its `tcp` and to
//! its shared-memory (`sm`) transports.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rlinf_channel::channel::parse_message;
use rlinf_channel::{Agent, Channel, ChannelError, ChannelOptions, RemoteChannel, TcpTransport};

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn ns() -> String {
    format!("conf{}", std::process::id())
}

/// What the conformance tests need from a channel handle.
trait Handle: Send + Sync {
    fn lane(&self, key: &[u8]) -> u32;
    fn put(
        &self,
        lane: u32,
        header: &[u8],
        bufs: &[&[u8]],
        weight: i64,
        timeout: Option<Duration>,
        nb: bool,
    ) -> Result<(), ChannelError>;
    /// Message images of one item (target 0) or a batch.
    fn take(
        &self,
        lane: u32,
        target: i64,
        timeout: Option<Duration>,
        nb: bool,
    ) -> Result<Vec<Vec<u8>>, ChannelError>;
    fn qsize(&self, lane: u32) -> u64;
    fn close(&self);
}

impl Handle for Channel {
    fn lane(&self, key: &[u8]) -> u32 {
        Channel::lane(self, key).unwrap()
    }
    fn put(
        &self,
        lane: u32,
        h: &[u8],
        b: &[&[u8]],
        w: i64,
        t: Option<Duration>,
        nb: bool,
    ) -> Result<(), ChannelError> {
        Channel::put(self, lane, h, b, w, t, nb)
    }
    fn take(
        &self,
        lane: u32,
        target: i64,
        t: Option<Duration>,
        nb: bool,
    ) -> Result<Vec<Vec<u8>>, ChannelError> {
        let leases = if target == 0 {
            vec![self.get(lane, t, nb)?]
        } else {
            self.get_batch(lane, target, t)?
        };
        Ok(leases.iter().map(|l| l.bytes().to_vec()).collect())
    }
    fn qsize(&self, lane: u32) -> u64 {
        Channel::qsize(self, lane).unwrap()
    }
    fn close(&self) {
        Channel::close(self)
    }
}

impl Handle for RemoteChannel {
    fn lane(&self, key: &[u8]) -> u32 {
        RemoteChannel::lane(self, key).unwrap()
    }
    fn put(
        &self,
        lane: u32,
        h: &[u8],
        b: &[&[u8]],
        w: i64,
        t: Option<Duration>,
        nb: bool,
    ) -> Result<(), ChannelError> {
        RemoteChannel::put(self, lane, h, b, w, t, nb)
    }
    fn take(
        &self,
        lane: u32,
        target: i64,
        t: Option<Duration>,
        nb: bool,
    ) -> Result<Vec<Vec<u8>>, ChannelError> {
        RemoteChannel::take(self, lane, target, t, nb)
    }
    fn qsize(&self, lane: u32) -> u64 {
        RemoteChannel::qsize(self, lane).unwrap()
    }
    fn close(&self) {
        RemoteChannel::close(self).unwrap()
    }
}

/// The channel's home handle, a handle of the kind under test, and the agent.
fn setup(kind: &str, opts: ChannelOptions) -> (Channel, Arc<dyn Handle>, Option<Agent>) {
    let name = format!("c{}", COUNTER.fetch_add(1, Ordering::Relaxed));
    let home = Channel::create(&ns(), &name, opts).unwrap();
    match kind {
        "shm" => {
            let other = Channel::attach(&ns(), &name).unwrap();
            (home, Arc::new(other), None)
        }
        "tcp" => {
            let agent = Agent::start("127.0.0.1:0").unwrap();
            let remote =
                RemoteChannel::connect(Arc::new(TcpTransport), agent.address(), &ns(), &name, None)
                    .unwrap();
            (home, Arc::new(remote), Some(agent))
        }
        #[cfg(rlinf_ucx)]
        ucx if ucx.starts_with("ucx-") => {
            rlinf_channel::agent::set_ucx_home_helper(vec![
                env!("CARGO_BIN_EXE_rlinf-ucx-home").into(),
            ]);
            let agent = Agent::start("127.0.0.1:0").unwrap();
            let transport = rlinf_channel::UcxTransport::with_tls(&ucx["ucx-".len()..]);
            let remote =
                RemoteChannel::connect(Arc::new(transport), agent.address(), &ns(), &name, None)
                    .unwrap();
            assert_eq!(remote.transport(), "ucx");
            (home, Arc::new(remote), Some(agent))
        }
        _ => unreachable!(),
    }
}

fn opts() -> ChannelOptions {
    ChannelOptions {
        max_lanes: 8,
        lane_capacity: 8,
        max_blocks: 64,
        arena_bytes: 256 << 20,
        user_tag: 0,
    }
}

fn header_of(image: &[u8]) -> Vec<u8> {
    let m = parse_message(image).unwrap();
    image[m.header.0..m.header.0 + m.header.1].to_vec()
}

/// The paths under test: shared memory, TCP, and (feature `ucx`) UCX over
/// its `tcp` and `sm` transports.
const KINDS: &[&str] = &[
    "shm",
    "tcp",
    #[cfg(rlinf_ucx)]
    "ucx-tcp",
    #[cfg(rlinf_ucx)]
    "ucx-sm",
];

fn for_each_kind(test: impl Fn(&str)) {
    for kind in KINDS {
        test(kind);
    }
}

#[test]
fn fifo_per_key_both_directions() {
    for_each_kind(|kind| {
        let (home, h, _agent) = setup(kind, opts());
        let (a, b) = (h.lane(b"a"), h.lane(b"b"));
        for i in 0..5u8 {
            h.put(a, &[i], &[], 0, None, false).unwrap(); // remote -> home
            Handle::put(&home, b, &[10 + i], &[], 0, None, false).unwrap(); // home -> remote
        }
        for i in 0..5u8 {
            assert_eq!(
                header_of(&Handle::take(&home, a, 0, None, false).unwrap()[0]),
                vec![i],
                "{kind}"
            );
            assert_eq!(
                header_of(&h.take(b, 0, None, false).unwrap()[0]),
                vec![10 + i],
                "{kind}"
            );
        }
        assert!(
            matches!(h.take(a, 0, None, true), Err(ChannelError::Empty)),
            "{kind}"
        );
    });
}

#[test]
fn large_payloads_with_buffers_arrive_intact() {
    for_each_kind(|kind| {
        let (home, h, _agent) = setup(kind, opts());
        let l = h.lane(b"big");
        let data: Vec<u8> = (0..(64usize << 20)).map(|i| (i * 31 % 251) as u8).collect();
        h.put(l, b"hdr", &[b"x", &data], 0, None, false).unwrap();
        let image = &Handle::take(&home, l, 0, Some(Duration::from_secs(10)), false).unwrap()[0];
        let m = parse_message(image).unwrap();
        assert_eq!(m.buffers.len(), 2);
        let (off, len) = m.buffers[1];
        assert_eq!(len, data.len());
        assert!(
            image[off..off + len] == data[..],
            "{kind}: payload corrupted"
        );
    });
}

#[test]
fn weighted_batches() {
    for_each_kind(|kind| {
        let (_home, h, _agent) = setup(kind, opts());
        let l = h.lane(b"w");
        for (i, w) in [1i64, 2, 3].into_iter().enumerate() {
            h.put(l, &[i as u8], &[], w, None, false).unwrap();
        }
        let batch = h.take(l, 3, Some(Duration::from_secs(2)), false).unwrap();
        assert_eq!(
            batch.iter().map(|m| header_of(m)[0]).collect::<Vec<_>>(),
            vec![0, 1],
            "{kind}"
        );
        h.put(l, b"z", &[], 2, None, false).unwrap();
        assert!(matches!(
            h.take(l, 4, Some(Duration::from_secs(2)), false),
            Err(ChannelError::Invalid(_))
        ));
    });
}

#[test]
fn backpressure_timeouts_and_close() {
    for_each_kind(|kind| {
        let mut o = opts();
        o.lane_capacity = 2;
        let (home, h, _agent) = setup(kind, o);
        let l = h.lane(b"bp");
        h.put(l, b"1", &[], 0, None, false).unwrap();
        h.put(l, b"2", &[], 0, None, false).unwrap();
        assert!(
            matches!(h.put(l, b"3", &[], 0, None, true), Err(ChannelError::Full)),
            "{kind}"
        );
        let t0 = Instant::now();
        assert!(matches!(
            h.put(l, b"3", &[], 0, Some(Duration::from_millis(200)), false),
            Err(ChannelError::Timeout)
        ));
        assert!(
            t0.elapsed() >= Duration::from_millis(190) && t0.elapsed() < Duration::from_secs(3),
            "{kind}"
        );
        assert_eq!(h.qsize(l), 2);
        // A blocked getter on another lane is woken by close.
        let h2 = Arc::clone(&h);
        let empty = h.lane(b"empty");
        let waiter = thread::spawn(move || h2.take(empty, 0, None, false).map(|_| ()));
        thread::sleep(Duration::from_millis(100));
        Handle::close(&home);
        assert!(
            matches!(waiter.join().unwrap(), Err(ChannelError::Closed)),
            "{kind}"
        );
        assert!(
            matches!(
                h.put(l, b"4", &[], 0, None, false),
                Err(ChannelError::Closed)
            ),
            "{kind}"
        );
        // Queued items still drain.
        assert_eq!(header_of(&h.take(l, 0, None, false).unwrap()[0]), b"1");
    });
}

#[test]
fn oversize_messages_are_refused_with_a_reason() {
    for_each_kind(|kind| {
        let mut o = opts();
        o.arena_bytes = 1 << 20;
        let (_home, h, _agent) = setup(kind, o);
        let l = h.lane(b"o");
        let big = vec![0u8; 2 << 20];
        match h.put(l, b"", &[&big], 0, None, false) {
            Err(ChannelError::Invalid(m)) => assert!(m.contains("capacity_bytes"), "{kind}: {m}"),
            other => panic!("{kind}: {other:?}"),
        }
    });
}

#[test]
fn remote_peer_disconnecting_mid_put_withdraws_its_reservation() {
    let (home, _h, agent) = setup("tcp", opts());
    let agent = agent.unwrap();
    let l = Channel::lane(&home, b"k").unwrap();
    // Speak the protocol by hand: reserve, send half the payload, hang up.
    use rlinf_channel::protocol::*;
    use rlinf_channel::transport::Transport;
    use rlinf_channel::wire::{Reader, Writer};
    let mut ep = TcpTransport
        .connect(agent.address(), Duration::from_secs(5))
        .unwrap();
    let mut reply = Vec::new();
    let name = home.segment_name().rsplit('.').next().unwrap().to_owned();
    let open = Writer::new(OP_OPEN)
        .bytes(ns().as_bytes())
        .bytes(name.as_bytes())
        .u8(0)
        .u32(0)
        .u32(0)
        .u32(0)
        .u64(0)
        .u32(0);
    ep.call(&open.finish(), &mut reply).unwrap();
    assert_eq!(reply[0], OK);
    let handle = Reader::new(&reply[1..]).u32().unwrap();
    let reserve = Writer::new(OP_RESERVE)
        .u32(handle)
        .u32(l)
        .u64(1000)
        .i64(0)
        .i64(1000)
        .u8(0)
        .finish();
    ep.call(&reserve, &mut reply).unwrap();
    assert_eq!(reply[0], OK);
    assert_eq!(home.qsize(l).unwrap(), 1, "the reservation holds a slot");
    drop(ep); // peer gone before publishing
    Channel::put(&home, l, b"next", &[], 0, None, false).unwrap();
    let lease = home.get(l, Some(Duration::from_secs(5)), false).unwrap();
    assert_eq!(
        header_of(lease.bytes()),
        b"next",
        "the withdrawn item is skipped"
    );
    drop(lease);
    let deadline = Instant::now() + Duration::from_secs(5);
    while home.stats().unwrap().writing_blocks > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(home.stats().unwrap().writing_blocks, 0);
}

#[test]
fn unreachable_agent_is_a_clear_error() {
    let err = RemoteChannel::connect(Arc::new(TcpTransport), "127.0.0.1:1", "ns", "x", None)
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("cannot reach the channel agent at 127.0.0.1:1"),
        "{err}"
    );
}
