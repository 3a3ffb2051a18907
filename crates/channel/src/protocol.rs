//! Operation codes and error codes of the agent protocol (control messages).

use crate::channel::ChannelError;

/// Open (or create) a channel: ns, name, create flag, options.
pub const OP_OPEN: u8 = 1;
/// Lane for a key.
pub const OP_LANE: u8 = 2;
/// Reserve room for a put; reply carries the token of the block.
pub const OP_RESERVE: u8 = 3;
/// Publish a reserved, written block.
pub const OP_PUBLISH: u8 = 4;
/// Take one item (target 0) or a weighted batch; reply lists (token, len).
pub const OP_TAKE: u8 = 5;
/// Release a taken block (no reply).
pub const OP_RELEASE: u8 = 6;
/// Items in a lane.
pub const OP_QSIZE: u8 = 7;
/// Close the channel.
pub const OP_CLOSE: u8 = 8;
/// Whether the channel is closed.
pub const OP_CLOSED: u8 = 9;
/// Reclaim blocks of dead processes.
pub const OP_RECLAIM: u8 = 10;
/// Wait until a lane is readable.
pub const OP_WAIT_READABLE: u8 = 11;
/// Arena counters.
pub const OP_STATS: u8 = 12;
/// UCX hello: the reply carries the agent's UCX worker address, and from then
/// on the session's open replies end with the channel's packed UCX key and
/// its reserve and take replies with the home-node address of each block
/// (see `transport::ucx`). Agents built without the `ucx` feature refuse it.
pub const OP_UCX_HELLO: u8 = 13;

/// Reply status: success.
pub const OK: u8 = 0;

/// Wire code of an error.
pub fn error_code(e: &ChannelError) -> u8 {
    match e {
        ChannelError::Closed => 1,
        ChannelError::Full => 2,
        ChannelError::Empty => 3,
        ChannelError::Timeout => 4,
        ChannelError::Exists(_) => 5,
        ChannelError::NotFound(_) => 6,
        ChannelError::Name(_) | ChannelError::Invalid(_) => 7,
        ChannelError::Corrupt(_) => 8,
        ChannelError::Io(_) => 9,
    }
}

/// Rebuilds an error from its wire code and message.
pub fn error_from_code(code: u8, message: &str) -> ChannelError {
    match code {
        1 => ChannelError::Closed,
        2 => ChannelError::Full,
        3 => ChannelError::Empty,
        4 => ChannelError::Timeout,
        5 => ChannelError::Exists(message.to_owned()),
        6 => ChannelError::NotFound(message.to_owned()),
        7 => ChannelError::Invalid(message.to_owned()),
        8 => ChannelError::Corrupt(message.to_owned()),
        _ => ChannelError::Io(std::io::Error::other(message.to_owned())),
    }
}

/// Encodes an optional timeout in milliseconds (-1 = none).
pub fn timeout_ms(t: Option<std::time::Duration>) -> i64 {
    t.map_or(-1, |d| d.as_millis().min(i64::MAX as u128) as i64)
}

/// Decodes [`timeout_ms`].
pub fn timeout_from_ms(ms: i64) -> Option<std::time::Duration> {
    (ms >= 0).then(|| std::time::Duration::from_millis(ms as u64))
}
