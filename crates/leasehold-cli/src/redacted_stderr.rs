//! Standard error with the store URL's credentials taken out: the one
//! error line `main` prints and every tracing event (ours and the drivers',
//! at any `-v` level) pass through [`leasehold::redact_secrets`], so a
//! driver that echoes the URL or the password cannot leak it.

use std::io::{self, Write};
use std::sync::Arc;

use tracing_subscriber::fmt::MakeWriter;

/// Makes one [`Redacting`] writer per tracing event.
#[derive(Clone)]
pub struct RedactedStderr {
    store: Arc<str>,
}

impl RedactedStderr {
    /// Redacts the secrets of `store` (the store URL of this process).
    pub fn new(store: &str) -> Self {
        RedactedStderr {
            store: Arc::from(store),
        }
    }

    /// `text` without the store's secrets.
    pub fn redact(&self, text: &str) -> String {
        leasehold::redact_secrets(text, &self.store)
    }
}

impl<'a> MakeWriter<'a> for RedactedStderr {
    type Writer = Redacting<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        Redacting {
            store: self.store.clone(),
            buffer: Vec::new(),
            inner: io::stderr(),
        }
    }
}

/// Collects one event and writes it redacted when dropped (or flushed):
/// a secret split across two `write` calls is still found.
pub struct Redacting<W: Write> {
    store: Arc<str>,
    buffer: Vec<u8>,
    inner: W,
}

impl<W: Write> Write for Redacting<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.buffer);
        let redacted = leasehold::redact_secrets(&text, &self.store);
        self.buffer.clear();
        self.inner.write_all(redacted.as_bytes())?;
        self.inner.flush()
    }
}

impl<W: Write> Drop for Redacting<W> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_lose_the_secret_even_when_written_in_pieces() {
        let mut out = Vec::new();
        {
            let mut w = Redacting {
                store: Arc::from("redis://app:hunter22@cache"),
                buffer: Vec::new(),
                inner: &mut out,
            };
            w.write_all(b"connecting to redis://app:hun").unwrap();
            w.write_all(b"ter22@cache; auth hunter22\n").unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "connecting to redis://app:***@cache; auth ***\n"
        );
    }
}
