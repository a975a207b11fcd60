//! SQLite fixtures: a connection of its own that holds the database's
//! write lock, as another process's writer does.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::Path;

use leasehold::sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use leasehold::sqlx::{self, Connection};

/// Every table the store keeps records in.
pub const TABLES: [&str; 6] = [
    "leasehold_locks",
    "leasehold_permit_fences",
    "leasehold_permits",
    "leasehold_rw_fences",
    "leasehold_rw_slots",
    "leasehold_rw_marks",
];

/// Opens another connection with `options` and takes the database's
/// write lock (`BEGIN IMMEDIATE`); [`commit`] ends the lock.
pub async fn busy_writer(options: SqliteConnectOptions) -> SqliteConnection {
    let mut writer = SqliteConnection::connect_with(&options).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut writer)
        .await
        .unwrap();
    writer
}

/// [`busy_writer`] on the database file at `path`.
pub async fn busy_writer_at(path: &Path) -> SqliteConnection {
    busy_writer(SqliteConnectOptions::new().filename(path)).await
}

/// Ends a [`busy_writer`]'s lock.
pub async fn commit(mut writer: SqliteConnection) {
    sqlx::query("COMMIT").execute(&mut writer).await.unwrap();
}
