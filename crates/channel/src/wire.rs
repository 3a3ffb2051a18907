//! Control-message encoding for the node transports: little-endian fields in
//! length-prefixed frames. Frames come from the network, so every read is
//! bounds-checked and every length is capped.

use std::io::{self, Read, Write};

/// Largest control frame accepted (payloads travel outside control frames).
pub const MAX_FRAME: u32 = 1 << 20;

/// Builds one control message.
#[derive(Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// Starts a message with operation code `op`.
    pub fn new(op: u8) -> Self {
        Self { buf: vec![op] }
    }

    /// Appends a u8.
    pub fn u8(mut self, v: u8) -> Self {
        self.buf.push(v);
        self
    }

    /// Appends a u32.
    pub fn u32(mut self, v: u32) -> Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a u64.
    pub fn u64(mut self, v: u64) -> Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends an i64.
    pub fn i64(mut self, v: i64) -> Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends length-prefixed bytes.
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(v);
        self
    }

    /// The encoded message.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads fields of one control message, failing cleanly on truncation.
pub struct Reader<'a> {
    buf: &'a [u8],
}

fn truncated() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "truncated control message")
}

impl<'a> Reader<'a> {
    /// Wraps a received message.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(truncated());
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// Reads a u8.
    pub fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// Reads a u32.
    pub fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| truncated())?,
        ))
    }

    /// Reads a u64.
    pub fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| truncated())?,
        ))
    }

    /// Reads an i64.
    pub fn i64(&mut self) -> io::Result<i64> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| truncated())?,
        ))
    }

    /// Reads length-prefixed bytes.
    pub fn bytes(&mut self) -> io::Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// Reads length-prefixed UTF-8.
    pub fn str(&mut self) -> io::Result<&'a str> {
        std::str::from_utf8(self.bytes()?)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad utf-8"))
    }
}

/// Writes one frame: a u32 length, then the bytes.
pub fn write_frame(w: &mut impl Write, msg: &[u8]) -> io::Result<()> {
    let len = u32::try_from(msg.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(msg)
}

/// Reads one frame into `buf` (replacing its contents).
pub fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("control frame of {len} bytes is too large"),
        ));
    }
    // Grow with the bytes that arrive, not with what the prefix claims: a
    // peer's 4 bytes must not make this side allocate a whole frame.
    buf.clear();
    r.take(u64::from(len)).read_to_end(buf)?;
    if buf.len() < len as usize {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("control frame cut short at {} of {len} bytes", buf.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_truncation() {
        let msg = Writer::new(7)
            .u8(1)
            .u32(2)
            .u64(3)
            .i64(-4)
            .bytes(b"key")
            .finish();
        let mut r = Reader::new(&msg);
        assert_eq!(r.u8().unwrap(), 7);
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.u32().unwrap(), 2);
        assert_eq!(r.u64().unwrap(), 3);
        assert_eq!(r.i64().unwrap(), -4);
        assert_eq!(r.bytes().unwrap(), b"key");
        assert!(r.u8().is_err());
        let mut bad = Reader::new(&[255, 255, 255, 255]);
        assert!(
            bad.bytes().is_err(),
            "a huge length prefix must not be trusted"
        );
    }

    #[test]
    fn frames_are_capped() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"hello").unwrap();
        let mut buf = Vec::new();
        read_frame(&mut wire.as_slice(), &mut buf).unwrap();
        assert_eq!(buf, b"hello");
        let huge = (MAX_FRAME + 1).to_le_bytes();
        assert!(read_frame(&mut huge.as_slice(), &mut buf).is_err());
    }

    #[test]
    fn a_length_prefix_alone_allocates_nothing() {
        // Found while writing tests/agent_fuzz.rs: 4 bytes claiming MAX_FRAME
        // made the reader allocate (and zero) the whole frame up front.
        let mut buf = Vec::new();
        let prefix = MAX_FRAME.to_le_bytes();
        let err = read_frame(&mut prefix.as_slice(), &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(buf.capacity() < 4096, "{} bytes allocated", buf.capacity());
        let mut wire = Vec::new();
        write_frame(&mut wire, &[9u8; 100_000]).unwrap();
        read_frame(&mut wire.as_slice(), &mut buf).unwrap();
        assert_eq!(buf, [9u8; 100_000]);
    }
}
