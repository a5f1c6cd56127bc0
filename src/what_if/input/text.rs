//! The text formats: Envoy's default access log format and NGINX's `combined`.
//!
//! Envoy's default (`[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%"
//! %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION%
//! %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%"
//! "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"`, fields after these ignored) names the
//! client only in `X-Forwarded-For`, to which Envoy appended the connection's peer (with
//! `use_remote_address`), so the `proxy:` block's `client_address` reads it as for a proxy. NGINX's
//! (`$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer"
//! "$http_user_agent"`, fields after these ignored) names the client itself.

use smallvec::SmallVec;

use super::{HttpRequest, LineError, request_line};
use crate::what_if::time;

/// A line of Envoy's default format.
pub(super) fn envoy(line: &str) -> Result<HttpRequest, LineError> {
    let shape = |reason| LineError::Shape {
        format: "Envoy's default",
        reason,
    };
    let fields: SmallVec<[&str; 12]> = Fields(line).take(12).collect();
    let [
        when,
        request,
        _code,
        _flags,
        _rx,
        _tx,
        _duration,
        _upstream_time,
        xff,
        agent,
        id,
        authority,
        ..,
    ] = fields.as_slice()
    else {
        return Err(shape("fewer than 12 fields"));
    };
    let time_us = time::parse(when).ok_or(LineError::Time)?;
    let mut out = HttpRequest::new(time_us, None, line.len());
    request_line(request, &mut out).ok_or(shape("no request line"))?;
    for (name, value) in [
        ("x-forwarded-for", xff),
        ("user-agent", agent),
        ("x-request-id", id),
        ("x-forwarded-host", authority),
    ] {
        if *value != "-" {
            out.push(name, value);
        }
    }
    Ok(out)
}

/// A line of NGINX's `combined` format.
pub(super) fn nginx(line: &str) -> Result<HttpRequest, LineError> {
    let shape = |reason| LineError::Shape {
        format: "NGINX's combined",
        reason,
    };
    let fields: SmallVec<[&str; 9]> = Fields(line).take(9).collect();
    let [
        client,
        _,
        _user,
        when,
        request,
        _status,
        _bytes,
        referer,
        agent,
        ..,
    ] = fields.as_slice()
    else {
        return Err(shape("fewer than 9 fields"));
    };
    let client = tollgate_core::rules::proxy::parse_address(client).ok_or(shape("no client address"))?;
    let time_us = time::parse(when).ok_or(LineError::Time)?;
    let mut out = HttpRequest::new(time_us, Some(client), line.len());
    request_line(request, &mut out).ok_or(shape("no request line"))?;
    for (name, value) in [("referer", referer), ("user-agent", agent)] {
        if *value != "-" {
            out.push_with(name, |values| unescape(value, values));
        }
    }
    Ok(out)
}

/// NGINX writes a `"` (and other bytes it escapes) as `\xHH`: `value` read back, appended to `out`.
fn unescape(value: &str, out: &mut String) {
    if !value.contains("\\x") {
        out.push_str(value);
        return;
    }
    let mut bytes_out = Vec::with_capacity(value.len());
    let bytes = value.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 2..i + 4)
            .filter(|_| bytes[i] == b'\\' && bytes.get(i + 1) == Some(&b'x'))
            .and_then(|h| std::str::from_utf8(h).ok())
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(byte) => {
                bytes_out.push(byte);
                i += 4;
            }
            None => {
                bytes_out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out.push_str(&String::from_utf8_lossy(&bytes_out));
}

/// The fields of a text log line: `[...]`, `"..."` (closed by a quote before a blank or the line's
/// end, since Envoy does not escape quotes inside) or a run of non-blanks.
struct Fields<'a>(&'a str);

impl<'a> Iterator for Fields<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        // Bytes, found by memchr: every delimiter is ASCII, so each index is a char boundary. (A
        // char pattern compared each candidate through a call to memcmp: 5 % of a replay.)
        let rest = self.0.trim_start_matches(' ');
        let bytes = rest.as_bytes();
        let (field, after) = match bytes.first()? {
            b'[' => {
                let end = memchr::memchr(b']', bytes)?;
                (&rest[1..end], &rest[end + 1..])
            }
            b'"' => {
                let body = &bytes[1..];
                let end = memchr::memchr_iter(b'"', body)
                    .find(|&at| matches!(body.get(at + 1), None | Some(b' ')))?;
                (&rest[1..end + 1], &rest[end + 2..])
            }
            _ => {
                let end = memchr::memchr(b' ', bytes).unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            }
        };
        self.0 = after;
        Some(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoys_default_format_is_read_field_by_field() {
        let line = r#"[2026-12-06T04:42:11.310Z] "POST /api/v1/locations?x=1 HTTP/2" 204 - 154 0 226 100 "10.0.35.28, 192.0.2.7" "nsq2http "v2"" "cc21d9b0" "locations" "tcp://10.0.2.1:80""#;
        let request = envoy(line).expect("read");
        assert_eq!(request.time_us, 1_796_532_131_310_000);
        assert_eq!(request.header("x-forwarded-method").as_deref(), Some("POST"));
        assert_eq!(
            request.header("x-forwarded-uri").as_deref(),
            Some("/api/v1/locations?x=1")
        );
        assert_eq!(
            request.header("x-forwarded-for").as_deref(),
            Some("10.0.35.28, 192.0.2.7")
        );
        assert_eq!(request.header("user-agent").as_deref(), Some(r#"nsq2http "v2""#));
        assert_eq!(request.header("x-forwarded-host").as_deref(), Some("locations"));
        assert_eq!(request.client, None);
        assert!(envoy("[2026-12-06T04:42:11.310Z] \"GET / HTTP/1.1\" 200").is_err());
        let late = line.replace("2026-12-06T04:42:11.310Z", "yesterday");
        assert_eq!(envoy(&late).err(), Some(LineError::Time));
    }

    #[test]
    fn nginx_combined_names_the_client_and_escapes_quotes() {
        let line = r#"192.0.2.7 - alice [06/Dec/2026:05:42:11 +0100] "GET /orders?page=2 HTTP/1.1" 200 612 "-" "curl \x22quoted\x22" "extra""#;
        let request = nginx(line).expect("read");
        assert_eq!(request.client, Some("192.0.2.7".parse().expect("ip")));
        assert_eq!(request.time_us, 1_796_532_131_000_000);
        assert_eq!(
            request.header("x-forwarded-uri").as_deref(),
            Some("/orders?page=2")
        );
        assert_eq!(request.header("user-agent").as_deref(), Some("curl \"quoted\""));
        assert_eq!(request.header("referer"), None);
        assert!(nginx("garbage").is_err());
        assert!(nginx(&line.replace("192.0.2.7", "host.example")).is_err());
    }
}
