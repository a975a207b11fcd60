//! From a URL (`etcd://[user:password@]host:port[,host:port...][?options]`,
//! `etcds://` for TLS) to the client's endpoints and [`EtcdOptions`], before
//! any I/O.

use crate::error::{Error, Result};
use crate::percent::percent_decode_bytes;
use crate::scheme::options::ETCD_OPTIONS as URL_OPTIONS;
use crate::scheme::parse_idle_window;

use super::options::EtcdOptions;

/// What a URL names: the members to dial, and the options it sets on top
/// of `base`.
#[derive(Debug)]
pub(super) struct Target {
    pub endpoints: Vec<String>,
    pub options: EtcdOptions,
}

pub(super) fn parse(url: &str, base: EtcdOptions) -> Result<Target> {
    let bad = |problem: String| Error::invalid("store url", problem);
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("an etcd URL starts with etcd:// or etcds://".into()))?;
    let mut options = base;
    match scheme {
        "etcd" => {}
        "etcds" => options.tls = true,
        other => {
            return Err(bad(format!(
                "not an etcd URL: scheme {other:?}, expected etcd or etcds"
            )))
        }
    }
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (userinfo, hosts) = match base.rsplit_once('@') {
        Some((user, hosts)) => (Some(user), hosts),
        None => (None, base),
    };
    if let Some(userinfo) = userinfo {
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        let decode = |s: &str| String::from_utf8(percent_decode_bytes(s));
        let user = decode(user).map_err(|_| bad("the user name is not UTF-8".into()))?;
        let password = decode(password).map_err(|_| bad("the password is not UTF-8".into()))?;
        if user.is_empty() {
            return Err(bad("the URL has credentials but no user name".into()));
        }
        options = options.with_user(user, password);
    }
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    if hosts.contains('/') {
        return Err(bad(format!(
            "an etcd URL names members only, not a path: {hosts:?}"
        )));
    }
    let mut endpoints = Vec::new();
    for member in hosts.split(',') {
        endpoints.push(endpoint(member, options.uses_tls())?);
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = String::from_utf8(percent_decode_bytes(value))
            .map_err(|_| bad(format!("option {name} is not UTF-8")))?;
        if value.is_empty() && name != "listen" {
            return Err(bad(format!("option {name} needs a value")));
        }
        options = match name {
            "prefix" => options.with_prefix(value),
            "ca_file" => options.with_ca_file(value),
            "cert_file" => options.with_client_cert(value),
            "key_file" => options.with_client_key(value),
            "domain" => options.with_domain(value),
            "idle_window" => options.with_idle_window(parse_idle_window(&value)?),
            // The core's (`leasehold::open`), already applied there.
            "listen" => options,
            other => {
                return Err(bad(format!(
                    "unknown etcd option {other:?}; allowed: listen, {}",
                    URL_OPTIONS.join(", ")
                )))
            }
        };
    }
    if options.uses_tls() && scheme == "etcd" {
        // The members are named before the options are read; name them again.
        endpoints = endpoints
            .iter()
            .map(|e| e.replacen("http://", "https://", 1))
            .collect();
    }
    options.validate()?;
    Ok(Target { endpoints, options })
}

/// `host:port` (port 2379 if missing; `[v6]:port`) as the client dials it.
fn endpoint(member: &str, tls: bool) -> Result<String> {
    let bad = |problem: String| Error::invalid("store url", problem);
    if member.is_empty() {
        return Err(bad(
            "an etcd URL needs at least one host:port, and no empty one".into(),
        ));
    }
    let (host, port) = match member.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || member.starts_with('[') => {
            if host.contains(':') && !host.starts_with('[') {
                return Err(bad(format!(
                    "bad member {member:?}: write IPv6 hosts as [addr]:port"
                )));
            }
            (host, port)
        }
        _ => (member, "2379"),
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| bad(format!("bad port {port:?} in member {member:?}")))?;
    if host.is_empty() || host.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad(format!("bad host in member {member:?}")));
    }
    let scheme = if tls { "https" } else { "http" };
    Ok(format!("{scheme}://{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> Result<Target> {
        parse(url, EtcdOptions::new())
    }

    #[test]
    fn members_credentials_and_options() {
        let t = target("etcd://app:p%40ss@h1:2379,h2,127.0.0.1:4001/?prefix=jobs/").unwrap();
        assert_eq!(
            t.endpoints,
            ["http://h1:2379", "http://h2:2379", "http://127.0.0.1:4001"]
        );
        assert_eq!(t.options.prefix(), "jobs/");
        assert_eq!(t.options.user, Some(("app".to_owned(), "p@ss".to_owned())));
        let t = target("etcds://h1:2379?ca_file=/etc/ca.pem&domain=etcd.internal").unwrap();
        assert_eq!(t.endpoints, ["https://h1:2379"]);
        let t = target("etcd://h1:2379?ca_file=/etc/ca.pem").unwrap();
        assert_eq!(t.endpoints, ["https://h1:2379"]);
    }

    #[test]
    fn bad_urls_are_refused_before_io() {
        for url in [
            "etcd://",
            "etcd://h1:2379,,h2",
            "etcd://h1:notaport",
            "etcd://h1:0",
            "etcd://h1:2379/db",
            "etcd://h1:2379?unknown=1",
            "etcd://h1:2379?prefix=",
            "etcd://h1:2379?cert_file=c.pem",
            "etcd://:pw@h1",
            "http://h1:2379",
        ] {
            assert!(target(url).is_err(), "{url}");
        }
    }
}
