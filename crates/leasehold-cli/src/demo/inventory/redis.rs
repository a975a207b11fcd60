//! The demo's product as a Redis hash (`stock`, `version`, `fence`) next to
//! the locks, under the store's key prefix. The checked writes are Lua
//! scripts, so each compare and its write are one atomic step.

use leasehold::backends::redis::{Connection, RedisOptions};
use leasehold::scheme::StoreUrl;
use redis::Script;

use super::{store_error, Answer, Check, Inventory, Stock};
use crate::exit::CliError;

/// Refuses a write from a token older than the last one written.
/// KEYS[1] product; ARGV[1] stock, ARGV[2] token.
const WRITE_FENCED: &str = r"
local fence = redis.call('HGET', KEYS[1], 'fence')
if not fence then
  return redis.error_reply('ERR demo product ' .. KEYS[1] .. ' does not exist')
end
if tonumber(fence) > tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'fence', ARGV[2])
return 1
";

/// Writes only if nobody wrote since `version` was read.
/// KEYS[1] product; ARGV[1] stock, ARGV[2] the version read.
const WRITE_VERSIONED: &str = r"
local version = redis.call('HGET', KEYS[1], 'version')
if not version then
  return redis.error_reply('ERR demo product ' .. KEYS[1] .. ' does not exist')
end
if version ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'stock', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'version', 1)
return 1
";

pub struct RedisInventory {
    /// One server or a cluster (every call names one key).
    conn: Connection,
    prefix: String,
    write_fenced: Script,
    write_versioned: Script,
}

impl RedisInventory {
    /// The demo keys sit beside the locks, under the store's key prefix.
    pub async fn open(url: &StoreUrl) -> Result<Self, CliError> {
        // The library's default prefix, when the URL names none.
        let prefix = url.option("prefix").unwrap_or("leasehold").to_owned();
        // The lock store's timeouts: fail fast when the server is down.
        let conn = Connection::open(url.driver_url(), &RedisOptions::default())
            .await
            .map_err(store_error)?;
        Ok(RedisInventory {
            conn,
            prefix,
            write_fenced: Script::new(WRITE_FENCED),
            write_versioned: Script::new(WRITE_VERSIONED),
        })
    }

    /// The product's hash. Its hash tag is the product's lock key
    /// (`demo:PRODUCT`), so on a cluster the product and its lock live in
    /// one slot, on one primary: a failover moves both together.
    fn key(&self, product: &str) -> String {
        format!("{}:demo:{{demo:{product}}}", self.prefix)
    }

    async fn checked(
        &self,
        script: &Script,
        product: &str,
        args: [i64; 2],
    ) -> Result<bool, CliError> {
        let written: i64 = script
            .key(self.key(product))
            .arg(args[0])
            .arg(args[1])
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(store_error)?;
        Ok(written == 1)
    }
}

impl Inventory for RedisInventory {
    fn reset<'a>(&'a self, product: &'a str, stock: i64) -> Answer<'a, ()> {
        Box::pin(async move {
            redis::cmd("HSET")
                .arg(self.key(product))
                .arg(&[("stock", stock), ("version", 0), ("fence", 0)])
                .exec_async(&mut self.conn.clone())
                .await
                .map_err(store_error)
        })
    }

    fn read<'a>(&'a self, product: &'a str) -> Answer<'a, Stock> {
        Box::pin(async move {
            let key = self.key(product);
            let (stock, version): (Option<i64>, Option<i64>) = redis::cmd("HMGET")
                .arg(&key)
                .arg("stock")
                .arg("version")
                .query_async(&mut self.conn.clone())
                .await
                .map_err(store_error)?;
            match (stock, version) {
                (Some(stock), Some(version)) => Ok(Stock { stock, version }),
                _ => Err(CliError::new(
                    crate::exit::EX_SOFTWARE,
                    format!("demo inventory: product {key:?} does not exist"),
                )),
            }
        })
    }

    fn write<'a>(&'a self, product: &'a str, stock: i64, check: Check) -> Answer<'a, bool> {
        Box::pin(async move {
            match check {
                Check::None => {
                    redis::cmd("HSET")
                        .arg(self.key(product))
                        .arg("stock")
                        .arg(stock)
                        .exec_async(&mut self.conn.clone())
                        .await
                        .map_err(store_error)?;
                    Ok(true)
                }
                // Lua numbers are doubles: tokens are exact up to 2^53, as
                // in the store's own scripts.
                Check::Fence(token) => {
                    let token = i64::try_from(token).unwrap_or(i64::MAX);
                    self.checked(&self.write_fenced, product, [stock, token])
                        .await
                }
                Check::Version(version) => {
                    self.checked(&self.write_versioned, product, [stock, version])
                        .await
                }
            }
        })
    }
}
