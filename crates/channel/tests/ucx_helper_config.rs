//! The agent's UCX home helper command (feature `ucx`): none configured, a
//! missing program, or a helper that dies before answering each make a UCX
//! connection fail with a clear error naming the cause, while the agent
//! keeps serving; the `rlinf-ucx-home` binary then works. One test in this
//! binary: the helper command is process-wide.
#![cfg(rlinf_ucx)]

use std::sync::Arc;

use rlinf_channel::agent::{UCX_HOME_HELPER_ENV, set_ucx_home_helper};
use rlinf_channel::channel::parse_message;
use rlinf_channel::{Agent, Channel, ChannelOptions, RemoteChannel, TcpTransport, UcxTransport};

#[test]
fn a_bad_helper_fails_the_ucx_connection_clearly() {
    if std::env::var_os(UCX_HOME_HELPER_ENV).is_some() {
        eprintln!("skipped: {UCX_HOME_HELPER_ENV} is set");
        return;
    }
    let ns = format!("ucxh{}", std::process::id());
    let opts = ChannelOptions {
        max_lanes: 2,
        lane_capacity: 4,
        max_blocks: 8,
        arena_bytes: 8 << 20,
        user_tag: 0,
    };
    let home = Channel::create(&ns, "c", opts).unwrap();
    let agent = Agent::start("127.0.0.1:0").unwrap();
    let ucx = || {
        let t = Arc::new(UcxTransport::with_tls("tcp"));
        RemoteChannel::connect(t, agent.address(), &ns, "c", None)
    };
    let err = ucx().err().expect("no helper configured").to_string();
    assert!(err.contains(UCX_HOME_HELPER_ENV), "{err}");
    set_ucx_home_helper(vec!["/nonexistent/rlinf-ucx-home".into()]);
    let err = ucx().err().expect("missing helper").to_string();
    assert!(err.contains("/nonexistent/rlinf-ucx-home"), "{err}");
    set_ucx_home_helper(vec!["false".into()]);
    let err = ucx().err().expect("helper died at start").to_string();
    assert!(err.contains("gave no answer"), "{err}");
    assert!(agent.ucx_helper_pids().is_empty());
    // The agent still serves TCP, and UCX with the real helper.
    let tcp = RemoteChannel::connect(Arc::new(TcpTransport), agent.address(), &ns, "c", None);
    tcp.unwrap().lane(b"k").unwrap();
    set_ucx_home_helper(vec![env!("CARGO_BIN_EXE_rlinf-ucx-home").into()]);
    let remote = ucx().unwrap();
    assert_eq!(remote.transport(), "ucx");
    let lane = remote.lane(b"k").unwrap();
    let payload = [1u8; 4096];
    remote.put(lane, b"h", &[&payload], 0, None, false).unwrap();
    // The bytes went through the helper's mapping into the home's segment.
    let lease = home.get(lane, None, false).unwrap();
    let m = parse_message(lease.bytes()).unwrap();
    let body = &lease.bytes()[m.buffers[0].0..m.buffers[0].0 + m.buffers[0].1];
    assert!(body == payload.as_slice());
    drop(lease);
    assert_eq!(agent.ucx_helper_pids().len(), 1);
}
