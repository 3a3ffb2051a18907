//! The byte format of what a channel stores: message blocks and lane keys.
//!
//! **Messages.** One item is one message: a *header* (opaque bytes; from
//! Python, the pickle protocol-5 stream made by
//! `rlinf.core.channel.serialization.dumps`) plus zero or more out-of-band
//! *buffers* (the raw bytes of numpy arrays and tensors). A message occupies
//! one arena block, laid out as follows (integers little-endian):
//!
//! ```text
//! offset 0    u32  magic b"RLMS"
//! offset 4    u32  n: number of buffers
//! offset 8    u64  header length
//! offset 16   n x (u64 offset, u64 length): each buffer, relative to the block start
//!             zero padding to a multiple of 64
//!             the header bytes
//!             per buffer: zero padding to a multiple of 64, then its bytes
//! ```
//!
//! so every buffer starts 64-byte aligned and can be viewed in place. The
//! image is [`message_size`] bytes long (at least one). [`message_pieces`]
//! lists it as pieces to copy (how a remote put sends it over a transport
//! without assembling it), `write_message` copies it into a block, and
//! [`parse_message`] reads it back with every offset and length
//! bounds-checked, since the bytes come from shared memory or the network.
//! The same image travels between nodes; the agent's control messages
//! around it are encoded by [`crate::wire`].
//!
//! **Keys.** A lane key is the bytes Python's `Channel` encodes a key to (a
//! type tag then the value: `s` + UTF-8 for `str`, `i` + decimal for `int`,
//! `b` + bytes for `bytes`, `p` + pickle otherwise), at most
//! [`KEY_MAX`] bytes. It is stored in the lane's key field as little-endian
//! 64-bit words ([`key_words`], [`key_from_words`]) and found by its
//! FNV-1a hash ([`key_hash`]) and then its bytes.

use crate::channel::{ChannelError, Result};
use crate::layout::KEY_MAX;

/// Message block magic.
const MSG_MAGIC: u32 = u32::from_le_bytes(*b"RLMS");
/// Alignment of out-of-band buffers inside a block.
const BUF_ALIGN: u64 = 64;

/// Where a message lives inside its block: the header and each buffer as
/// `(offset, len)` relative to the block start, all validated against the block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageLayout {
    /// The serialised header (for Python: the pickle stream).
    pub header: (usize, usize),
    /// The out-of-band buffers, each 64-byte aligned.
    pub buffers: Vec<(usize, usize)>,
}

/// Total block bytes a message with this header and these buffers needs.
pub fn message_size(header_len: usize, buffer_lens: &[usize]) -> u64 {
    let table = 16 + 16 * buffer_lens.len() as u64;
    let mut off = table.div_ceil(BUF_ALIGN) * BUF_ALIGN + header_len as u64;
    for &len in buffer_lens {
        off = off.div_ceil(BUF_ALIGN) * BUF_ALIGN + len as u64;
    }
    off.max(1)
}

/// One piece of a message block image: bytes to copy, or zero padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Bytes copied as they are.
    Bytes(&'a [u8]),
    /// This many zero bytes (alignment padding).
    Zeros(usize),
}

/// The block image of a message, in order: a 16-byte prefix and the buffer
/// table (in `table`, which the caller provides so no allocation escapes),
/// the header, then each buffer at a 64-byte aligned offset.
/// The pieces add up to exactly [`message_size`] bytes.
pub fn message_pieces<'a>(
    header: &'a [u8],
    buffers: &[&'a [u8]],
    table: &'a mut Vec<u8>,
) -> Vec<Piece<'a>> {
    table.clear();
    table.extend_from_slice(&MSG_MAGIC.to_le_bytes());
    table.extend_from_slice(&(buffers.len() as u32).to_le_bytes());
    table.extend_from_slice(&(header.len() as u64).to_le_bytes());
    let align = |x: usize| x.div_ceil(BUF_ALIGN as usize) * BUF_ALIGN as usize;
    let table_len = 16 + 16 * buffers.len();
    let mut off = align(table_len) + header.len();
    for buf in buffers {
        off = align(off);
        table.extend_from_slice(&(off as u64).to_le_bytes());
        table.extend_from_slice(&(buf.len() as u64).to_le_bytes());
        off += buf.len();
    }
    let mut pieces = vec![
        Piece::Bytes(table.as_slice()),
        Piece::Zeros(align(table_len) - table_len),
    ];
    pieces.push(Piece::Bytes(header));
    let mut off = align(table_len) + header.len();
    for buf in buffers {
        let pad = align(off) - off;
        if pad > 0 {
            pieces.push(Piece::Zeros(pad));
        }
        pieces.push(Piece::Bytes(buf));
        off = align(off) + buf.len();
    }
    if off == 0 {
        pieces.push(Piece::Zeros(1));
    }
    pieces
}

/// Writes a message into `dst` (which must be `message_size` bytes long).
pub(crate) fn write_message(dst: &mut [u8], header: &[u8], buffers: &[&[u8]]) {
    let mut table = Vec::new();
    let mut at = 0;
    for piece in message_pieces(header, buffers, &mut table) {
        match piece {
            Piece::Bytes(b) => {
                dst[at..at + b.len()].copy_from_slice(b);
                at += b.len();
            }
            Piece::Zeros(n) => {
                dst[at..at + n].fill(0);
                at += n;
            }
        }
    }
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parses and bounds-checks a message block (its bytes are untrusted).
pub fn parse_message(block: &[u8]) -> Result<MessageLayout> {
    let bad = |what: &str| ChannelError::Corrupt(format!("message block: {what}"));
    if read_u32(block, 0) != Some(MSG_MAGIC) {
        return Err(bad("bad magic"));
    }
    let n = read_u32(block, 4).ok_or_else(|| bad("truncated"))? as usize;
    let header_len = read_u64(block, 8).ok_or_else(|| bad("truncated"))?;
    let table = 16usize
        .checked_add(n.checked_mul(16).ok_or_else(|| bad("buffer count"))?)
        .ok_or_else(|| bad("buffer count"))?;
    if table > block.len() {
        return Err(bad("buffer table past the block end"));
    }
    let header_off = table.div_ceil(BUF_ALIGN as usize) * BUF_ALIGN as usize;
    let header_len = usize::try_from(header_len).map_err(|_| bad("header length"))?;
    if header_off
        .checked_add(header_len)
        .is_none_or(|end| end > block.len())
    {
        return Err(bad("header past the block end"));
    }
    let mut buffers = Vec::with_capacity(n);
    for i in 0..n {
        let off = read_u64(block, 16 + 16 * i).ok_or_else(|| bad("truncated"))?;
        let len = read_u64(block, 24 + 16 * i).ok_or_else(|| bad("truncated"))?;
        let (off, len) = (
            usize::try_from(off).map_err(|_| bad("offset"))?,
            usize::try_from(len).map_err(|_| bad("length"))?,
        );
        if off.checked_add(len).is_none_or(|end| end > block.len()) {
            return Err(bad("buffer past the block end"));
        }
        buffers.push((off, len));
    }
    Ok(MessageLayout {
        header: (header_off, header_len),
        buffers,
    })
}

/// FNV-1a, a stable hash for lane keys (Python's `hash` differs per process).
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A key (at most [`KEY_MAX`] bytes) as the words of a lane's key field,
/// zero padded.
pub(crate) fn key_words(key: &[u8]) -> [u64; KEY_MAX / 8] {
    let mut padded = [0u8; KEY_MAX];
    let n = key.len().min(KEY_MAX);
    padded[..n].copy_from_slice(&key[..n]);
    let mut words = [0u64; KEY_MAX / 8];
    for (w, chunk) in words.iter_mut().zip(padded.chunks_exact(8)) {
        *w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
    }
    words
}

/// The first `len` bytes (at most [`KEY_MAX`]) of a key stored as `words`.
pub(crate) fn key_from_words(words: impl IntoIterator<Item = u64>, len: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = words.into_iter().flat_map(u64::to_le_bytes).collect();
    bytes.truncate(len.min(KEY_MAX));
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_matches_the_documented_layout() {
        let header = b"hdr";
        let (a, b) = (vec![1u8; 3], vec![2u8; 70]);
        let size = message_size(header.len(), &[a.len(), b.len()]) as usize;
        let mut block = vec![0xEEu8; size];
        write_message(&mut block, header, &[&a, &b]);
        assert_eq!(&block[0..4], b"RLMS");
        assert_eq!(u32::from_le_bytes(block[4..8].try_into().unwrap()), 2);
        assert_eq!(u64::from_le_bytes(block[8..16].try_into().unwrap()), 3);
        let m = parse_message(&block).unwrap();
        // Table of 16 + 2*16 = 48 bytes, padded to 64; header at 64..67;
        // buffers at the next multiples of 64.
        assert_eq!(m.header, (64, 3));
        assert_eq!(m.buffers, vec![(128, 3), (192, 70)]);
        assert_eq!(size, 192 + 70);
        assert_eq!(&block[64..67], header);
        assert!(block[48..64].iter().all(|&x| x == 0), "padding is zeroed");
        assert_eq!(&block[192..262], &b[..]);
    }

    #[test]
    fn empty_message_is_one_byte_at_least() {
        assert!(message_size(0, &[]) >= 1);
        let mut table = Vec::new();
        let total: usize = message_pieces(b"", &[], &mut table)
            .iter()
            .map(|p| match p {
                Piece::Bytes(b) => b.len(),
                Piece::Zeros(n) => *n,
            })
            .sum();
        assert_eq!(total as u64, message_size(0, &[]));
    }

    #[test]
    fn keys_roundtrip_through_words() {
        for key in [&b""[..], b"sdefault_queue", &[7u8; KEY_MAX]] {
            assert_eq!(key_from_words(key_words(key), key.len()), key);
        }
        assert_ne!(key_hash(b"sa"), key_hash(b"sb"));
    }
}
