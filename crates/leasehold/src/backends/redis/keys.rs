//! Where the Redis store keeps its records, and how a key maps to them.
//!
//! A lock key `k` under prefix `p` lives at `p:lock:{e(k)}` and its fence at
//! `p:fence:{e(k)}`, where `e` percent-encodes `%`, `{` and `}` and leaves
//! every other character alone. Why this encoding rather than a length
//! prefix (`{3:k}`):
//!
//! - `e(k)` has no braces, so the hash tag is exactly `e(k)`: lock and fence
//!   share one cluster slot, and a `}` inside a key cannot cut the tag short.
//! - The prefix has no braces either (checked), so the first `{` splits a
//!   Redis key into prefix and encoded key: the namespace is unambiguous.
//! - `e` works character by character and no code is a prefix of another, so
//!   `k` starts with `q` iff `e(k)` starts with `e(q)`: listing by prefix is a
//!   single `SCAN MATCH p:lock:{e(q)*` (after glob escaping) that returns
//!   exactly the wanted keys. A length prefix would put the length, unknown
//!   for a prefix query, in front of the text to match.

use crate::backend::RecordDecoder;
use crate::error::{Error, Result};
use crate::key::{length_problem, Key};

/// Longest store prefix, in bytes.
const MAX_PREFIX_BYTES: usize = 64;

/// Writes the names of a key's records, `NAME(&self, key) -> String`
/// each: `<prefix>:<record>:{<e(key)>}` (`Namespace::record`), so every
/// record of a key has the lock's hash tag.
macro_rules! records {
    ($($(#[$doc:meta])* $name:ident => $record:literal;)*) => {
        $(
            $(#[$doc])*
            pub(super) fn $name(&self, key: &Key) -> String {
                self.record($record, key)
            }
        )*
    };
}

/// The keys and channel of one store prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Namespace {
    prefix: String,
}

impl Namespace {
    /// Validates `prefix`: 1 to 64 bytes, no braces (they would move the hash
    /// tag), no control characters.
    pub(super) fn new(prefix: &str) -> Result<Self> {
        let problem = if let Some(problem) = length_problem(prefix, MAX_PREFIX_BYTES) {
            problem
        } else if let Some(c) = prefix
            .chars()
            .find(|c| matches!(c, '{' | '}') || c.is_control())
        {
            format!("must not contain braces or control characters, found {c:?}")
        } else {
            return Ok(Namespace {
                prefix: prefix.to_owned(),
            });
        };
        Err(Error::invalid("redis key prefix", problem))
    }

    records! {
        /// `key`'s lock: `<owner>#<token>:<holder label>` while it is held.
        lock => "lock";

        /// `key`'s mutex fence counter.
        fence => "fence";

        /// `key`'s kind (`rw` or `sem`), with the lock's hash tag: absent while
        /// the key is a mutex, or `q` while the mutex may have waiters queued
        /// (queue.lua). Written once, by the first reader-writer or
        /// semaphore grant on a key no mutex holds, and never changed back
        /// (docs/redis.md, "One key, one kind").
        kind => "kind";

        /// The order of `key`'s queue of mutex waiters (a sorted set: owner
        /// to its place, first come lowest), with the lock's hash tag, so one
        /// script reads the lock and hands it to the queue's head.
        queue => "queue";

        /// The entries of `key`'s queue (a hash: owner to
        /// `<expiry ms>:<ticket>:<claim window ms>:<holder label>`), with the
        /// lock's hash tag.
        waiters => "waiters";

        /// The hash of `key`'s semaphore permits (one field per slot), with
        /// the lock's hash tag.
        permits => "permits";

        /// `key`'s permit fence counter, with the lock's hash tag.
        permit_fence => "pfence";

        /// The hash of `key`'s reader-writer lock (a field per reader slot,
        /// the writer's slot and a waiting writer's `mark`), with the lock's
        /// hash tag and apart from the semaphore's.
        rw => "rw";

        /// `key`'s reader-writer fence counter, with the lock's hash tag.
        rw_fence => "rwfence";
    }

    /// A `SCAN MATCH` pattern for the permit hashes of keys starting with
    /// `prefix`.
    pub(super) fn permits_pattern(&self, prefix: &str) -> String {
        self.pattern("permits", prefix)
    }

    /// The key a permit hash's name stands for, as [`key_of_lock`](Self::key_of_lock).
    pub(super) fn key_of_permits(&self, name: &str) -> Option<Result<Key>> {
        self.key_of(name, ":permits:{")
    }

    /// A `SCAN MATCH` pattern for the reader-writer hashes of keys
    /// starting with `prefix`.
    pub(super) fn rw_pattern(&self, prefix: &str) -> String {
        self.pattern("rw", prefix)
    }

    /// The key a reader-writer hash's name stands for.
    pub(super) fn key_of_rw(&self, name: &str) -> Option<Result<Key>> {
        self.key_of(name, ":rw:{")
    }

    /// The one pub/sub channel of this prefix; the released key is the payload.
    pub(super) fn channel(&self) -> String {
        format!("{}:released", self.prefix)
    }

    /// A `SCAN MATCH` pattern for the lock keys of keys starting with `prefix`.
    pub(super) fn lock_pattern(&self, prefix: &str) -> String {
        self.pattern("lock", prefix)
    }

    /// The lock key a Redis key name stands for, if the name is one of
    /// ours; a corrupt record if it is in our namespace but this store
    /// never writes it.
    pub(super) fn key_of_lock(&self, name: &str) -> Option<Result<Key>> {
        self.key_of(name, ":lock:{")
    }

    /// The name of `key`'s record `record` (`lock`, `fence`, `permits`...):
    /// `<prefix>:<record>:{<e(key)>}`, every record of a key with the same
    /// hash tag (module docs).
    fn record(&self, record: &str, key: &Key) -> String {
        format!("{}:{record}:{{{}}}", self.prefix, encode(key.as_str()))
    }

    /// A `SCAN MATCH` pattern for the `record` names of keys starting with
    /// `prefix` (`record` is one of ours: no glob metacharacters).
    fn pattern(&self, record: &str, prefix: &str) -> String {
        format!(
            "{}:{record}:{{{}*",
            glob_escape(&self.prefix),
            glob_escape(&encode(prefix))
        )
    }

    fn key_of(&self, name: &str, kind: &str) -> Option<Result<Key>> {
        let encoded = name
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(kind)?
            .strip_suffix('}')?;
        Some(match decode(encoded) {
            Some(key) => RecordDecoder::new(super::STORE, &key).key(),
            None => {
                Err(RecordDecoder::new(super::STORE, name).corrupt("a bad %-escape in the name"))
            }
        })
    }
}

fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

fn decode(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['%', '{', '}']) {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3)?;
        out.push(match code {
            "%25" => '%',
            "%7B" => '{',
            "%7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// Escapes Redis glob metacharacters so the text matches only itself.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(p: &str) -> Namespace {
        Namespace::new(p).unwrap()
    }
    fn key(k: &str) -> Key {
        Key::new(k).unwrap()
    }

    /// Redis's cluster hash tag: the text between the first `{` and the
    /// first `}` after it, if non-empty; otherwise the whole name.
    fn hash_tag(name: &str) -> &str {
        if let Some(open) = name.find('{') {
            if let Some(len) = name[open + 1..].find('}') {
                if len > 0 {
                    return &name[open + 1..open + 1 + len];
                }
            }
        }
        name
    }

    /// Redis's glob matcher (`stringmatchlen`) for the syntax we emit:
    /// `*` and backslash escapes.
    fn glob(pattern: &str, text: &str) -> bool {
        fn m(p: &[char], t: &[char]) -> bool {
            match p.first() {
                None => t.is_empty(),
                Some('*') => (0..=t.len()).any(|i| m(&p[1..], &t[i..])),
                Some('\\') if p.len() > 1 => t.first() == Some(&p[1]) && m(&p[2..], &t[1..]),
                Some('?') => !t.is_empty() && m(&p[1..], &t[1..]),
                Some(c) => t.first() == Some(c) && m(&p[1..], &t[1..]),
            }
        }
        let p: Vec<char> = pattern.chars().collect();
        let t: Vec<char> = text.chars().collect();
        m(&p, &t)
    }

    #[test]
    fn prefix_and_key_never_run_together() {
        assert_ne!(ns("a:").lock(&key("b:c")), ns("a:b").lock(&key(":c")));
        assert_ne!(ns("a:").fence(&key("b:c")), ns("a:b").fence(&key(":c")));
        // A prefix that looks like our own structure is still told apart.
        assert_ne!(ns("a:lock").lock(&key("x")), ns("a").lock(&key("lock:x")));
        assert_ne!(ns("a").lock(&key("x")), ns("a").fence(&key("x")));
        assert_eq!(
            ns("a:")
                .key_of_lock(&ns("a:").lock(&key("b:c")))
                .map(Result::unwrap),
            Some(key("b:c"))
        );
        assert!(ns("a:b").key_of_lock(&ns("a:").lock(&key("b:c"))).is_none());
        // Ours, but no key this store writes: corrupt, not skipped.
        for name in ["a::lock:{}", "a::lock:{x%41}", "a::lock:{\n}"] {
            let e = ns("a:").key_of_lock(name).expect("ours").unwrap_err();
            assert_eq!(e.store(), Some("redis"), "{name}: {e}");
        }
    }

    #[test]
    fn braces_in_keys_keep_lock_and_fence_in_one_slot() {
        let n = ns("leasehold");
        for k in ["k", "{x}", "}", "{", "a}b{c", "{}", "%7B", "*?[]\\", "ü€"] {
            let (lock, fence) = (n.lock(&key(k)), n.fence(&key(k)));
            assert_eq!(hash_tag(&lock), hash_tag(&fence), "{k:?}");
            // A semaphore's keys share the tag too: its scripts stay in one slot.
            let (permits, permit_fence) = (n.permits(&key(k)), n.permit_fence(&key(k)));
            assert_eq!(hash_tag(&permits), hash_tag(&lock), "{k:?}");
            assert_eq!(hash_tag(&permit_fence), hash_tag(&lock), "{k:?}");
            // So do the kind and the reader-writer lock's keys: the permit
            // scripts claim the kind on the lock's keys in the same script.
            // And the queue's keys: acquire and release hand the lock to
            // the queue's head in one script.
            for other in [
                n.kind(&key(k)),
                n.rw(&key(k)),
                n.rw_fence(&key(k)),
                n.queue(&key(k)),
                n.waiters(&key(k)),
            ] {
                assert_eq!(hash_tag(&other), hash_tag(&lock), "{k:?}");
            }
            assert_eq!(n.key_of_permits(&permits).map(Result::unwrap), Some(key(k)));
            assert!(
                n.key_of_lock(&permits).is_none(),
                "a permits hash is no lock"
            );
            assert_eq!(
                decode(hash_tag(&lock)).as_deref(),
                Some(k),
                "tag is the key"
            );
            assert_eq!(
                n.key_of_lock(&lock).map(Result::unwrap),
                Some(key(k)),
                "{k:?} round-trips"
            );
        }
        // Distinct keys never share a name, even where encodings look alike.
        assert_ne!(n.lock(&key("%7B")), n.lock(&key("{")));
    }

    #[test]
    fn list_patterns_match_exactly_the_prefixed_keys() {
        let n = ns("p*[x]?");
        let keys = [
            "a", "a*", "a*b", "*", "?", "[a]", "a\\", "{a}", "%", "a%7B", "-^",
        ];
        for prefix in [
            "", "a", "a*", "*", "?", "[", "[a", "{", "{a}", "%", "a\\", "-^",
        ] {
            let pattern = n.lock_pattern(prefix);
            for k in keys {
                assert_eq!(
                    glob(&pattern, &n.lock(&key(k))),
                    k.starts_with(prefix),
                    "prefix {prefix:?} vs key {k:?} (pattern {pattern:?})"
                );
            }
            // Other prefixes' and fence keys never match.
            assert!(!glob(&pattern, &ns("p").lock(&key("a"))));
            assert!(!glob(&pattern, &n.fence(&key("a"))));
            assert!(!glob(&pattern, &n.kind(&key("a"))));
            assert!(!glob(&pattern, &n.queue(&key("a"))));
            assert!(!glob(&pattern, &n.waiters(&key("a"))));
        }
    }

    #[test]
    fn bad_prefixes_are_rejected_with_the_reason() {
        let problem = |p: &str| Namespace::new(p).unwrap_err().to_string();
        assert!(problem("").contains("must not be empty"));
        assert!(problem(&"x".repeat(65)).contains("at most 64 bytes, got 65"));
        assert!(problem("a{b").contains("braces"));
        assert!(problem("a}").contains("braces"));
        assert!(problem("a\nb").contains("control"));
        assert!(Namespace::new("my-app:locks").is_ok());
    }

    #[test]
    fn decode_rejects_foreign_names() {
        assert_eq!(decode("a%41"), None);
        assert_eq!(decode("a%7"), None);
        assert_eq!(decode("a{b"), None);
        assert_eq!(decode("a%25b").as_deref(), Some("a%b"));
    }
}
