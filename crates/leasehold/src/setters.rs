//! The builder setters every options type shares.
//!
//! Options types (`AcquireOptions`, the store options, the HTTP layer
//! builder) are built as `new()` + `with_*`, and a `with_*` setter only
//! stores its value: each type lists its setters with [`setters!`] so that
//! shape is written once. Checks stay where the options are used (before
//! any I/O), never in a setter, so a setter cannot fail.

/// Writes `pub fn NAME(mut self, ARG: TYPE) -> Self` setters, each storing
/// an expression of its argument in one field and returning `self`:
///
/// ```ignore
/// setters! {
///     /// Lease length.
///     with_ttl(ttl: Duration) => ttl = ttl;
///     /// Wait bound.
///     with_wait(wait: Duration) => wait = Some(wait);
/// }
/// ```
macro_rules! setters {
    ($($(#[$attr:meta])* $name:ident($arg:ident: $ty:ty) => $field:ident = $value:expr;)*) => {
        $(
            $(#[$attr])*
            pub fn $name(mut self, $arg: $ty) -> Self {
                self.$field = $value;
                self
            }
        )*
    };
}
