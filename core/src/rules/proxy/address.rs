//! The client's address, as a trusted hop reported it.
//!
//! Every proxy on the way may append the address it saw to `X-Forwarded-For`, and the client may send
//! the header with anything in it. Only the entries appended by hops the operator trusts say who the
//! client is, and they are the rightmost: with `trusted_hops: N`, the client is the Nth address from
//! the right. The proxy that asks Tollgate is the first of them (NGINX's `$proxy_add_x_forwarded_for`
//! appends what it saw; Caddy and Traefik, trusting no one by default, send only that), so the default
//! of 1 takes the address the proxy itself saw; a load balancer in front of the proxy makes it 2. A
//! header with fewer entries than trusted hops was written by trusted hops only, so its leftmost entry
//! is the client. Where the proxy sends the address alone (NGINX's `X-Real-IP $remote_addr`),
//! `header:` names it.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{BadRequest, ProxiedRequest};
use crate::rules::canonical_ip;
use crate::rules::ip_text::{ip_string, net_string};

/// The header `x_forwarded_for` reads.
pub(super) const FORWARDED_FOR: &str = "x-forwarded-for";

/// Most trusted hops: more proxies than this in front of one another is a configuration mistake.
pub const MAX_TRUSTED_HOPS: u8 = 16;

/// Where the client's address comes from (`client_address:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressSource {
    /// `x_forwarded_for: {trusted_hops: N}`: the Nth address from the right of `X-Forwarded-For`
    /// (every instance of the header, in order).
    ForwardedFor {
        /// Hops whose entries are trusted, the proxy that asks Tollgate included (1 to 16).
        trusted_hops: u8,
    },
    /// `header: name`: a header holding the address alone (its lowercase name).
    Header(String),
}

impl Default for AddressSource {
    fn default() -> Self {
        AddressSource::ForwardedFor { trusted_hops: 1 }
    }
}

impl AddressSource {
    /// The client's address in `request`'s headers.
    pub fn find<R: ProxiedRequest + ?Sized>(&self, request: &R) -> Result<IpAddr, BadRequest> {
        match self {
            AddressSource::ForwardedFor { trusted_hops } => {
                let values: Vec<_> = request.values(FORWARDED_FOR).collect();
                // From the right: the `trusted_hops`th entry, or the leftmost of fewer.
                let client = values
                    .iter()
                    .rev()
                    .flat_map(|value| value.rsplit(','))
                    .take(usize::from(*trusted_hops))
                    .last()
                    .ok_or_else(|| BadRequest::NoClientAddress(FORWARDED_FOR.to_owned()))?;
                parse(client).ok_or_else(|| BadRequest::GarbledClientAddress(FORWARDED_FOR.to_owned()))
            }
            AddressSource::Header(name) => {
                let value = request
                    .values(name)
                    .next()
                    .ok_or_else(|| BadRequest::NoClientAddress(name.clone()))?;
                parse(&value).ok_or_else(|| BadRequest::GarbledClientAddress(name.clone()))
            }
        }
    }
}

/// One address as proxies write it: bare, or with a port (`192.0.2.1:5000`, `[2001:db8::1]:443`),
/// blanks around it; an IPv4 address mapped into IPv6 is the IPv4 address.
pub fn parse(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim_matches([' ', '\t']);
    if let Some(ip) = canonical_ip(entry) {
        return Some(ip);
    }
    let host = match entry.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']')?.0,
        None => {
            let (host, port) = entry.rsplit_once(':')?;
            port.parse::<u16>().ok()?;
            host
        }
    };
    canonical_ip(host)
}

/// `ip` masked to its family's prefix length, as Envoy's `masked_remote_address` writes it
/// (`192.0.2.0/24`, `2001:db8::/64`; a full-length mask keeps the length: `192.0.2.7/32`).
pub(super) fn masked(ip: IpAddr, v4: u8, v6: u8) -> String {
    let len = match ip {
        IpAddr::V4(_) => v4,
        IpAddr::V6(_) => v6,
    };
    // The lengths were checked at load (at most 32 and 128).
    IpNet::new(ip, len).map_or_else(|_| ip_string(ip), |net| net_string(net.trunc()))
}
