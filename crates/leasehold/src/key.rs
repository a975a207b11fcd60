//! Lock keys and list prefixes, validated once before any I/O.

use std::fmt;

use crate::error::{Error, Result};

/// Longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 256;

/// A validated lock key: 1 to 256 bytes of UTF-8 with no NUL or other control
/// characters.
///
/// Backends receive only `Key`s, so they never see bad input. Every other
/// character is allowed and stored verbatim: keys such as `'; DROP TABLE x; --`,
/// `$ne`, `a.b` or `{x}` are plain strings to every store.
///
/// ```
/// use leasehold::Key;
/// assert!(Key::new("orders:42").is_ok());
/// assert!(Key::new("").is_err());
/// assert!(Key::new("tab\there").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// Validates `key`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the problem: empty, longer than 256
    /// bytes, or containing a control character (with its position).
    pub fn new(key: impl Into<String>) -> Result<Self> {
        let key = key.into();
        if key.is_empty() {
            return Err(Error::invalid("key", "must not be empty"));
        }
        check_text("key", &key)?;
        Ok(Key(key))
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Validates a key prefix for listing: like a key, but may be empty.
///
/// # Errors
/// [`Error::InvalidInput`] for a prefix over 256 bytes or with a control
/// character.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    check_text("prefix", prefix)
}

fn check_text(what: &'static str, text: &str) -> Result<()> {
    if text.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(
            what,
            format!("must be at most {MAX_KEY_BYTES} bytes, got {}", text.len()),
        ));
    }
    if let Some((at, c)) = text.char_indices().find(|(_, c)| c.is_control()) {
        return Err(Error::invalid(
            what,
            format!(
                "must not contain control characters, found {:?} at byte {at}",
                c
            ),
        ));
    }
    Ok(())
}

/// What is wrong with the length of `text`, a name of 1 to `max` bytes, in
/// the words every such name's error uses; `None` when it fits.
#[cfg_attr(not(any(feature = "redis", feature = "mongodb")), allow(dead_code))]
pub(crate) fn length_problem(text: &str, max: usize) -> Option<String> {
    if text.is_empty() {
        Some("must not be empty".to_owned())
    } else if text.len() > max {
        Some(format!("must be at most {max} bytes, got {}", text.len()))
    } else {
        None
    }
}

/// Checks a short name that ends up in keys or labels (a store's key
/// prefix, a lock class): 1 to `max` bytes, no control characters.
pub(crate) fn check_name(what: &'static str, name: &str, max: usize) -> Result<()> {
    if name.is_empty() || name.len() > max {
        return Err(Error::invalid(
            what,
            format!("must be 1 to {max} bytes, got {}", name.len()),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::invalid(what, "must not contain control characters"));
    }
    Ok(())
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for Key {
    type Error = Error;
    fn try_from(value: &str) -> Result<Self> {
        Key::new(value)
    }
}

impl TryFrom<String> for Key {
    type Error = Error;
    fn try_from(value: String) -> Result<Self> {
        Key::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(r: Result<Key>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn accepts_ordinary_and_hostile_looking_keys() {
        for k in [
            "a",
            "orders:42",
            "'; DROP TABLE x; --",
            "$ne",
            "a.b",
            "*",
            "{x}",
            "ü€",
        ] {
            assert_eq!(Key::new(k).unwrap().as_str(), k);
        }
        assert!(Key::new("x".repeat(256)).is_ok());
    }

    #[test]
    fn rejects_with_specific_messages() {
        assert_eq!(problem(Key::new("")), "invalid key: must not be empty");
        assert_eq!(
            problem(Key::new("x".repeat(300))),
            "invalid key: must be at most 256 bytes, got 300"
        );
        assert!(problem(Key::new("a\0b")).contains("control characters, found '\\0' at byte 1"));
        assert!(problem(Key::new("a\nb")).contains("'\\n' at byte 1"));
        assert!(problem(Key::new("\u{7f}")).contains("control"));
        // 86 three-byte characters = 258 bytes: the limit is bytes, not chars.
        assert!(problem(Key::new("€".repeat(86))).contains("got 258"));
    }

    #[test]
    fn prefix_may_be_empty() {
        assert!(validate_prefix("").is_ok());
        assert!(validate_prefix("a\tb").is_err());
    }
}
