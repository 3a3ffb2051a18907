//! Mutual authentication of agent connections with a shared per-run secret.
//!
//! Every connection to a channel agent starts with a challenge-response, before
//! the agent reads a single frame: both sides send a fresh random nonce and
//! prove they hold the secret with an HMAC-SHA256 over both nonces (each side
//! under its own label, so neither proof can be replayed or reflected as the
//! other). The agent answers an unauthenticated peer with nothing but its
//! challenge, and closes the connection on a wrong proof, a malformed greeting
//! or silence longer than its handshake timeout.
//!
//! The bytes, all fields of fixed length (`||` is concatenation):
//!
//! ```text
//! client -> agent  "RLINFAU1" || client_nonce[32]
//! agent -> client  "RLINFAU1" || agent_nonce[32]
//!                  || HMAC(secret, "rlinf-channel agent"  || client_nonce || agent_nonce || binding)
//! client -> agent  HMAC(secret, "rlinf-channel client" || agent_nonce || client_nonce || binding)
//! agent -> client  0 (accepted) or 1 (refused, then the agent closes)
//! ```
//!
//! `binding` is empty on a plain connection and 32 bytes of TLS exporter
//! output ([`TLS_EXPORTER_LABEL`], RFC 8446 section 7.5) on a TLS one.
//!
//! What it protects: nobody without the secret can open, reserve, put, take,
//! list or say the UCX hello on an agent, so no item from such a peer reaches
//! a consumer (and is never unpickled). What it does not: on a plain
//! connection the bytes travel in clear and are not integrity-protected after
//! the handshake, so an attacker who can rewrite packets on the path can read
//! or hijack the connection; keep such agents on a trusted cluster network.
//!
//! With TLS (the `tls` feature, [`crate::tls`]) the secret still authenticates
//! and TLS only encrypts: the client accepts any certificate (agents make a
//! self-signed one; there is no CA to check it against), so TLS alone would not
//! tell the client whom it is talking to. The binding ties the two together.
//! The challenge-response runs inside the TLS stream and both tags also cover
//! the connection's exporter value, which both TLS endpoints derive from the
//! handshake's secrets and nobody else can compute. A man in the middle who
//! terminates TLS towards the client and opens a second TLS (or plain)
//! connection to the agent holds two connections with different exporter
//! values (or none), so a proof computed for one does not verify on the other,
//! and without the secret he cannot compute a fresh one: the client refuses
//! the agent's proof and the agent never accepts his. An authenticated TLS
//! connection therefore ends at a holder of the secret, and its bytes are
//! confidential and integrity-protected from there on.
//!
//! The secret of a process: [`set_process_secret`], else the environment
//! variable [`SECRET_ENV`], else one generated at random on first use (enough
//! for agents and clients of one process; other processes then cannot connect,
//! and say so). The primitives come from the `hmac` and `sha2` crates
//! (constant-time comparison included) and nonces from `getrandom`.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The environment variable holding the run's channel secret (any string of at
/// least [`MIN_SECRET_BYTES`] bytes; the scheduler sets a random one for its
/// workers).
pub const SECRET_ENV: &str = "RLINF_CHANNEL_SECRET";

/// Shortest secret accepted.
pub const MIN_SECRET_BYTES: usize = 16;

/// How long an agent waits for a peer to complete the handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The label of the TLS exporter value a TLS connection's tags cover.
pub const TLS_EXPORTER_LABEL: &[u8] = b"EXPORTER-rlinf-channel-auth";

/// Bytes of TLS exporter output the tags of a TLS connection cover.
pub const BINDING_BYTES: usize = 32;

/// The first bytes a client sends on a plain connection.
pub const MAGIC: &[u8; 8] = b"RLINFAU1";
const NONCE_BYTES: usize = 32;
const TAG_BYTES: usize = 32;
const AGENT_LABEL: &[u8] = b"rlinf-channel agent";
const CLIENT_LABEL: &[u8] = b"rlinf-channel client";
const ACCEPTED: u8 = 0;
const REFUSED: u8 = 1;

type HmacSha256 = Hmac<Sha256>;

/// A shared secret. Its `Debug` output never shows the bytes.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

impl Secret {
    /// Wraps secret bytes.
    ///
    /// # Errors
    /// If `bytes` is shorter than [`MIN_SECRET_BYTES`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> io::Result<Self> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a channel secret must have at least {MIN_SECRET_BYTES} bytes (got {}); \
                     generate one with e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`",
                    bytes.len()
                ),
            ));
        }
        Ok(Self(bytes))
    }

    /// A random secret: 32 random bytes, written as 64 hex characters.
    ///
    /// # Errors
    /// If the operating system's random source fails.
    pub fn generate() -> io::Result<Self> {
        let mut raw = [0u8; 32];
        fill_random(&mut raw)?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Self::new(hex.into_bytes())
    }

    /// HMAC(secret, label || first || second || binding); `binding` is empty
    /// on a plain connection (the tag is then the same as without it).
    fn tag(&self, label: &[u8], first: &[u8], second: &[u8], binding: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(first);
        mac.update(second);
        mac.update(binding);
        mac
    }
}

static PROCESS_SECRET: Mutex<Option<Arc<Secret>>> = Mutex::new(None);

/// Sets the secret this process's agents and clients use.
pub fn set_process_secret(secret: Secret) {
    *PROCESS_SECRET
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(secret));
}

/// The secret of this process (see the module docs for where it comes from).
///
/// # Errors
/// If [`SECRET_ENV`] is set but too short, or the random source fails.
pub fn process_secret() -> io::Result<Arc<Secret>> {
    let mut slot = PROCESS_SECRET
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(secret) = slot.as_ref() {
        return Ok(Arc::clone(secret));
    }
    let secret = match std::env::var_os(SECRET_ENV) {
        Some(value) => Secret::new(value.into_encoded_bytes()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{SECRET_ENV} is not a usable secret: {e}"),
            )
        })?,
        None => Secret::generate()?,
    };
    let secret = Arc::new(secret);
    *slot = Some(Arc::clone(&secret));
    Ok(secret)
}

fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    getrandom::fill(buf).map_err(|e| io::Error::other(format!("no random source: {e}")))
}

fn auth_error(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, message)
}

/// Runs the client side of the handshake on a freshly connected plain stream.
///
/// # Errors
/// `PermissionDenied` if the agent does not prove it holds `secret` or
/// refuses this side's proof; other kinds if the stream fails.
pub fn client_handshake(stream: &mut TcpStream, secret: &Secret) -> io::Result<()> {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    client_exchange(stream, &peer, secret, &[])
}

/// The client side of the handshake on any stream (a plain one, or the
/// plaintext side of a TLS one), with the tags covering `binding` (empty on
/// a plain connection, the TLS exporter value on a TLS one). `peer` names
/// the agent in errors.
///
/// # Errors
/// As [`client_handshake`].
pub fn client_exchange(
    stream: &mut (impl Read + Write),
    peer: &str,
    secret: &Secret,
    binding: &[u8],
) -> io::Result<()> {
    let mut client_nonce = [0u8; NONCE_BYTES];
    fill_random(&mut client_nonce)?;
    let mut hello = Vec::with_capacity(MAGIC.len() + NONCE_BYTES);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&client_nonce);
    stream.write_all(&hello)?;

    let mut challenge = [0u8; 8 + NONCE_BYTES + TAG_BYTES];
    stream.read_exact(&mut challenge).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("the channel agent at {peer} sent no authentication challenge ({e}); is it an RLinf agent of the same version?"),
        )
    })?;
    let (magic, rest) = challenge.split_at(8);
    let (agent_nonce, agent_tag) = rest.split_at(NONCE_BYTES);
    if magic != MAGIC {
        return Err(auth_error(format!(
            "the peer at {peer} does not speak the RLinf channel protocol"
        )));
    }
    secret
        .tag(AGENT_LABEL, &client_nonce, agent_nonce, binding)
        .verify_slice(agent_tag)
        .map_err(|_| {
            let tls = if binding.is_empty() {
                ""
            } else {
                " or the TLS connection does not end at the agent (an interceptor in between)"
            };
            auth_error(format!(
                "channel authentication failed: the agent at {peer} does not hold this \
                 process's channel secret ({SECRET_ENV}){tls}; processes of one run must share \
                 it (the Cluster sets it for its workers)"
            ))
        })?;
    let proof = secret
        .tag(CLIENT_LABEL, agent_nonce, &client_nonce, binding)
        .finalize()
        .into_bytes();
    stream.write_all(&proof)?;
    stream.flush()?;
    let mut verdict = [REFUSED];
    stream.read_exact(&mut verdict)?;
    if verdict[0] != ACCEPTED {
        return Err(auth_error(format!(
            "channel authentication failed: the agent at {peer} refused this process's channel secret"
        )));
    }
    Ok(())
}

/// Why an agent refused a connection.
#[derive(Debug)]
pub enum Refusal {
    /// The peer sent something other than the protocol's greeting.
    NotAGreeting,
    /// The peer's proof did not verify: it does not hold the secret.
    WrongSecret,
    /// The stream failed or the peer stayed silent past the timeout.
    Io(io::Error),
    /// A TLS client the agent could not serve: the TLS handshake failed, or
    /// the agent was built without the `tls` feature.
    Tls(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAGreeting => write!(f, "not an RLinf channel greeting"),
            Self::WrongSecret => write!(f, "wrong channel secret"),
            Self::Io(e) => write!(f, "handshake not completed: {e}"),
            Self::Tls(why) => write!(f, "TLS: {why}"),
        }
    }
}

impl From<io::Error> for Refusal {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Runs the agent side of the handshake on a plain stream: the peer must
/// complete it within `timeout`. The stream's timeouts are cleared again on
/// success.
///
/// # Errors
/// The [`Refusal`]; the caller closes the connection.
pub fn agent_handshake(
    stream: &mut TcpStream,
    secret: &Secret,
    timeout: Duration,
) -> Result<(), Refusal> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    agent_exchange(stream, secret, &[])?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(())
}

/// The agent side of the handshake on any stream, with the tags covering
/// `binding` (see [`client_exchange`]). The caller bounds the time it takes.
///
/// # Errors
/// The [`Refusal`]; the caller closes the connection.
pub fn agent_exchange(
    stream: &mut (impl Read + Write),
    secret: &Secret,
    binding: &[u8],
) -> Result<(), Refusal> {
    let mut hello = [0u8; 8 + NONCE_BYTES];
    stream.read_exact(&mut hello)?;
    let (magic, client_nonce) = hello.split_at(8);
    if magic != MAGIC {
        return Err(Refusal::NotAGreeting);
    }
    let mut agent_nonce = [0u8; NONCE_BYTES];
    fill_random(&mut agent_nonce)?;
    let tag = secret
        .tag(AGENT_LABEL, client_nonce, &agent_nonce, binding)
        .finalize()
        .into_bytes();
    let mut challenge = Vec::with_capacity(8 + NONCE_BYTES + TAG_BYTES);
    challenge.extend_from_slice(MAGIC);
    challenge.extend_from_slice(&agent_nonce);
    challenge.extend_from_slice(&tag);
    stream.write_all(&challenge)?;
    stream.flush()?;
    let mut proof = [0u8; TAG_BYTES];
    stream.read_exact(&mut proof)?;
    if secret
        .tag(CLIENT_LABEL, &agent_nonce, client_nonce, binding)
        .verify_slice(&proof)
        .is_err()
    {
        let _ = stream.write_all(&[REFUSED]).and_then(|()| stream.flush());
        return Err(Refusal::WrongSecret);
    }
    stream.write_all(&[ACCEPTED])?;
    stream.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(agent: Secret, client: Secret) -> (io::Result<()>, Result<(), Refusal>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            agent_handshake(&mut s, &agent, Duration::from_secs(5))
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let client_result = client_handshake(&mut c, &client);
        (client_result, server.join().unwrap())
    }

    #[test]
    fn same_secret_authenticates_both_sides() {
        let s = Secret::new(*b"0123456789abcdef").unwrap();
        let (c, a) = pair(s.clone(), s);
        assert!(c.is_ok(), "{c:?}");
        assert!(a.is_ok(), "{a:?}");
    }

    #[test]
    fn a_different_secret_is_refused_on_both_sides() {
        let (c, a) = pair(
            Secret::new(*b"0123456789abcdef").unwrap(),
            Secret::new(*b"0123456789abcdeX").unwrap(),
        );
        let err = c.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains(SECRET_ENV), "{err}");
        // The client stops at the agent's proof, so the agent sees the stream end.
        assert!(matches!(a, Err(Refusal::Io(_))), "{a:?}");
    }

    #[test]
    fn the_binding_changes_both_tags_and_empty_leaves_them_as_plain() {
        let s = Secret::new(*b"0123456789abcdef").unwrap();
        let (a, b) = ([1u8; NONCE_BYTES], [2u8; NONCE_BYTES]);
        let tag = |label, binding: &[u8]| s.tag(label, &a, &b, binding).finalize().into_bytes();
        for label in [AGENT_LABEL, CLIENT_LABEL] {
            let plain = tag(label, &[]);
            let mut direct = HmacSha256::new_from_slice(b"0123456789abcdef").unwrap();
            direct.update(label);
            direct.update(&a);
            direct.update(&b);
            assert_eq!(
                plain,
                direct.finalize().into_bytes(),
                "plain tags are unchanged"
            );
            let one = tag(label, &[7u8; BINDING_BYTES]);
            let other = tag(label, &[8u8; BINDING_BYTES]);
            assert_ne!(plain, one);
            assert_ne!(one, other, "different exporter values give different tags");
        }
    }

    /// Both ends hold the secret but see different bindings (two TLS
    /// connections spliced by a relay): neither accepts the other.
    #[test]
    fn mismatched_bindings_fail_the_handshake() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let secret = Secret::new(*b"0123456789abcdef").unwrap();
        let agent_secret = secret.clone();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            agent_exchange(&mut s, &agent_secret, &[1u8; BINDING_BYTES])
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let err = client_exchange(&mut c, "relay", &secret, &[2u8; BINDING_BYTES]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("interceptor"), "{err}");
        drop(c);
        assert!(matches!(server.join().unwrap(), Err(Refusal::Io(_))));
    }

    #[test]
    fn short_secrets_are_refused_and_debug_hides_the_bytes() {
        let err = Secret::new(*b"short").unwrap_err();
        assert!(err.to_string().contains("at least 16"), "{err}");
        let s = Secret::generate().unwrap();
        assert_eq!(s.0.len(), 64);
        assert_eq!(format!("{s:?}"), "Secret(64 bytes)");
    }

    #[test]
    fn silence_and_garbage_are_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut results = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = listener.accept().unwrap();
                let secret = Secret::new(*b"0123456789abcdef").unwrap();
                results.push(agent_handshake(&mut s, &secret, Duration::from_millis(200)));
            }
            results
        });
        let _silent = TcpStream::connect(addr).unwrap();
        let mut garbage = TcpStream::connect(addr).unwrap();
        garbage.write_all(&[0xAB; 40]).unwrap();
        let results = server.join().unwrap();
        assert!(
            matches!(results[0], Err(Refusal::Io(_))),
            "{:?}",
            results[0]
        );
        assert!(
            matches!(results[1], Err(Refusal::NotAGreeting)),
            "{:?}",
            results[1]
        );
    }
}
