//! What the harness needs to know about a store from its URL: whether
//! workers reach it over TCP (so the fault proxy can sit in between), and
//! how to point a URL at the proxy instead. Which store is where comes from
//! the library's [`Scheme::parse`].

use leasehold::scheme::{Location, Scheme};

/// Where the URL's single TCP server is, or why the proxy cannot be used.
#[derive(Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `host:port` of the server.
    pub upstream: String,
    /// Byte range of `host[:port]` in the URL, to splice the proxy in.
    span: (usize, usize),
}

/// The TCP endpoint of `url`'s store, or a sentence saying why there is
/// none (a file, a Unix socket, several hosts).
pub fn endpoint(url: &str) -> Result<Endpoint, String> {
    let (scheme, parsed) = Scheme::parse(url).map_err(|e| e.to_string())?;
    let (written, rest) = url.split_once("://").unwrap_or(("", url));
    let default_port = match parsed.location() {
        Location::Tcp { default_port } => default_port,
        Location::File => {
            return Err(format!(
                "{scheme} is a file on this host: there is no connection to break"
            ))
        }
        Location::InProcess => {
            return Err(format!(
                "{scheme}:// lives inside each process: there is no connection"
            ))
        }
        _ => {
            return Err(format!(
                "{written}:// is not reached over a single TCP connection"
            ))
        }
    };
    let start = written.len() + 3;
    let authority_len = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let host_at = authority.rfind('@').map_or(0, |i| i + 1);
    let hostport = &authority[host_at..];
    if hostport.contains(',') {
        return Err("a URL with several hosts cannot go through one proxy".into());
    }
    if hostport.is_empty() {
        return Err(format!("{written}:// URL has no host"));
    }
    // `[v6]:port` or `host:port`; the port is what follows the last colon
    // outside brackets.
    let has_port = match hostport.rfind(':') {
        Some(i) => !hostport[i..].contains(']'),
        None => false,
    };
    let upstream = if has_port {
        hostport.to_owned()
    } else {
        format!("{hostport}:{default_port}")
    };
    Ok(Endpoint {
        upstream,
        span: (start + host_at, start + authority_len),
    })
}

/// `url` with its host and port replaced by `proxy` (credentials, database
/// and options kept).
pub fn via(url: &str, endpoint: &Endpoint, proxy: &str) -> String {
    let (a, b) = endpoint.span;
    format!("{}{proxy}{}", &url[..a], &url[b..])
}

/// The hosts of a URL that names several (`etcd://a:1,b:2,c:3/...`), and
/// the byte range of that list in the URL; `None` for a URL with one host.
fn host_list(url: &str) -> Option<(Vec<&str>, (usize, usize))> {
    let (written, rest) = url.split_once("://")?;
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let host_at = authority.rfind('@').map_or(0, |i| i + 1);
    let list = &authority[host_at..];
    let hosts: Vec<&str> = list.split(',').collect();
    if hosts.len() < 2 || hosts.iter().any(|h| h.is_empty()) {
        return None;
    }
    let start = written.len() + 3 + host_at;
    Some((hosts, (start, start + list.len())))
}

/// The URL each of `workers` workers is given when they are pinned to the
/// hosts of a several-host `url`: worker `i` gets host `i mod (n + 1)`
/// alone, and the URL as written (every host) for `i mod (n + 1) = n`. A
/// worker pinned to a member cut off from the others' majority can only
/// talk to that member; one with every host moves to another.
pub fn pinned(url: &str, workers: u32) -> Result<Vec<String>, String> {
    let Some((hosts, (a, b))) = host_list(url) else {
        return Err("--pin-hosts needs a store URL that names several hosts".into());
    };
    Ok((0..workers as usize)
        .map(|i| match hosts.get(i % (hosts.len() + 1)) {
            Some(host) => format!("{}{host}{}", &url[..a], &url[b..]),
            None => url.to_owned(),
        })
        .collect())
}

/// The hosts a worker's URL names, comma-separated (as written).
pub fn hosts_of(url: &str) -> String {
    match host_list(url) {
        Some((hosts, _)) => hosts.join(","),
        None => endpoint(url).map(|e| e.upstream).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_and_replaces_the_host() {
        let url = "redis://:secret@db.example:6380/2?prefix=x";
        let e = endpoint(url).unwrap();
        assert_eq!(e.upstream, "db.example:6380");
        assert_eq!(
            via(url, &e, "127.0.0.1:9"),
            "redis://:secret@127.0.0.1:9/2?prefix=x"
        );
        let e = endpoint("postgres://u@h/db").unwrap();
        assert_eq!(e.upstream, "h:5432");
        assert_eq!(via("postgres://u@h/db", &e, "p:1"), "postgres://u@p:1/db");
        assert_eq!(endpoint("redis://[::1]").unwrap().upstream, "[::1]:6379");
        assert_eq!(
            endpoint("redis://[::1]:7000").unwrap().upstream,
            "[::1]:7000"
        );
    }

    #[test]
    fn says_why_there_is_no_connection() {
        assert!(endpoint("sqlite:///tmp/x.db")
            .unwrap_err()
            .contains("a file"));
        assert!(endpoint("memory://").is_err());
        assert!(endpoint("redis+unix:///tmp/r.sock").is_err());
        assert!(endpoint("mongodb://a:1,b:2/x")
            .unwrap_err()
            .contains("several hosts"));
    }

    #[test]
    fn pins_workers_to_hosts() {
        let url = "etcd://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?prefix=x/";
        let urls = pinned(url, 5).unwrap();
        assert_eq!(urls[0], "etcd://127.0.0.1:1?prefix=x/");
        assert_eq!(urls[1], "etcd://127.0.0.1:2?prefix=x/");
        assert_eq!(urls[2], "etcd://127.0.0.1:3?prefix=x/");
        assert_eq!(urls[3], url);
        assert_eq!(urls[4], "etcd://127.0.0.1:1?prefix=x/");
        assert_eq!(hosts_of(&urls[1]), "127.0.0.1:2");
        assert_eq!(hosts_of(url), "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3");
        assert_eq!(
            pinned("redis+cluster://u@a:1,b:2", 2).unwrap(),
            vec!["redis+cluster://u@a:1", "redis+cluster://u@b:2"]
        );
        assert!(pinned("etcd://127.0.0.1:1", 3).is_err());
    }
}
