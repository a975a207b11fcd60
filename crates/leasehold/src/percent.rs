//! Lenient `%XX` decoding, shared by the URL redactor and the HTTP path
//! keys: both must cope with whatever a user or a client wrote.

/// The bytes of `s` with every well-formed `%XX` escape decoded; a `%` not
/// followed by two hex digits is kept as written.
pub(crate) fn percent_decode_bytes(s: &str) -> Vec<u8> {
    let raw = s.as_bytes();
    let mut bytes = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = raw
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .filter(|_| raw[i] == b'%')
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(byte) => {
                bytes.push(byte);
                i += 3;
            }
            None => {
                bytes.push(raw[i]);
                i += 1;
            }
        }
    }
    bytes
}
