//! The one rule for showing an error with its causes, shared by the CLI's
//! one-line failures, the Node package's messages and the redaction of
//! driver errors, so all three read alike.

/// An error and its causes, `": "`-separated: `"store unavailable
/// (postgres): pool timed out: connection refused"`.
///
/// A cause whose text the line already holds is left out: drivers often
/// repeat their source in their own message, and the line would say it
/// twice. Line breaks inside a message are kept (a terminal caller may
/// flatten them).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn joins_causes_and_skips_the_ones_already_said() {
        let refused = Layer("connection refused", None);
        let repeats = Layer(
            "pool timed out: connection refused",
            Some(Box::new(refused)),
        );
        let top = Layer("store unavailable", Some(Box::new(repeats)));
        assert_eq!(
            error_chain(&top),
            "store unavailable: pool timed out: connection refused"
        );
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
    }
}
