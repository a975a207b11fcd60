//! The stores. Each is a small adapter of the [`Backend`](crate::Backend)
//! operations; all logic shared between stores lives in the core.

pub mod memory;
#[cfg(feature = "mongodb")]
pub mod mongodb;
#[cfg(feature = "sqlite")]
pub mod sqlite;
