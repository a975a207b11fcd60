//! The demo's product on etcd: three keys under the store's prefix,
//! `{prefix}demo/{product}/stock`, `…/version` and `…/fence`, next to the
//! locks (whose records sit under one-letter families, `L/`, `S/`, `R/`,
//! `A/`, so `demo/` never meets them). A checked write is one `Txn`: its
//! compare and its puts are one atomic step on the cluster.
//!
//! etcd compares values as bytes, so version and fence are written as 20
//! zero-padded digits (every `u64`): byte order is then number order, and
//! "the fence is at most this token" is `fence < token + 1`.

use leasehold::backends::etcd::{EtcdBackend, EtcdOptions, DEFAULT_PREFIX};
use leasehold::etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use leasehold::scheme::StoreUrl;

use super::{store_error, Answer, Check, Inventory, Stock};
use crate::exit::CliError;

pub struct EtcdInventory {
    client: Client,
    prefix: String,
}

/// `n` as 20 digits, so that etcd's byte comparison orders numbers.
fn padded(n: u64) -> String {
    format!("{n:020}")
}

impl EtcdInventory {
    /// On the lock store's own connections (one client per process).
    pub async fn open(url: &str, parsed: &StoreUrl) -> Result<Self, CliError> {
        let backend = EtcdBackend::connect_with(url, EtcdOptions::default())
            .await
            .map_err(store_error)?;
        let prefix = parsed.option("prefix").unwrap_or(DEFAULT_PREFIX);
        Ok(EtcdInventory {
            client: backend.client().clone(),
            prefix: format!("{prefix}demo/"),
        })
    }

    fn key(&self, product: &str, field: &str) -> String {
        format!("{}{product}/{field}", self.prefix)
    }

    async fn txn(&self, txn: Txn) -> Result<bool, CliError> {
        let answer = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(store_error)?;
        Ok(answer.succeeded())
    }

    fn missing(&self, product: &str) -> CliError {
        CliError::new(
            crate::exit::EX_SOFTWARE,
            format!(
                "demo inventory: product {:?} does not exist",
                self.key(product, "")
            ),
        )
    }
}

impl Inventory for EtcdInventory {
    fn reset<'a>(&'a self, product: &'a str, stock: i64) -> Answer<'a, ()> {
        Box::pin(async move {
            self.txn(Txn::new().and_then([
                TxnOp::put(self.key(product, "stock"), stock.to_string(), None),
                TxnOp::put(self.key(product, "version"), padded(0), None),
                TxnOp::put(self.key(product, "fence"), padded(0), None),
            ]))
            .await?;
            Ok(())
        })
    }

    fn read<'a>(&'a self, product: &'a str) -> Answer<'a, Stock> {
        Box::pin(async move {
            // One range read: stock and version of one revision.
            let answer = self
                .client
                .kv_client()
                .get(self.key(product, ""), Some(GetOptions::new().with_prefix()))
                .await
                .map_err(store_error)?;
            let field = |name: &str| -> Option<i64> {
                let key = self.key(product, name);
                let kv = answer.kvs().iter().find(|kv| kv.key() == key.as_bytes())?;
                kv.value_str().ok()?.parse().ok()
            };
            match (field("stock"), field("version")) {
                (Some(stock), Some(version)) => Ok(Stock { stock, version }),
                _ => Err(self.missing(product)),
            }
        })
    }

    fn write<'a>(&'a self, product: &'a str, stock: i64, check: Check) -> Answer<'a, bool> {
        Box::pin(async move {
            let stock_key = self.key(product, "stock");
            let put_stock = TxnOp::put(stock_key.as_str(), stock.to_string(), None);
            let exists = Compare::create_revision(stock_key.as_str(), CompareOp::Greater, 0);
            let txn = match check {
                Check::None => Txn::new().when([exists]).and_then([put_stock]),
                Check::Fence(token) => {
                    let fence = self.key(product, "fence");
                    let at_most_token = match token.checked_add(1) {
                        Some(above) => {
                            Compare::value(fence.as_str(), CompareOp::Less, padded(above))
                        }
                        // Every fence is at most u64::MAX.
                        None => Compare::create_revision(fence.as_str(), CompareOp::Greater, 0),
                    };
                    Txn::new()
                        .when([exists, at_most_token])
                        .and_then([put_stock, TxnOp::put(fence, padded(token), None)])
                }
                Check::Version(version) => {
                    let Ok(read) = u64::try_from(version) else {
                        return Ok(false);
                    };
                    let key = self.key(product, "version");
                    Txn::new()
                        .when([
                            exists,
                            Compare::value(key.as_str(), CompareOp::Equal, padded(read)),
                        ])
                        .and_then([put_stock, TxnOp::put(key, padded(read + 1), None)])
                }
            };
            if self.txn(txn).await? {
                return Ok(true);
            }
            // Refused: by its check, or because the product is gone.
            self.read(product).await?;
            Ok(false)
        })
    }
}
