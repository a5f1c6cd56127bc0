//! Where Redis is: envoyproxy/ratelimit's `REDIS_URL` / `REDIS_TYPE` / `REDIS_SOCKET_TYPE` /
//! `REDIS_AUTH` / `REDIS_TLS` forms, and plain `redis://` URLs.
//!
//! - single: `host:port`, a unix socket path (with `REDIS_SOCKET_TYPE=unix` or an absolute path), or a
//!   `redis://` / `rediss://` / `redis+unix://` URL;
//! - cluster: `host:port,host:port,...` (seed nodes; the rest are discovered);
//! - sentinel: `master_name,sentinel_host:port,...` (the master is found through the sentinels;
//!   `REDIS_AUTH` applies to the master, `REDIS_SENTINEL_AUTH` to the sentinels).
//!
//! TLS: `REDIS_TLS=true` with `host:port`, or a `rediss://` URL; certificates come separately (see
//! [`super::LinkOptions::tls`]). With Sentinel, `REDIS_TLS` covers both the sentinels and the master
//! they name, as in the Go service.

use std::fmt;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

/// A parsed Redis location, ready to connect.
#[derive(Debug, Clone)]
pub struct RedisTarget {
    /// Single node or cluster, with connection details.
    pub mode: RedisMode,
    /// What to print in logs (never the password).
    described: String,
}

/// Deployment shape.
#[derive(Debug, Clone)]
pub enum RedisMode {
    /// One node (or a proxy in front of several).
    Single(ConnectionInfo),
    /// Redis Cluster seed nodes.
    Cluster(Vec<ConnectionInfo>),
    /// A master found through Redis Sentinel.
    Sentinel {
        /// The master's name as the sentinels know it.
        master: String,
        /// Sentinel addresses.
        sentinels: Vec<ConnectionInfo>,
        /// Credentials and database for the master.
        node: redis::RedisConnectionInfo,
        /// TLS to the sentinels and the master (`REDIS_TLS`), and whether it verifies the host name.
        tls: Option<redis::TlsMode>,
    },
}

/// Why a Redis location was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// `REDIS_TYPE` is not single, cluster or sentinel.
    #[error("unknown REDIS_TYPE '{0}' (expected SINGLE, CLUSTER or SENTINEL)")]
    UnknownType(String),
    /// An address could not be parsed.
    #[error("invalid Redis address '{address}': {reason}")]
    BadAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.described)
    }
}

impl RedisTarget {
    /// Parses envoyproxy/ratelimit's settings. `auth` (the Redis nodes') and `sentinel_auth` (the
    /// sentinels' own, `REDIS_SENTINEL_AUTH`) are `password` or `user:password` (may be empty).
    pub fn parse(
        url: &str,
        kind: &str,
        socket_type: &str,
        auth: &str,
        sentinel_auth: &str,
        tls: bool,
        skip_hostname_verification: bool,
    ) -> Result<Self, TargetError> {
        let addresses: Vec<&str> = url.split(',').map(str::trim).filter(|a| !a.is_empty()).collect();
        let one = |address: &str| node(address, socket_type, auth, tls, skip_hostname_verification);
        let mode = match kind.to_ascii_lowercase().as_str() {
            "" | "single" => match addresses.as_slice() {
                [address] => RedisMode::Single(one(address)?),
                _ => return Err(bad(url, "a single Redis takes exactly one address")),
            },
            "cluster" => RedisMode::Cluster(addresses.iter().map(|a| one(a)).collect::<Result<_, _>>()?),
            "sentinel" => match addresses.as_slice() {
                [master, sentinels @ ..] if !sentinels.is_empty() => RedisMode::Sentinel {
                    master: (*master).to_owned(),
                    sentinels: sentinels
                        .iter()
                        .map(|a| node(a, socket_type, sentinel_auth, tls, skip_hostname_verification))
                        .collect::<Result<_, _>>()?,
                    node: credentials(redis::RedisConnectionInfo::default(), auth),
                    tls: tls.then_some(if skip_hostname_verification {
                        redis::TlsMode::Insecure
                    } else {
                        redis::TlsMode::Secure
                    }),
                },
                _ => return Err(bad(url, "sentinel takes master_name,sentinel_host:port[,...]")),
            },
            other => return Err(TargetError::UnknownType(other.to_owned())),
        };
        let shape = match mode {
            RedisMode::Single(_) => "single",
            RedisMode::Cluster(_) => "cluster",
            RedisMode::Sentinel { .. } => "sentinel",
        };
        Ok(Self {
            mode,
            described: format!("{shape} {}", without_userinfo(url)),
        })
    }
}

fn node(
    address: &str,
    socket_type: &str,
    auth: &str,
    tls: bool,
    insecure: bool,
) -> Result<ConnectionInfo, TargetError> {
    let info = if address.contains("://") {
        address
            .into_connection_info()
            .map_err(|e| bad(address, &e.to_string()))?
    } else if socket_type.eq_ignore_ascii_case("unix") || address.starts_with('/') {
        ConnectionAddr::Unix(address.into())
            .into_connection_info()
            .map_err(|e| bad(address, &e.to_string()))?
    } else {
        let (host, port) = address
            .rsplit_once(':')
            .ok_or_else(|| bad(address, "expected host:port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| bad(address, "the port is not a number"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let addr = if tls {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        addr.into_connection_info()
            .map_err(|e| bad(address, &e.to_string()))?
    };

    Ok(with_auth(info, auth).set_tcp_settings(tcp_settings()))
}

/// TCP options of every Redis connection: `TCP_NODELAY`, as Redis sets on its side. redis-rs leaves
/// Nagle's algorithm on, and a small command written while an earlier one is unacknowledged then waits
/// for Redis's delayed ACK (40 ms on Linux): a p99.9 of 41 ms in `tollgate bench` until this was set.
pub(crate) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// How to reach the cluster node at `host:port`: `seed`'s credentials and TLS settings at another
/// address. `None` for a seed on a unix socket, which has no such twin.
pub(super) fn node_at(seed: &ConnectionInfo, host: &str, port: u16) -> Option<ConnectionInfo> {
    let addr = match seed.addr() {
        ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host.to_owned(), port),
        ConnectionAddr::TcpTls {
            insecure, tls_params, ..
        } => ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => return None,
    };
    Some(seed.clone().set_addr(addr))
}

fn with_auth(info: ConnectionInfo, auth: &str) -> ConnectionInfo {
    let settings = credentials(info.redis_settings().clone(), auth);
    info.set_redis_settings(settings)
}

/// Applies `REDIS_AUTH` (`password` or `user:password`; empty: none).
fn credentials(settings: redis::RedisConnectionInfo, auth: &str) -> redis::RedisConnectionInfo {
    match auth.split_once(':') {
        _ if auth.is_empty() => settings,
        Some((user, password)) => settings.set_username(user).set_password(password),
        None => settings.set_password(auth),
    }
}

fn bad(address: &str, reason: &str) -> TargetError {
    TargetError::BadAddress {
        address: without_userinfo(address),
        reason: reason.to_owned(),
    }
}

/// `text` (one address, or several separated by commas) with every credential replaced by `***`, for
/// logs and errors: the userinfo (`redis://user:password@host` → `redis://***@host`) and the password
/// of a query (`redis+unix:///run/redis.sock?pass=secret` → `…?pass=***`). A Redis URL may carry a
/// password; nothing that prints it may show any of it. A comma inside credentials (so that splitting
/// on commas would leave part of a password in front of the host) hides everything before the last
/// `@`.
pub fn without_userinfo(text: &str) -> String {
    let parts: Vec<&str> = text.split(',').collect();
    let last_with_at = parts.iter().rposition(|part| part.contains('@'));
    let split_credentials =
        last_with_at.is_some_and(|last| parts[..last].iter().any(|part| !part.contains('@')));
    if split_credentials && let Some(at) = text.rfind('@') {
        return format!("***@{}", without_query_password(&text[at + 1..]));
    }
    parts
        .iter()
        .map(|part| {
            let part = match (part.find("://"), part.rfind('@')) {
                (Some(scheme), Some(at)) if at > scheme => {
                    format!("{}***@{}", &part[..scheme + 3], &part[at + 1..])
                }
                (None, Some(at)) => format!("***@{}", &part[at + 1..]),
                _ => (*part).to_owned(),
            };
            without_query_password(&part)
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `address` with the values of its query's credential parameters (`pass`, `password`, `auth`) hidden.
fn without_query_password(address: &str) -> String {
    let Some((base, query)) = address.split_once('?') else {
        return address.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if ["pass", "password", "auth"].contains(&name.to_ascii_lowercase().as_str()) => {
                format!("{name}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", query.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_forms_parse() {
        let t =
            RedisTarget::parse("127.0.0.1:6379", "SINGLE", "tcp", "", "", false, false).expect("host:port");
        assert!(
            matches!(&t.mode, RedisMode::Single(i) if matches!(i.addr(), ConnectionAddr::Tcp(h, 6379) if h == "127.0.0.1"))
        );
        let t = RedisTarget::parse("/var/run/redis.sock", "", "unix", "", "", false, false).expect("unix");
        assert!(matches!(&t.mode, RedisMode::Single(i) if matches!(i.addr(), ConnectionAddr::Unix(_))));
        let t = RedisTarget::parse("a:1,b:2,c:3", "cluster", "tcp", "", "", false, false).expect("cluster");
        assert!(matches!(&t.mode, RedisMode::Cluster(nodes) if nodes.len() == 3));
        let t = RedisTarget::parse("redis://localhost:7000/2", "", "", "", "", false, false).expect("url");
        assert!(matches!(&t.mode, RedisMode::Single(i) if i.redis_settings().db() == 2));
    }

    #[test]
    fn tls_forms_parse() {
        let t = RedisTarget::parse("h:6380", "", "tcp", "", "", true, false).expect("tls host:port");
        assert!(
            matches!(&t.mode, RedisMode::Single(i) if matches!(i.addr(), ConnectionAddr::TcpTls { insecure: false, .. }))
        );
        let t = RedisTarget::parse("h:6380", "", "tcp", "", "", true, true).expect("insecure");
        assert!(
            matches!(&t.mode, RedisMode::Single(i) if matches!(i.addr(), ConnectionAddr::TcpTls { insecure: true, .. }))
        );
        let t = RedisTarget::parse("rediss://h:6380", "", "", "", "", false, false).expect("rediss");
        assert!(matches!(&t.mode, RedisMode::Single(i) if matches!(i.addr(), ConnectionAddr::TcpTls { .. })));
        let t = RedisTarget::parse("m,s:1", "sentinel", "", "", "", true, false).expect("sentinel over TLS");
        assert!(matches!(
            &t.mode,
            RedisMode::Sentinel { sentinels, tls: Some(redis::TlsMode::Secure), .. }
                if matches!(sentinels[0].addr(), ConnectionAddr::TcpTls { insecure: false, .. })
        ));
    }

    #[test]
    fn auth_sets_user_and_password() {
        let t = RedisTarget::parse("h:1", "", "", "alice:s3cret", "", false, false).expect("parses");
        let RedisMode::Single(info) = &t.mode else {
            panic!("single")
        };
        assert_eq!(info.redis_settings().username(), Some("alice"));
        assert_eq!(info.redis_settings().password(), Some("s3cret"));
        let t = RedisTarget::parse("h:1", "", "", "s3cret", "", false, false).expect("parses");
        let RedisMode::Single(info) = &t.mode else {
            panic!("single")
        };
        assert_eq!(info.redis_settings().password(), Some("s3cret"));
        assert!(!t.to_string().contains("s3cret"));
    }

    #[test]
    fn bad_input_is_refused_clearly() {
        assert!(matches!(
            RedisTarget::parse("h:1", "ring", "", "", "", false, false),
            Err(TargetError::UnknownType(_))
        ));
        assert!(matches!(
            RedisTarget::parse("nohostport", "", "", "", "", false, false),
            Err(TargetError::BadAddress { .. })
        ));
        assert!(matches!(
            RedisTarget::parse("h:x", "", "", "", "", false, false),
            Err(TargetError::BadAddress { .. })
        ));
        assert!(matches!(
            RedisTarget::parse("a:1,b:2", "single", "", "", "", false, false),
            Err(TargetError::BadAddress { .. })
        ));
        assert!(matches!(
            RedisTarget::parse("mymaster", "sentinel", "", "", "", false, false),
            Err(TargetError::BadAddress { .. })
        ));
        let t = RedisTarget::parse(
            "mymaster,s1:26379,s2:26379",
            "sentinel",
            "",
            "pw",
            "",
            false,
            false,
        )
        .expect("sentinel");
        assert!(
            matches!(&t.mode, RedisMode::Sentinel { master, sentinels, node, .. } if master == "mymaster" && sentinels.len() == 2 && node.password() == Some("pw"))
        );
        let err = RedisTarget::parse("redis://u:pw@", "", "", "", "", false, false).expect_err("no host");
        assert!(!err.to_string().contains("pw"), "{err}");
        assert_eq!(without_userinfo("redis://u:pw@h:1"), "redis://***@h:1");
        assert_eq!(
            without_userinfo("redis+unix:///run/redis.sock?db=1&pass=hunter2"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(
            without_userinfo("unix:///s.sock?password=hunter2"),
            "unix:///s.sock?password=***"
        );
        // A comma inside a password: nothing of it before the host.
        let shown = without_userinfo("redis://admin:hun,ter2@h:1");
        assert!(!shown.contains("hun") && !shown.contains("ter2"), "{shown}");
        assert_eq!(shown, "***@h:1");
        assert_eq!(
            without_userinfo("redis://a:p@h1:1,redis://b:q@h2:2"),
            "redis://***@h1:1,redis://***@h2:2"
        );
    }
}
