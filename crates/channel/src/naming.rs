//! Names of the POSIX shared-memory segments that back channels.
//!
//! Every segment RLinf creates lives in `/dev/shm` under a name built here,
//! `rlinf.<namespace>.<channel>`, so that a janitor can find and remove
//! everything of one run (namespace) and nothing else. Names come from users
//! (channel names) and from the environment (run namespaces), so they are
//! validated, not trusted.

use std::fmt;

/// Prefix of every shared-memory segment RLinf creates.
pub const SEGMENT_PREFIX: &str = "rlinf.";

/// Longest segment name accepted, without the leading `/`.
///
/// Linux allows `NAME_MAX` (255) bytes for a file in `/dev/shm`; we keep
/// a margin for suffixes (`.lock`) that later layers append.
pub const MAX_SEGMENT_NAME_LEN: usize = 240;

/// Why a namespace or channel name was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    /// The name is empty.
    Empty {
        /// Which part was empty (`"namespace"` or `"channel"`).
        what: &'static str,
    },
    /// The name holds a byte outside `[A-Za-z0-9_-]` (plus `.` in channels).
    InvalidChar {
        /// Which part held it.
        what: &'static str,
        /// The offending character.
        ch: char,
        /// Its byte offset in the part.
        offset: usize,
    },
    /// The full segment name would exceed [`MAX_SEGMENT_NAME_LEN`].
    TooLong {
        /// Length the segment name would have.
        len: usize,
    },
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::Empty { what } => write!(f, "{what} name is empty; give a non-empty name"),
            NameError::InvalidChar { what, ch, offset } => write!(
                f,
                "{what} name has invalid character {ch:?} at offset {offset}; \
                 use only letters, digits, '_', '-' (and '.' in channel names)"
            ),
            NameError::TooLong { len } => write!(
                f,
                "segment name would be {len} bytes, over the limit of {MAX_SEGMENT_NAME_LEN}; \
                 use a shorter namespace or channel name"
            ),
        }
    }
}

impl std::error::Error for NameError {}

fn check_part(what: &'static str, part: &str, allow_dot: bool) -> Result<(), NameError> {
    if part.is_empty() {
        return Err(NameError::Empty { what });
    }
    for (offset, ch) in part.char_indices() {
        let ok = ch.is_ascii_alphanumeric() || ch == '_' || ch == '-' || (allow_dot && ch == '.');
        if !ok {
            return Err(NameError::InvalidChar { what, ch, offset });
        }
    }
    Ok(())
}

/// Builds the shared-memory segment name for `channel` in run `namespace`.
///
/// The result has no leading `/` (add it for `shm_open`). The namespace may
/// not contain `.`, so the first `.` after the prefix always ends it and a
/// janitor can match `rlinf.<namespace>.*` exactly.
///
/// # Errors
/// [`NameError`] when a part is empty, holds a character outside the allowed
/// set, or the whole name would be too long.
pub fn segment_name(namespace: &str, channel: &str) -> Result<String, NameError> {
    check_part("namespace", namespace, false)?;
    check_part("channel", channel, true)?;
    let len = SEGMENT_PREFIX.len() + namespace.len() + 1 + channel.len();
    if len > MAX_SEGMENT_NAME_LEN {
        return Err(NameError::TooLong { len });
    }
    Ok(format!("{SEGMENT_PREFIX}{namespace}.{channel}"))
}

/// Splits a segment name built by [`segment_name`] back into its parts.
///
/// Returns `None` for names RLinf did not build, so a janitor scanning
/// `/dev/shm` leaves foreign entries alone.
pub fn parse_segment_name(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix(SEGMENT_PREFIX)?;
    let (namespace, channel) = rest.split_once('.')?;
    check_part("namespace", namespace, false).ok()?;
    check_part("channel", channel, true).ok()?;
    Some((namespace, channel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn builds_expected_name() {
        assert_eq!(
            segment_name("run42", "rollout.obs").unwrap(),
            "rlinf.run42.rollout.obs"
        );
    }

    #[test]
    fn rejects_bad_parts() {
        assert_eq!(
            segment_name("", "a"),
            Err(NameError::Empty { what: "namespace" })
        );
        assert_eq!(
            segment_name("ns", ""),
            Err(NameError::Empty { what: "channel" })
        );
        assert_eq!(
            segment_name("ns", "a/b"),
            Err(NameError::InvalidChar {
                what: "channel",
                ch: '/',
                offset: 1
            })
        );
        assert_eq!(
            segment_name("n.s", "a"),
            Err(NameError::InvalidChar {
                what: "namespace",
                ch: '.',
                offset: 1
            })
        );
        let long = "x".repeat(300);
        assert!(matches!(
            segment_name("ns", &long),
            Err(NameError::TooLong { len: 309 })
        ));
    }

    #[test]
    fn foreign_names_are_not_parsed() {
        assert_eq!(parse_segment_name("other.ns.ch"), None);
        assert_eq!(parse_segment_name("rlinf.nodot"), None);
        assert_eq!(parse_segment_name("rlinf.ns.bad/ch"), None);
    }

    proptest! {
        #[test]
        fn roundtrip(ns in "[A-Za-z0-9_-]{1,40}", ch in "[A-Za-z0-9_.-]{1,80}") {
            let name = segment_name(&ns, &ch).unwrap();
            prop_assert_eq!(parse_segment_name(&name), Some((ns.as_str(), ch.as_str())));
        }

        #[test]
        fn never_panics_and_output_is_safe(ns in ".{0,60}", ch in ".{0,200}") {
            if let Ok(name) = segment_name(&ns, &ch) {
                prop_assert!(name.len() <= MAX_SEGMENT_NAME_LEN);
                prop_assert!(!name.contains('/'));
                prop_assert!(name.bytes().all(|b| b.is_ascii_graphic()));
            }
        }
    }
}
