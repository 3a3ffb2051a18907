//! A build with the UCX transport, run where UCX's runtime library is
//! missing: the crate works over TCP, `RLINF_CHANNEL_TRANSPORT=ucx` fails
//! with an error naming the library and the fix, and `auto` falls back to
//! TCP. The missing library is real: `RLINF_UCX_LIBRARY` points the loader
//! at a path that does not exist (UCX is loaded once per process, so this
//! file holds a single test and sets the variable before anything loads).
#![cfg(rlinf_ucx)]

use std::io;
use std::sync::Arc;

use rlinf_channel::channel::parse_message;
use rlinf_channel::transport::{self, TRANSPORT_ENV};
use rlinf_channel::{Agent, Channel, ChannelOptions, RemoteChannel};

#[test]
fn without_libucp_ucx_errors_clearly_and_auto_uses_tcp() {
    // SAFETY: this binary's only test, run before any thread of ours reads
    // the environment (UCX has not been loaded yet).
    unsafe { std::env::set_var("RLINF_UCX_LIBRARY", "/nonexistent/rlinf-test/libucp.so.0") };

    let why = transport::ucx_unavailable().expect("UCX must be unavailable here");
    for part in [
        "/nonexistent/rlinf-test/libucp.so.0",
        "apt-get install libucx0",
        "ucx_info -d",
    ] {
        assert!(why.contains(part), "{part:?} missing from: {why}");
    }

    let err = transport::select(Some("ucx")).err().expect("ucx must fail");
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    let msg = err.to_string();
    for part in [TRANSPORT_ENV, "libucp.so.0", "apt-get install libucx0"] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    // Asking again gives the same answer (the load is not retried).
    assert_eq!(transport::ucx_unavailable().as_deref(), Some(why.as_str()));

    // `auto` reaches the agent over TCP and moves data.
    let ns = format!("ucxm{}", std::process::id());
    let opts = ChannelOptions {
        max_lanes: 2,
        lane_capacity: 4,
        max_blocks: 8,
        arena_bytes: 8 << 20,
        user_tag: 0,
    };
    let home = Channel::create(&ns, "c", opts).unwrap();
    let agent = Agent::start("127.0.0.1:0").unwrap();
    let t = transport::select(Some("auto")).unwrap();
    let remote = RemoteChannel::connect(Arc::clone(&t), agent.address(), &ns, "c", None).unwrap();
    assert_eq!(remote.transport(), "tcp");
    let lane = remote.lane(b"k").unwrap();
    let payload = vec![7u8; 1 << 20];
    remote.put(lane, b"h", &[&payload], 0, None, false).unwrap();
    let lease = home.get(home.lane(b"k").unwrap(), None, false).unwrap();
    let m = parse_message(lease.bytes()).unwrap();
    let body = &lease.bytes()[m.buffers[0].0..m.buffers[0].0 + m.buffers[0].1];
    assert!(body == payload.as_slice());
}
