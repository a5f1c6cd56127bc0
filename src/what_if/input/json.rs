//! JSON access logs with named fields (Envoy's `json_format`, NGINX's `log_format … escape=json`).
//!
//! An access log's fields are found by name. Each part of a request has names it is looked for under
//! (the first found wins), Envoy's and NGINX's usual ones by default, `--field part=name` first:
//! `time`, `method`, `path`, `host`, `client` (an address, with or without a port), `xff`, and
//! `header:NAME` for a header the `proxy:` block reads (looked for as `NAME`, `NAME` with `-` as `_`,
//! and NGINX's `http_NAME`). Only those fields are read; the rest of the line is skipped unparsed.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use smallvec::SmallVec;

use super::{HttpRequest, LineError};
use crate::what_if::time;

/// The parts of a request, and the JSON names they are looked for under by default.
const PARTS: [(&str, &[&str]); 6] = [
    (
        "time",
        &[
            "start_time",
            "time",
            "timestamp",
            "@timestamp",
            "time_iso8601",
            "time_local",
            "msec",
        ],
    ),
    ("method", &["method", "request_method", ":method"]),
    ("path", &["path", "request_uri", "uri", ":path"]),
    ("host", &["authority", "host", "http_host", ":authority"]),
    (
        "client",
        &["downstream_remote_address", "remote_addr", "client_ip", "client"],
    ),
    (
        "xff",
        &["x_forwarded_for", "http_x_forwarded_for", "x-forwarded-for"],
    ),
];

/// The header each part is given as (time and client are not headers).
const AS_HEADER: [Option<&str>; 6] = [
    None,
    Some("x-forwarded-method"),
    Some("x-forwarded-uri"),
    Some("x-forwarded-host"),
    None,
    Some("x-forwarded-for"),
];

/// Where a JSON access log keeps each part of a request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fields {
    /// JSON name → (slot, rank): the slot it fills, and how early it is in that slot's names (lower
    /// wins when a line has several). Hashed by hashbrown's seeded foldhash, not SipHash: every field
    /// of every line is looked up (SipHash was 3 % of a replay), and only the names above are held.
    names: hashbrown::HashMap<String, (usize, usize)>,
    /// Slots 6 and up: the headers, by name.
    headers: Vec<String>,
}

impl Fields {
    /// The default names, with `overrides` (`part=name`, from `--field`) first, and a slot for each
    /// header in `headers` (those the `proxy:` blocks read).
    pub(crate) fn new<'h>(
        overrides: &[String],
        headers: impl IntoIterator<Item = &'h str>,
    ) -> Result<Self, String> {
        let mut fields = Fields::default();
        let mut header_names: Vec<String> = headers.into_iter().map(str::to_owned).collect();
        header_names.sort();
        header_names.dedup();
        for (slot, (_, defaults)) in PARTS.iter().enumerate() {
            let header = AS_HEADER[slot];
            header_names.retain(|h| Some(h.as_str()) != header);
            for (rank, name) in defaults.iter().enumerate() {
                fields.names.entry((*name).to_owned()).or_insert((slot, rank + 1));
            }
        }
        for header in header_names {
            let slot = PARTS.len() + fields.headers.len();
            let underscored = header.replace('-', "_");
            for (rank, name) in [header.clone(), underscored.clone(), format!("http_{underscored}")]
                .into_iter()
                .enumerate()
            {
                fields.names.entry(name).or_insert((slot, rank + 1));
            }
            fields.headers.push(header);
        }
        for entry in overrides {
            let (part, name) = entry
                .split_once('=')
                .ok_or_else(|| format!("--field {entry}: expected part=name"))?;
            let slot = match PARTS.iter().position(|(p, _)| *p == part) {
                Some(slot) => slot,
                None => {
                    let header = part
                        .strip_prefix("header:")
                        .map(str::to_ascii_lowercase)
                        .ok_or_else(|| {
                            format!(
                                "--field {entry}: the parts are time, method, path, host, client, xff and header:NAME"
                            )
                        })?;
                    match fields.headers.iter().position(|h| *h == header) {
                        Some(at) => PARTS.len() + at,
                        None => {
                            fields.headers.push(header);
                            PARTS.len() + fields.headers.len() - 1
                        }
                    }
                }
            };
            fields.names.insert(name.to_owned(), (slot, 0));
        }
        Ok(fields)
    }

    /// The request on a JSON access log line.
    pub(super) fn request(&self, line: &str) -> Result<HttpRequest, LineError> {
        let shape = |reason| LineError::Shape {
            format: "JSON",
            reason,
        };
        // Inline for the parts and a few headers, as many as a `proxy:` block usually reads.
        let mut found: SmallVec<[Found<'_>; 12]> =
            smallvec::smallvec![None; PARTS.len() + self.headers.len()];
        let mut deserializer = serde_json::Deserializer::from_str(line);
        Picker {
            fields: self,
            found: &mut found[..],
        }
        .deserialize(&mut deserializer)
        .map_err(|_| shape("not one JSON object"))?;
        let mut take = |slot: usize| {
            found[slot]
                .take()
                .map(|(_, value)| value)
                .filter(|v| !v.is_empty() && v != "-")
        };
        let time_us = take(0).and_then(|t| time::parse(&t)).ok_or(LineError::Time)?;
        let client = match take(4) {
            Some(text) => Some(
                tollgate_core::rules::proxy::parse_address(&text)
                    .ok_or(shape("a client that is not an address"))?,
            ),
            None => None,
        };
        let mut request = HttpRequest::new(time_us, client, line.len());
        for slot in [1, 2, 3, 5] {
            if let (Some(name), Some(value)) = (AS_HEADER[slot], take(slot)) {
                request.push(name, &value);
            }
        }
        for (at, name) in self.headers.iter().enumerate() {
            if let Some(value) = take(PARTS.len() + at) {
                request.push(name.clone(), &value);
            }
        }
        if client.is_none() && !request.headers().any(|(name, _)| name == "x-forwarded-for") {
            return Err(shape("no client address (client or xff)"));
        }
        Ok(request)
    }
}

/// A slot's value so far, if the line had one of its names: the name's rank and the value.
type Found<'f> = Option<(usize, Cow<'f, str>)>;

/// Reads one JSON object, keeping the fields [`Fields`] names.
struct Picker<'f, 'v> {
    fields: &'f Fields,
    found: &'v mut [Found<'f>],
}

impl<'de: 'f, 'f> DeserializeSeed<'de> for Picker<'f, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de: 'f, 'f> Visitor<'de> for Picker<'f, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let Some(&(slot, rank)) = self.fields.names.get(key.as_ref()) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let value = map.next_value::<Scalar<'de>>()?.0;
            let better = self.found[slot].as_ref().is_none_or(|(held, _)| rank < *held);
            if let (Some(value), true) = (value, better) {
                self.found[slot] = Some((rank, value));
            }
        }
        Ok(())
    }
}

/// A JSON value as text: strings as they are, numbers as written, anything else none.
struct Scalar<'de>(Option<Cow<'de, str>>);

impl<'de> Deserialize<'de> for Scalar<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Any<'a> {
            #[serde(borrow)]
            Text(Cow<'a, str>),
            Number(serde_json::Number),
            Other(IgnoredAny),
        }
        Ok(Scalar(match Any::deserialize(deserializer)? {
            Any::Text(text) => Some(text),
            Any::Number(n) => Some(Cow::Owned(n.to_string())),
            Any::Other(_) => None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envoy_json_line_is_read_by_its_usual_names() {
        let fields = Fields::new(&[], ["x-user-id", "x-forwarded-for"]).expect("fields");
        let line = r#"{"start_time":"2026-12-06T04:42:11.310Z","method":"GET","path":"/a?b=1","response_code":200,"authority":"shop","x_forwarded_for":"192.0.2.7","x_user_id":"ada","nested":{"x":[1,2]}}"#;
        let request = fields.request(line).expect("read");
        assert_eq!(request.time_us, 1_796_532_131_310_000);
        assert_eq!(request.header("x-forwarded-uri").as_deref(), Some("/a?b=1"));
        assert_eq!(request.header("x-forwarded-host").as_deref(), Some("shop"));
        assert_eq!(request.header("x-forwarded-for").as_deref(), Some("192.0.2.7"));
        assert_eq!(request.header("x-user-id").as_deref(), Some("ada"));
        assert_eq!(request.client, None);
    }

    #[test]
    fn an_nginx_json_line_names_its_client_and_field_overrides_win() {
        let fields =
            Fields::new(&["header:x-user-id=uid".to_owned(), "time=t".to_owned()], []).expect("fields");
        let line = r#"{"t":1796529731.5,"time_local":"06/Dec/2020:05:42:11 +0100","remote_addr":"[2001:db8::1]:4000","request_method":"POST","request_uri":"/x","uid":42}"#;
        let request = fields.request(line).expect("read");
        assert_eq!(request.time_us, 1_796_529_731_500_000);
        assert_eq!(request.client, Some("2001:db8::1".parse().expect("ip")));
        assert_eq!(request.header("x-user-id").as_deref(), Some("42"));
        assert_eq!(request.header("x-forwarded-method").as_deref(), Some("POST"));
        for bad in [
            "",
            "[1]",
            "{\"remote_addr\":\"192.0.2.1\"}",
            "{\"time\":\"2026-12-06T04:42:11Z\"}",
        ] {
            assert!(fields.request(bad).is_err(), "{bad}");
        }
        assert!(Fields::new(&["size=bytes".to_owned()], []).is_err());
    }
}
