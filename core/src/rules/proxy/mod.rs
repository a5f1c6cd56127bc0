//! How a proxy's request becomes a domain's descriptors: the `proxy:` block of a rules file, in the
//! words of Envoy's route `rate_limits` actions, so that NGINX, Caddy, Traefik and HAProxy (which cannot
//! build descriptors themselves) are limited by the same rules as Envoy.
//!
//! ```yaml
//! domain: api
//! proxy:
//!   client_address: {x_forwarded_for: {trusted_hops: 1}}
//!   rate_limits:
//!     - actions: [{remote_address: {}}]
//!     - actions:
//!         - header_value_match: {descriptor_value: login, headers: [{name: ":path", prefix_match: /auth/login}]}
//!         - remote_address: {}
//! ```
//!
//! Each entry of `rate_limits` makes at most one descriptor, its actions one entry each, in order, as
//! Envoy makes them: an action that cannot make its entry (a header absent, a match that fails) drops
//! the whole descriptor, and a request that makes none is not limited. The proxy forwards the request's
//! method, URI, host and scheme as `X-Forwarded-Method`, `-Uri`, `-Host` and `-Proto` (Caddy's and
//! Traefik's forward auth do; the NGINX and HAProxy examples set them), which the pseudo-headers
//! `:method`, `:path`, `:authority` and `:scheme` of header matchers read.
//!
//! The client's address is never a header a client can set: it is the address a trusted hop appended
//! to `X-Forwarded-For` ([`AddressSource`]). What cannot be read (no address, a garbled one, a cost
//! that is not a number) is a [`BadRequest`], which the caller answers with the block's
//! `failure_mode`.
//!
//! Layout: this file holds the compiled block and turns a request into descriptors; `address.rs`
//! finds the client's address, `matchers.rs` the header and query-parameter matchers. The YAML is read
//! and checked by `rules/file/proxy.rs`.

mod address;
mod matchers;

pub use address::MAX_TRUSTED_HOPS;
pub use address::{AddressSource, parse as parse_address};
pub use matchers::{HeaderMatcher, Pattern, QueryMatcher, TextKind, TextMatch, ValueRule};

use std::borrow::Cow;
use std::net::IpAddr;

use crate::rules::DescriptorEntry;
use crate::rules::ip_text::ip_string;

/// Most `rate_limits` entries in one `proxy:` block.
pub const MAX_RATE_LIMITS: usize = 64;

/// Most actions in one entry: each makes an entry, and a descriptor may hold at most
/// [`crate::limiter::MAX_ENTRIES`].
pub const MAX_ACTIONS: usize = 64;

/// Largest cost a request may name (`hits_addend`), as Envoy bounds it.
pub const MAX_HITS_ADDEND: u64 = 1_000_000_000;

/// A domain's `proxy:` block, checked and compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyRules {
    /// Where the client's address comes from.
    pub client_address: AddressSource,
    /// How a request that cannot be read is answered: allowed (`open`), refused (`closed`), or, when
    /// unset, with an error the proxy's own failure setting decides.
    pub failure_mode: Option<BadRequestAnswer>,
    /// The header in which the proxy names the upstream it routes to (`destination_cluster`).
    pub route_header: Option<String>,
    /// The descriptors to make, in order.
    pub rate_limits: Vec<RateLimitActions>,
}

/// What `failure_mode` says a request that cannot be read gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRequestAnswer {
    /// Let it through, unlimited.
    Open,
    /// Refuse it, as if over a limit.
    Closed,
}

/// One entry of `rate_limits`: the actions that make one descriptor, and its cost.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitActions {
    /// The descriptor's entries, one per action, in order.
    pub actions: Vec<Action>,
    /// `hits_addend`: what the descriptor costs; unset, the request's default (1).
    pub hits_addend: Option<Cost>,
}

/// `hits_addend`: a fixed cost, or one a header carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// `{number: N}`.
    Number(u64),
    /// `{format: "%REQ(name)%"}`: the header's value, a whole number up to [`MAX_HITS_ADDEND`].
    Header(String),
}

/// One of Envoy's rate-limit actions, as a proxy's request can answer it.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `remote_address: {}`: `remote_address` = the client's address.
    RemoteAddress,
    /// `masked_remote_address`: the client's network, `192.0.2.0/24`.
    MaskedRemoteAddress {
        /// `v4_prefix_mask_len` (default 32).
        v4: u8,
        /// `v6_prefix_mask_len` (default 128).
        v6: u8,
    },
    /// `generic_key`: a fixed entry.
    GenericKey {
        /// `descriptor_key` (default `generic_key`).
        key: String,
        /// `descriptor_value`.
        value: String,
    },
    /// `request_headers`: the header's first value.
    RequestHeaders {
        /// `header_name`, lowercase (a pseudo-header already mapped to its forwarded header).
        header: String,
        /// `descriptor_key`.
        key: String,
        /// `skip_if_absent`: an absent header leaves the entry out instead of dropping the descriptor.
        skip_if_absent: bool,
    },
    /// `header_value_match`: a fixed entry, made when the headers match (or, with `expect_match: false`,
    /// when they do not).
    HeaderValueMatch {
        /// `descriptor_key` (default `header_match`).
        key: String,
        /// `descriptor_value`.
        value: String,
        /// `expect_match` (default true).
        expect_match: bool,
        /// `headers`: all must match.
        headers: Vec<HeaderMatcher>,
    },
    /// `query_parameters`: a query parameter's first value.
    QueryParameters {
        /// `query_parameter_name`.
        name: String,
        /// `descriptor_key`.
        key: String,
        /// `skip_if_absent`.
        skip_if_absent: bool,
    },
    /// `query_parameter_value_match`: a fixed entry, made when the query parameters match.
    QueryParameterValueMatch {
        /// `descriptor_key` (default `query_match`).
        key: String,
        /// `descriptor_value`.
        value: String,
        /// `expect_match` (default true).
        expect_match: bool,
        /// `query_parameters`: all must match.
        parameters: Vec<QueryMatcher>,
    },
    /// `destination_cluster: {}`: `destination_cluster` = the upstream the proxy names in
    /// [`ProxyRules::route_header`].
    DestinationCluster,
}

/// What the actions read of a request that a proxy forwarded.
pub trait ProxiedRequest {
    /// Every value of header `name` (lowercase), in order; none when it is absent.
    fn values(&self, name: &str) -> impl Iterator<Item = Cow<'_, str>>;

    /// The client's address as `source` says to find it: by default from the forwarded headers.
    /// A replayed log line, which names the address itself, answers it directly.
    fn client_address(&self, source: &AddressSource) -> Result<IpAddr, BadRequest> {
        source.find(self)
    }
}

/// Why a request could not be turned into descriptors. The messages name headers, never their values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    /// The header that should carry the client's address is absent.
    #[error("no client address: the proxy sent no {0} header")]
    NoClientAddress(String),
    /// The client's address is not an IP address.
    #[error("the client address in {0} is not an IP address")]
    GarbledClientAddress(String),
    /// The cost header is absent or not a whole number up to 1,000,000,000.
    #[error("the cost in header {0} is absent or not a whole number up to 1000000000")]
    GarbledCost(String),
}

impl BadRequest {
    /// A short name of the reason, for a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            BadRequest::NoClientAddress(_) => "no_client_address",
            BadRequest::GarbledClientAddress(_) => "garbled_client_address",
            BadRequest::GarbledCost(_) => "garbled_cost",
        }
    }
}

/// One descriptor made from a request: entries whose keys the rules own and whose values borrow from
/// the request where they can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor<'a> {
    /// The entries, in action order.
    pub entries: Vec<Entry<'a>>,
    /// The descriptor's cost, when the rules set one.
    pub hits_addend: Option<u64>,
}

/// One entry of a [`Descriptor`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The entry's key, from the rules.
    pub key: &'a str,
    /// The entry's value.
    pub value: Cow<'a, str>,
}

impl DescriptorEntry for Entry<'_> {
    fn key(&self) -> &str {
        self.key
    }

    fn value(&self) -> &str {
        &self.value
    }
}

impl ProxyRules {
    /// Every header the block reads (lowercase; a header may be named more than once), so that a
    /// source holding only some of a request's headers (a log line) knows which to keep.
    pub fn headers_read(&self) -> impl Iterator<Item = &str> {
        let address = match &self.client_address {
            AddressSource::ForwardedFor { .. } => address::FORWARDED_FOR,
            AddressSource::Header(name) => name,
        };
        let per_action = self.rate_limits.iter().flat_map(|rate_limit| {
            let cost = match &rate_limit.hits_addend {
                Some(Cost::Header(name)) => Some(name.as_str()),
                _ => None,
            };
            rate_limit
                .actions
                .iter()
                .flat_map(Action::headers_read)
                .chain(cost)
        });
        std::iter::once(address)
            .chain(self.route_header.as_deref())
            .chain(per_action)
    }

    /// The descriptors `request` makes, in `rate_limits` order; empty when none applies.
    pub fn descriptors<'a, R: ProxiedRequest>(
        &'a self,
        request: &'a R,
    ) -> Result<Vec<Descriptor<'a>>, BadRequest> {
        let mut client = None;
        let mut out = Vec::with_capacity(self.rate_limits.len());
        for rate_limit in &self.rate_limits {
            // Allocated at the first entry: for any one request, most lists make none (a route's
            // match fails, a header is absent).
            let mut entries = Vec::new();
            let mut made = true;
            for action in &rate_limit.actions {
                match self.entry(action, request, &mut client)? {
                    Made::Entry(entry) => {
                        if entries.capacity() == 0 {
                            entries.reserve_exact(rate_limit.actions.len());
                        }
                        entries.push(entry);
                    }
                    Made::Skipped => {}
                    Made::Dropped => {
                        made = false;
                        break;
                    }
                }
            }
            if !made || entries.is_empty() {
                continue;
            }
            let hits_addend = rate_limit
                .hits_addend
                .as_ref()
                .map(|cost| cost.of(request))
                .transpose()?;
            out.push(Descriptor { entries, hits_addend });
        }
        Ok(out)
    }

    /// What `action` makes of `request`; `client` caches the client's address once it was needed.
    fn entry<'a, R: ProxiedRequest>(
        &'a self,
        action: &'a Action,
        request: &'a R,
        client: &mut Option<IpAddr>,
    ) -> Result<Made<'a>, BadRequest> {
        let fixed = |key: &'a str, value: &'a str| {
            Made::Entry(Entry {
                key,
                value: Cow::Borrowed(value),
            })
        };
        // A match action's fixed entry, made when the match came out as expected.
        let fixed_when = |made: bool, key: &'a str, value: &'a str| {
            if made { fixed(key, value) } else { Made::Dropped }
        };
        let made = match action {
            Action::RemoteAddress | Action::MaskedRemoteAddress { .. } => {
                let ip = match client {
                    Some(ip) => *ip,
                    None => *client.insert(request.client_address(&self.client_address)?),
                };
                let (key, value) = match action {
                    Action::MaskedRemoteAddress { v4, v6 } => {
                        ("masked_remote_address", address::masked(ip, *v4, *v6))
                    }
                    _ => ("remote_address", ip_string(ip)),
                };
                Made::Entry(Entry {
                    key,
                    value: Cow::Owned(value),
                })
            }
            Action::GenericKey { key, value } => fixed(key, value),
            Action::RequestHeaders {
                header,
                key,
                skip_if_absent,
            } => Made::from_value(key, request.values(header).next(), *skip_if_absent),
            Action::HeaderValueMatch {
                key,
                value,
                expect_match,
                headers,
            } => fixed_when(
                headers.iter().all(|h| h.matches(request)) == *expect_match,
                key,
                value,
            ),
            Action::QueryParameters {
                name,
                key,
                skip_if_absent,
            } => {
                let found = matchers::query_parameter(request, name).map(Cow::Owned);
                Made::from_value(key, found, *skip_if_absent)
            }
            Action::QueryParameterValueMatch {
                key,
                value,
                expect_match,
                parameters,
            } => fixed_when(
                parameters.iter().all(|p| p.matches(request)) == *expect_match,
                key,
                value,
            ),
            Action::DestinationCluster => {
                let route = self
                    .route_header
                    .as_deref()
                    .and_then(|h| request.values(h).next());
                Made::from_value("destination_cluster", route, false)
            }
        };
        Ok(made)
    }
}

impl Action {
    /// The headers this action reads.
    fn headers_read(&self) -> Vec<&str> {
        match self {
            Action::RequestHeaders { header, .. } => vec![header],
            Action::HeaderValueMatch { headers, .. } => headers.iter().map(|h| h.name.as_str()).collect(),
            Action::QueryParameters { .. } | Action::QueryParameterValueMatch { .. } => {
                vec![matchers::FORWARDED_URI]
            }
            Action::RemoteAddress
            | Action::MaskedRemoteAddress { .. }
            | Action::GenericKey { .. }
            | Action::DestinationCluster => Vec::new(),
        }
    }
}

/// What one action made.
enum Made<'a> {
    /// An entry for the descriptor.
    Entry(Entry<'a>),
    /// Nothing, and the descriptor goes on without it (`skip_if_absent`).
    Skipped,
    /// Nothing, and the descriptor is not made.
    Dropped,
}

impl<'a> Made<'a> {
    /// The entry `key` = `value`, or, with no value, skipped or dropped as `skip_if_absent` says.
    fn from_value(key: &'a str, value: Option<Cow<'a, str>>, skip_if_absent: bool) -> Self {
        match value {
            Some(value) => Made::Entry(Entry { key, value }),
            None if skip_if_absent => Made::Skipped,
            None => Made::Dropped,
        }
    }
}

impl Cost {
    /// The cost of one descriptor of `request`.
    fn of<R: ProxiedRequest>(&self, request: &R) -> Result<u64, BadRequest> {
        match self {
            Cost::Number(n) => Ok(*n),
            Cost::Header(name) => request
                .values(name)
                .next()
                .and_then(|v| parse_cost(&v))
                .ok_or_else(|| BadRequest::GarbledCost(name.clone())),
        }
    }
}

/// A cost as a header carries it: decimal digits (surrounding blanks allowed), at most
/// [`MAX_HITS_ADDEND`].
fn parse_cost(text: &str) -> Option<u64> {
    let digits = text.trim_matches([' ', '\t']);
    if digits.is_empty() || digits.len() > 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|n| *n <= MAX_HITS_ADDEND)
}

#[cfg(test)]
mod tests;
