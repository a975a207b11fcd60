//! The stores. Each is a small adapter of the [`Backend`](crate::Backend)
//! operations; all logic shared between stores lives in the core.

/// Writes a networked store's two URL entry points around its private
/// `connect_to(url, options)`: `connect(url)`, with the default options,
/// and `connect_with(url, options)`, whose error, whatever failed, carries
/// no secret of `url` (a password, a token in the query). Each store gives
/// the docs of both:
///
/// ```text
/// impl EtcdBackend {
///     connect_methods! {
///         /// Connects to the members of `url`.
///         connect;
///         /// As `connect`, with `options`.
///         connect_with(options: EtcdOptions);
///     }
/// }
/// ```
#[cfg(any(feature = "etcd", feature = "mongodb", feature = "redis"))]
macro_rules! connect_methods {
    (
        $(#[$connect:meta])*
        connect;
        $(#[$connect_with:meta])*
        connect_with($options:ident: $type:ty);
    ) => {
        $(#[$connect])*
        pub async fn connect(url: &str) -> $crate::error::Result<Self> {
            Self::connect_with(url, <$type>::default()).await
        }

        $(#[$connect_with])*
        pub async fn connect_with(url: &str, $options: $type) -> $crate::error::Result<Self> {
            Self::connect_to(url, $options)
                .await
                .map_err(|e| e.without_secrets_of(url))
        }
    };
}

pub mod decorator;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod memory;
#[cfg(feature = "mongodb")]
pub mod mongodb;
pub mod polling;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql_errors;
#[cfg(feature = "sqlite")]
pub mod sqlite;
