//! The stores. Each is a small adapter of the [`Backend`](crate::Backend)
//! operations; all logic shared between stores lives in the core.

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
