//! Optional TLS on agent connections (cargo feature `tls`).
//!
//! A client asks for TLS with [`TLS_ENV`]`=1` (read at each connect) or by
//! using [`crate::transport::tcp::TlsTransport`]. An agent serves plain and
//! TLS clients on the same port: it peeks at the first byte of a connection,
//! which is [`CLIENT_HELLO_FIRST_BYTE`] (a TLS handshake record) for a TLS
//! client and `R` (of [`crate::auth::MAGIC`]) for a plain one.
//!
//! On a TLS connection the TLS 1.3 handshake comes first; then the
//! challenge-response of [`crate::auth`] runs inside the TLS stream with both
//! tags covering the connection's exporter value, and after it the usual
//! frames follow, all inside TLS. The secret authenticates and TLS only
//! encrypts: the agent presents a self-signed certificate made when it first
//! serves a TLS client ([`ServerIdentity`]; no files, no CA), and the client
//! accepts any certificate but still checks that the handshake was signed
//! with the key of the certificate presented. The module docs of
//! [`crate::auth`] explain why the binding makes this safe against a man in
//! the middle.
//!
//! TLS 1.3 only, with the `ring` provider of `rustls`. The UCX transport
//! moves payloads outside the control stream, so it is refused on a TLS
//! connection (a client asking for both fails, naming both variables).
//!
//! [`Stream`] is what the agent's connection loop and
//! [`crate::transport::tcp::TcpEndpoint`] read and write: a plain
//! `TcpStream`, or a TLS stream (boxed, so the plain variant stays small and
//! its operations are one `match` away from the socket's).

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;

/// The environment variable a client sets to `1` to connect to agents over
/// TLS (`0` or unset: plain TCP). Read at each connect.
pub const TLS_ENV: &str = "RLINF_CHANNEL_TLS";

/// The values [`TLS_ENV`] accepts.
pub const TLS_CHOICES: &str = "1, 0 (also true/false, yes/no, on/off)";

/// Whether this build includes TLS (the `tls` cargo feature).
pub const TLS_COMPILED: bool = cfg!(feature = "tls");

/// The first byte of a TLS connection: the content type of a handshake
/// record, which carries the ClientHello.
pub const CLIENT_HELLO_FIRST_BYTE: u8 = 0x16;

/// Why a TLS connection cannot say the UCX hello.
pub const UCX_OVER_TLS: &str = "the UCX hello is refused on a TLS connection: UCX moves \
     payloads outside the TLS stream, so they would travel unencrypted; connect without \
     RLINF_CHANNEL_TLS to use UCX, or with RLINF_CHANNEL_TRANSPORT=tcp to keep TLS";

/// Whether `value` (a [`TLS_ENV`] value; `None` or empty: no) asks for TLS.
///
/// # Errors
/// `InvalidInput` for a value outside [`TLS_CHOICES`] (the error names the
/// variable, the value and the choices); `Unsupported` when TLS is asked for
/// and this build lacks it.
pub fn parse(value: Option<&str>) -> io::Result<bool> {
    let wanted = match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("" | "0" | "false" | "no" | "off") => false,
        Some("1" | "true" | "yes" | "on") => true,
        Some(other) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{TLS_ENV}={other:?} is not a choice; use one of {TLS_CHOICES}"),
            ));
        }
    };
    if wanted && !TLS_COMPILED {
        return Err(not_compiled());
    }
    Ok(wanted)
}

fn not_compiled() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "{TLS_ENV}=1, but this build of rlinf-channel has no TLS support (built \
             without the `tls` cargo feature): rebuild with it (the wheel includes it) \
             or unset {TLS_ENV}"
        ),
    )
}

/// [`parse`] applied to the environment.
///
/// # Errors
/// As [`parse`].
pub fn requested() -> io::Result<bool> {
    parse(std::env::var(TLS_ENV).ok().as_deref())
}

/// An agent connection: plain TCP, or TLS over TCP (client or agent side).
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// The client side of a TLS connection.
    #[cfg(feature = "tls")]
    Client(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
    /// The agent side of a TLS connection.
    #[cfg(feature = "tls")]
    Server(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Self {
        Self::Plain(s)
    }
}

/// Runs `$body` with `$s` bound to the inner stream of whichever variant.
macro_rules! each {
    ($stream:expr, $s:ident => $body:expr) => {
        match $stream {
            Stream::Plain($s) => $body,
            #[cfg(feature = "tls")]
            Stream::Client($s) => $body,
            #[cfg(feature = "tls")]
            Stream::Server($s) => $body,
        }
    };
}

impl Stream {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            #[cfg(feature = "tls")]
            Self::Client(s) => s.get_ref(),
            #[cfg(feature = "tls")]
            Self::Server(s) => s.get_ref(),
        }
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        !matches!(self, Self::Plain(_))
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        each!(self, s => s.read(buf))
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        each!(self, s => s.read_exact(buf))
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        each!(self, s => s.write(buf))
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        each!(self, s => s.write_vectored(bufs))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        each!(self, s => s.write_all(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        each!(self, s => s.flush())
    }
}

#[cfg(feature = "tls")]
pub use imp::{ServerIdentity, accept, connect};

/// Without the `tls` feature: what the agent keeps per TLS identity (nothing).
#[cfg(not(feature = "tls"))]
#[derive(Debug, Default)]
pub struct ServerIdentity(());

/// Without the `tls` feature: refuses, naming the missing feature.
///
/// # Errors
/// Always.
#[cfg(not(feature = "tls"))]
pub fn accept(
    _: TcpStream,
    _: &ServerIdentity,
    _: &crate::auth::Secret,
    _: std::time::Duration,
) -> Result<Stream, crate::auth::Refusal> {
    Err(crate::auth::Refusal::Tls(
        "a TLS client, but this agent was built without the `tls` cargo feature".into(),
    ))
}

/// Without the `tls` feature: refuses, naming the missing feature.
///
/// # Errors
/// Always (`Unsupported`).
#[cfg(not(feature = "tls"))]
pub fn connect(
    _: TcpStream,
    _: &str,
    _: &crate::auth::Secret,
    _: std::time::Duration,
) -> io::Result<Stream> {
    Err(not_compiled())
}

#[cfg(feature = "tls")]
mod imp {
    use std::io;
    use std::net::TcpStream;
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
    use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
    use rustls::{
        ClientConfig, ClientConnection, ConnectionCommon, DigitallySignedStruct, ServerConfig,
        ServerConnection, SignatureScheme, StreamOwned,
    };

    use super::Stream;
    use crate::auth::{self, BINDING_BYTES, Refusal, Secret, TLS_EXPORTER_LABEL};

    /// The name in the agent's certificate and in the client's SNI (no
    /// client checks it).
    const AGENT_NAME: &str = "rlinf-channel-agent";

    /// The `ring` provider: pure Rust and assembly, nothing else to build.
    /// rustls deprecates it for lacking post-quantum key exchange (its
    /// `aws-lc-rs` provider has it): recorded traffic is as safe as classical
    /// X25519/P-256 key exchange keeps it.
    #[allow(deprecated)]
    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// Accepts any certificate (agents' certificates are self-signed and
    /// checked by nobody: the secret authenticates, see [`crate::auth`]),
    /// but verifies the handshake signature with the presented
    /// certificate's key, as any TLS client does.
    #[derive(Debug)]
    struct AnyCertificate(Arc<CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    fn tls_error(what: &str, e: impl std::fmt::Display) -> io::Error {
        io::Error::other(format!("{what}: {e}"))
    }

    /// The process's client configuration: TLS 1.3, any certificate, no
    /// session resumption (every connection runs a full handshake).
    fn client_config() -> io::Result<Arc<ClientConfig>> {
        static CONFIG: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
        CONFIG
            .get_or_init(|| {
                let provider = provider();
                let mut config = ClientConfig::builder_with_provider(Arc::clone(&provider))
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .map_err(|e| e.to_string())?
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                    .with_no_client_auth();
                config.resumption = rustls::client::Resumption::disabled();
                Ok(Arc::new(config))
            })
            .clone()
            .map_err(|e| tls_error("cannot configure TLS", e))
    }

    /// An agent's TLS identity: a self-signed certificate and its key, made
    /// on first use (an agent that never sees a TLS client makes none).
    #[derive(Debug, Default)]
    pub struct ServerIdentity(OnceLock<Result<Arc<ServerConfig>, String>>);

    impl ServerIdentity {
        fn config(&self) -> Result<Arc<ServerConfig>, String> {
            self.0.get_or_init(make_server_config).clone()
        }
    }

    fn make_server_config() -> Result<Arc<ServerConfig>, String> {
        let cert = rcgen::generate_simple_self_signed(vec![AGENT_NAME.to_owned()])
            .map_err(|e| format!("cannot make the agent's certificate: {e}"))?;
        let key = PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der());
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key.into())
            .map_err(|e| format!("cannot use the agent's certificate: {e}"))?;
        config.send_tls13_tickets = 0;
        Ok(Arc::new(config))
    }

    /// Completes the TLS handshake of `conn` over `sock` and returns the
    /// connection's exporter value (the binding of [`crate::auth`]).
    fn handshake<D>(
        conn: &mut ConnectionCommon<D>,
        sock: &mut TcpStream,
    ) -> io::Result<[u8; BINDING_BYTES]> {
        while conn.is_handshaking() || conn.wants_write() {
            conn.complete_io(sock)?;
        }
        conn.export_keying_material([0u8; BINDING_BYTES], TLS_EXPORTER_LABEL, None)
            .map_err(|e| tls_error("TLS exporter", e))
    }

    fn set_timeouts(s: &TcpStream, t: Option<Duration>) -> io::Result<()> {
        s.set_read_timeout(t)?;
        s.set_write_timeout(t)
    }

    /// The client side: TLS handshake on `tcp`, then the challenge-response
    /// inside it, bound to the connection; all within `timeout` per read
    /// or write. `peer` names the agent in errors.
    ///
    /// # Errors
    /// `PermissionDenied` as [`auth::client_handshake`]; other kinds if TLS
    /// or the stream fails.
    pub fn connect(
        tcp: TcpStream,
        peer: &str,
        secret: &Secret,
        timeout: Duration,
    ) -> io::Result<Stream> {
        set_timeouts(&tcp, Some(timeout))?;
        let name = ServerName::try_from(AGENT_NAME).map_err(|e| tls_error("server name", e))?;
        let conn = ClientConnection::new(client_config()?, name)
            .map_err(|e| tls_error("cannot start TLS", e))?;
        let mut tls = StreamOwned::new(conn, tcp);
        let binding = handshake(&mut tls.conn, &mut tls.sock).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "TLS handshake with the channel agent at {peer} failed ({e}); an agent \
                     built without the `tls` cargo feature closes TLS connections"
                ),
            )
        })?;
        auth::client_exchange(&mut tls, peer, secret, &binding)?;
        set_timeouts(&tls.sock, None)?;
        Ok(Stream::Client(Box::new(tls)))
    }

    /// The agent side: TLS handshake on `tcp` (whose first byte was
    /// [`super::CLIENT_HELLO_FIRST_BYTE`]), then the challenge-response
    /// inside it, bound to the connection; all within `timeout` per read or
    /// write.
    ///
    /// # Errors
    /// The [`Refusal`]; the caller closes the connection.
    pub fn accept(
        tcp: TcpStream,
        identity: &ServerIdentity,
        secret: &Secret,
        timeout: Duration,
    ) -> Result<Stream, Refusal> {
        let config = identity.config().map_err(Refusal::Tls)?;
        set_timeouts(&tcp, Some(timeout))?;
        let conn = ServerConnection::new(config).map_err(|e| Refusal::Tls(e.to_string()))?;
        let mut tls = StreamOwned::new(conn, tcp);
        let binding = handshake(&mut tls.conn, &mut tls.sock).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                Refusal::Io(e)
            }
            _ => Refusal::Tls(format!("handshake failed: {e}")),
        })?;
        auth::agent_exchange(&mut tls, secret, &binding)?;
        set_timeouts(&tls.sock, None)?;
        Ok(Stream::Server(Box::new(tls)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names_the_variable_value_and_choices() {
        for off in [None, Some(""), Some("0"), Some(" off "), Some("False")] {
            assert!(!parse(off).unwrap(), "{off:?}");
        }
        let err = parse(Some("maybe")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        for part in [TLS_ENV, "\"maybe\"", TLS_CHOICES] {
            assert!(err.to_string().contains(part), "{err}");
        }
        match parse(Some(" TRUE ")) {
            Ok(on) => assert!(on && TLS_COMPILED),
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::Unsupported);
                assert!(e.to_string().contains("`tls` cargo feature"), "{e}");
            }
        }
    }
}
