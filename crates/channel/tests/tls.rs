//! TLS on agent connections (feature `tls`): a remote put/get over TLS keeps
//! exact bytes and keeps them off the wire, a wrong secret is refused inside
//! TLS, plain and TLS clients share one agent, a relay that terminates TLS
//! cannot pass the bound challenge-response, and a TLS connection cannot say
//! the UCX hello.
#![cfg(feature = "tls")]

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use rlinf_channel::agent::AgentOptions;
use rlinf_channel::auth::{self, SECRET_ENV, Secret};
use rlinf_channel::channel::parse_message;
use rlinf_channel::protocol::{OK, OP_UCX_HELLO};
use rlinf_channel::transport::tcp::{TcpEndpoint, connect_secured};
use rlinf_channel::transport::{Endpoint, Transport};
use rlinf_channel::wire::{Reader, Writer};
use rlinf_channel::{
    Agent, Channel, ChannelError, ChannelOptions, RemoteChannel, TcpTransport, TlsTransport,
};

static COUNTER: AtomicU64 = AtomicU64::new(0);
const TIMEOUT: Duration = Duration::from_secs(10);

fn ns() -> String {
    format!("tls{}", std::process::id())
}

fn opts() -> ChannelOptions {
    ChannelOptions {
        max_lanes: 8,
        lane_capacity: 64,
        max_blocks: 64,
        arena_bytes: 64 << 20,
        user_tag: 0,
    }
}

/// A fresh channel on this node and an agent serving it.
fn home() -> (Channel, String, Agent) {
    let name = format!("c{}", COUNTER.fetch_add(1, Ordering::Relaxed));
    let ch = Channel::create(&ns(), &name, opts()).unwrap();
    (ch, name, Agent::start("127.0.0.1:0").unwrap())
}

fn remote(t: impl Transport + 'static, address: &str, name: &str) -> RemoteChannel {
    RemoteChannel::connect(Arc::new(t), address, &ns(), name, None).unwrap()
}

/// `n` bytes of a pattern that differs at every offset modulo 251.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ seed).collect()
}

#[test]
fn a_tls_round_trip_keeps_exact_bytes_both_ways() {
    let (home, name, agent) = home();
    let r = remote(TlsTransport, agent.address(), &name);
    assert_eq!(r.transport(), "tcp+tls");
    let lane = r.lane(b"k").unwrap();
    let (small, big, empty) = (pattern(3, 1), pattern((5 << 20) + 7, 2), Vec::new());

    // Remote put, home get.
    r.put(lane, b"head", &[&small, &big, &empty], 1, None, false)
        .unwrap();
    let lease = home.get(lane, Some(TIMEOUT), false).unwrap();
    assert_eq!(
        split(lease.bytes()),
        (b"head".to_vec(), vec![small.clone(), big.clone(), empty])
    );
    drop(lease);

    // Home put, remote take (one item, then a batch of two).
    home.put(lane, b"back", &[&big], 1, None, false).unwrap();
    let items = r.take(lane, 0, Some(TIMEOUT), false).unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(split(&items[0]), (b"back".to_vec(), vec![big]));
    for i in 0..2u8 {
        home.put(lane, &[i], &[&small], 1, None, false).unwrap();
    }
    let batch = r.take(lane, 2, Some(TIMEOUT), false).unwrap();
    let headers: Vec<Vec<u8>> = batch.iter().map(|m| split(m).0).collect();
    assert_eq!(headers, [[0u8], [1u8]]);
    assert_eq!(r.qsize(lane).unwrap(), 0);
}

#[test]
fn a_wrong_secret_over_tls_is_refused() {
    let agent = Agent::start_with(
        "127.0.0.1:0",
        AgentOptions {
            secret: Some(Arc::new(Secret::new(*b"another secret, 16+").unwrap())),
            ..AgentOptions::default()
        },
    )
    .unwrap();
    let err = RemoteChannel::connect(Arc::new(TlsTransport), agent.address(), "n", "x", None)
        .err()
        .unwrap();
    match err {
        ChannelError::Io(e) => {
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
            assert!(e.to_string().contains(SECRET_ENV), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn plain_and_tls_clients_are_served_by_one_agent_at_once() {
    let (home, name, agent) = home();
    let address = agent.address().to_owned();
    let clients: Vec<_> = [("plain", false), ("tls", true)]
        .into_iter()
        .map(|(key, tls)| {
            let (address, name) = (address.clone(), name.clone());
            thread::spawn(move || {
                let r = if tls {
                    remote(TlsTransport, &address, &name)
                } else {
                    remote(TcpTransport, &address, &name)
                };
                assert_eq!(r.transport(), if tls { "tcp+tls" } else { "tcp" });
                let lane = r.lane(key.as_bytes()).unwrap();
                for i in 0..20u8 {
                    r.put(lane, &[i], &[&pattern(4096, i)], 1, None, false)
                        .unwrap();
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    for key in ["plain", "tls"] {
        let lane = home.lane(key.as_bytes()).unwrap();
        for i in 0..20u8 {
            let lease = home.get(lane, Some(TIMEOUT), false).unwrap();
            assert_eq!(split(lease.bytes()), (vec![i], vec![pattern(4096, i)]));
        }
    }
}

/// A transparent TCP forwarder that records what the client sent.
fn recording_relay(target: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    thread::spawn(move || {
        for client in listener.incoming() {
            let client = client.unwrap();
            let agent = TcpStream::connect(&target).unwrap();
            let (mut c2, mut a2) = (client.try_clone().unwrap(), agent.try_clone().unwrap());
            thread::spawn(move || io::copy(&mut a2, &mut c2));
            let record = Arc::clone(&record);
            thread::spawn(move || {
                let (mut client, mut agent) = (client, agent);
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = client.read(&mut buf) {
                    record.lock().unwrap().extend_from_slice(&buf[..n]);
                    if agent.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = agent.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (address, seen)
}

/// The header and buffers of a message image.
fn split(image: &[u8]) -> (Vec<u8>, Vec<Vec<u8>>) {
    let m = parse_message(image).unwrap();
    let part = |(off, len): (usize, usize)| image[off..off + len].to_vec();
    (
        part(m.header),
        m.buffers.iter().copied().map(part).collect(),
    )
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn tls_keeps_the_payload_off_the_wire() {
    let (home, name, agent) = home();
    let marker = b"an RLinf payload that must not be seen on the wire".repeat(100);
    for tls in [false, true] {
        let (relay, seen) = recording_relay(agent.address().to_owned());
        let r = if tls {
            remote(TlsTransport, &relay, &name)
        } else {
            remote(TcpTransport, &relay, &name)
        };
        let lane = r.lane(b"k").unwrap();
        r.put(lane, b"h", &[&marker], 1, None, false).unwrap();
        let lease = home.get(lane, Some(TIMEOUT), false).unwrap();
        assert_eq!(split(lease.bytes()).1, std::slice::from_ref(&marker));
        let seen = seen.lock().unwrap();
        // The plain client is the positive control: the relay does see its bytes.
        assert_eq!(
            contains(&seen, &marker[..64]),
            !tls,
            "tls={tls}: {} bytes seen",
            seen.len()
        );
        assert!(
            !tls || seen[0] == 0x16,
            "a TLS client opens with a ClientHello"
        );
    }
}

/// The agent's half of a relay: plain TCP, or TLS as a client.
enum Upstream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Upstream {
    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            Self::Plain(s) => s,
            Self::Tls(s) => &mut **s,
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Accepts any certificate (the relay's own TLS client to the agent).
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[allow(deprecated)] // the ring provider, as the crate uses
fn ring() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_to_agent(address: &str) -> Upstream {
    let config = rustls::ClientConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(ring())))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("relay").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    Upstream::Tls(Box::new(rustls::StreamOwned::new(
        conn,
        TcpStream::connect(address).unwrap(),
    )))
}

fn tls_from_client(client: TcpStream) -> rustls::StreamOwned<rustls::ServerConnection, TcpStream> {
    let cert = rcgen::generate_simple_self_signed(vec!["relay".to_owned()]).unwrap();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der());
    let config = rustls::ServerConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key.into())
        .unwrap();
    let conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
    rustls::StreamOwned::new(conn, client)
}

/// Relays one connection's challenge-response message by message between a
/// client and the agent at `agent`, terminating TLS on each side where
/// asked: the greeting (40 bytes) to the agent, the challenge (72) back, the
/// proof (32) to the agent, the verdict (1) back. Returns the relay's
/// address and what the relay saw of the verdict.
fn splicing_relay(
    agent: String,
    tls_to_client: bool,
    tls_upstream: bool,
) -> (String, thread::JoinHandle<Option<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let relay = thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        client.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut tls_client;
        let mut plain_client = client.try_clone().unwrap();
        let down: &mut dyn ReadWrite = if tls_to_client {
            tls_client = tls_from_client(client);
            &mut tls_client
        } else {
            &mut plain_client
        };
        let mut up = if tls_upstream {
            tls_to_agent(&agent)
        } else {
            Upstream::Plain(TcpStream::connect(&agent).unwrap())
        };
        let forward = |from: &mut dyn ReadWrite, to: &mut dyn ReadWrite, n: usize| {
            let mut buf = vec![0u8; n];
            from.read_exact(&mut buf).ok()?;
            to.write_all(&buf).ok()?;
            to.flush().ok()?;
            Some(buf)
        };
        forward(down, up.io(), 40)?;
        forward(up.io(), down, 72)?;
        forward(down, up.io(), 32)?;
        forward(up.io(), down, 1).map(|v| v[0])
    });
    (address, relay)
}

#[test]
fn a_relay_that_terminates_tls_cannot_pass_the_bound_handshake() {
    let agent = Agent::start("127.0.0.1:0").unwrap();
    let target = agent.address().to_owned();

    // Positive control: the same relay, plain on both sides, passes the
    // handshake (it forwards exactly the protocol's messages).
    let (relay, verdict) = splicing_relay(target.clone(), false, false);
    connect_secured(&relay, TIMEOUT, false).unwrap();
    assert_eq!(verdict.join().unwrap(), Some(OK));

    // TLS to the client, then TLS or plain to the agent: the exporter values
    // differ, so the client refuses the agent's proof and the relay never
    // gets a proof it could pass on.
    for tls_upstream in [true, false] {
        let (relay, verdict) = splicing_relay(target.clone(), true, tls_upstream);
        let err = connect_secured(&relay, TIMEOUT, true)
            .err()
            .unwrap_or_else(|| panic!("upstream tls={tls_upstream}: the relay got through"));
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains("interceptor"), "{err}");
        assert_eq!(verdict.join().unwrap(), None, "upstream tls={tls_upstream}");
    }
}

#[test]
fn a_tls_connection_cannot_say_the_ucx_hello() {
    let agent = Agent::start("127.0.0.1:0").unwrap();
    let mut ep =
        TcpEndpoint::new(connect_secured(agent.address(), TIMEOUT, true).unwrap()).unwrap();
    assert_eq!(ep.transport(), "tcp+tls");
    let mut reply = Vec::new();
    ep.call(&Writer::new(OP_UCX_HELLO).finish(), &mut reply)
        .unwrap();
    let mut r = Reader::new(&reply);
    assert_ne!(r.u8().unwrap(), OK);
    let why = r.str().unwrap();
    assert!(why.contains("refused on a TLS connection"), "{why}");
    assert!(why.contains("unencrypted"), "{why}");
}

#[test]
fn the_process_secret_authenticates_over_tls() {
    // `connect_secured` with the process secret against an agent with the
    // same one: the ordinary case, at the lowest level.
    auth::process_secret().unwrap();
    let agent = Agent::start("127.0.0.1:0").unwrap();
    let stream = connect_secured(agent.address(), TIMEOUT, true).unwrap();
    assert!(stream.is_tls());
}
