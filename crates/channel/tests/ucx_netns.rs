//! Two "nodes" in two network namespaces joined by a veth pair, over UCX's
//! tcp transport (feature `ucx`): an agent in one namespace serves a channel
//! homed on this host; a producer in the other reaches it only through the
//! veth link (each side's UCX is limited to its veth device), puts items,
//! and this process checks them.
//!
//! Needs root and `ip` (iproute2): otherwise the test returns early and says
//! why, except under CI (`CI` set and not `false`/`0`, as CI runners set it),
//! where it must run and so fails with the reason instead. The namespaces and
//! the link are removed at the end, also on failure.
#![cfg(rlinf_ucx)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rlinf_channel::auth;
use rlinf_channel::channel::parse_message;
use rlinf_channel::{Agent, Channel, ChannelOptions, RemoteChannel, UcxTransport};

const ITEMS: u64 = 4;
const ITEM: usize = 4 << 20;
const BOUND: Duration = Duration::from_secs(60);

/// The channel secret this test and its child processes share (children get it
/// as `RLINF_CHANNEL_SECRET`).
const TEST_SECRET: &str = "rlinf-channel test secret";

fn share_test_secret() {
    auth::set_process_secret(auth::Secret::new(TEST_SECRET).unwrap());
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Two namespaces `a`, `b` with `10.<x>.0.1` and `10.<x>.0.2` on a veth pair.
struct Netns {
    a: String,
    b: String,
}

impl Netns {
    fn new() -> Option<Self> {
        let id = std::process::id() % 10_000;
        let n = Self {
            a: format!("rlucxa{id}"),
            b: format!("rlucxb{id}"),
        };
        let (va, vb) = (format!("rlva{id}"), format!("rlvb{id}"));
        let ok = ip(&["netns", "add", &n.a])
            && ip(&["netns", "add", &n.b])
            && ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])
            && ip(&["link", "set", &va, "netns", &n.a])
            && ip(&["link", "set", &vb, "netns", &n.b])
            && ip(&["-n", &n.a, "addr", "add", "10.213.0.1/24", "dev", &va])
            && ip(&["-n", &n.b, "addr", "add", "10.213.0.2/24", "dev", &vb])
            && ip(&["-n", &n.a, "link", "set", &va, "up"])
            && ip(&["-n", &n.b, "link", "set", &vb, "up"])
            && ip(&["-n", &n.a, "link", "set", "lo", "up"])
            && ip(&["-n", &n.b, "link", "set", "lo", "up"]);
        // On failure, dropping `n` removes whatever was created.
        ok.then_some(n)
    }

    fn spawn(&self, ns: &str, role: &str, env: &[(&str, &str)]) -> Child {
        let id = std::process::id() % 10_000;
        let dev = if ns == self.a {
            format!("rlva{id}")
        } else {
            format!("rlvb{id}")
        };
        share_test_secret();
        Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env("RLINF_TEST_CHILD", role)
            .env(auth::SECRET_ENV, TEST_SECRET)
            .env("UCX_TLS", "tcp")
            .env("UCX_NET_DEVICES", dev)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and with it the pair.
        ip(&["netns", "delete", &self.a]);
        ip(&["netns", "delete", &self.b]);
    }
}

/// Whether this run is CI's (`CI` set to anything but empty, `false` or `0`).
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "False"))
}

/// Skips the test with `reason` on a developer machine; under CI, where the
/// test must run, fails with it.
fn cannot_run(reason: &str) {
    assert!(
        !in_ci(),
        "the UCX network-namespace test cannot run under CI: {reason}"
    );
    eprintln!("skipped: {reason}");
}

/// Entry point of child processes; a no-op in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("RLINF_TEST_CHILD") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    match role.as_str() {
        "agent" => {
            rlinf_channel::agent::set_ucx_home_helper(vec![
                env!("CARGO_BIN_EXE_rlinf-ucx-home").into(),
            ]);
            let agent = Agent::start("10.213.0.1:0").unwrap();
            let flag = var("RLINF_TEST_FLAG");
            std::fs::write(format!("{flag}.tmp"), agent.address()).unwrap();
            std::fs::rename(format!("{flag}.tmp"), flag).unwrap();
            thread::sleep(Duration::from_secs(120));
        }
        "producer" => {
            let ch = RemoteChannel::connect(
                Arc::new(UcxTransport::new()),
                &var("RLINF_TEST_AGENT"),
                &var("RLINF_TEST_NS"),
                &var("RLINF_TEST_NAME"),
                None,
            )
            .unwrap();
            assert_eq!(ch.transport(), "ucx");
            let lane = ch.lane(b"k").unwrap();
            for seq in 0..ITEMS {
                let payload = vec![seq as u8 + 1; ITEM];
                ch.put(lane, &seq.to_le_bytes(), &[&payload], 0, None, false)
                    .unwrap();
            }
        }
        other => panic!("unknown child role {other}"),
    }
}

#[test]
fn producer_in_another_network_namespace_puts_over_ucx_tcp() {
    if std::env::var("RLINF_TEST_CHILD").is_ok() {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        cannot_run("creating network namespaces needs root");
        return;
    }
    let Some(net) = Netns::new() else {
        cannot_run("`ip netns`/veth set-up failed (no iproute2 or no CONFIG_NET_NS)");
        return;
    };
    let ns = format!("ucxns{}", std::process::id());
    let home = Channel::create(
        &ns,
        "c",
        ChannelOptions {
            max_lanes: 4,
            lane_capacity: 8,
            max_blocks: 16,
            arena_bytes: 64 << 20,
            user_tag: 0,
        },
    )
    .unwrap();
    let lane = home.lane(b"k").unwrap();
    let flag = std::env::temp_dir().join(format!("rlinf-ucxns-{}", std::process::id()));
    let mut agent = net.spawn(
        &net.a,
        "agent",
        &[("RLINF_TEST_FLAG", flag.to_str().unwrap())],
    );
    let deadline = Instant::now() + BOUND;
    while !flag.exists() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    let address = std::fs::read_to_string(&flag).expect("the agent never started");
    let _ = std::fs::remove_file(&flag);
    let mut producer = net.spawn(
        &net.b,
        "producer",
        &[
            ("RLINF_TEST_AGENT", &address),
            ("RLINF_TEST_NS", &ns),
            ("RLINF_TEST_NAME", "c"),
        ],
    );
    for seq in 0..ITEMS {
        let lease = home.get(lane, Some(BOUND), false).unwrap();
        let image = lease.bytes();
        let m = parse_message(image).unwrap();
        assert_eq!(&image[m.header.0..m.header.0 + 8], &seq.to_le_bytes());
        let (off, len) = m.buffers[0];
        assert_eq!(len, ITEM);
        assert!(image[off..off + len].iter().all(|&b| b == seq as u8 + 1));
    }
    let status = producer.wait().unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(status.success(), "the producer failed: {status}");
}
