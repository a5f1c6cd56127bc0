//! Addresses and networks read and spelled as std and ipnet do, without their general machinery.
//!
//! Keys hold client addresses as text (`ip_prefix` groups, `remote_address`, `masked_remote_address`),
//! so every decision on such a key reads one and often spells one. Through `fmt` the spelling cost more
//! than the rest of making a request's descriptors, and std's parser, built for every address form,
//! took longer over a dotted quad than the table lookup that follows. Here each is a loop over bytes.
//! Both must stay exactly std's: keys written before and after must be the same, and a value std
//! refuses as an address must not become one. The tests hold them to std's answers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Longest text [`net_string`] writes: a full IPv6 address and `/128`.
const MAX_NET_TEXT: usize = 39 + 4;

/// `text` as an IPv4 address, exactly when std's `Ipv4Addr::from_str` reads one: four decimal octets
/// of one to three digits, no leading zero, nothing else.
pub(crate) fn read_v4(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = text.as_bytes().split(|b| *b == b'.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || (part.len() > 1 && part[0] == b'0') {
            return None;
        }
        let mut value = 0u16;
        for digit in part {
            if !digit.is_ascii_digit() {
                return None;
            }
            value = value * 10 + u16::from(digit - b'0');
        }
        *octet = u8::try_from(value).ok()?;
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

/// Appends `ip` as its `Display` writes it.
fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => push_v4(out, v4),
        IpAddr::V6(v6) => push_v6(out, v6),
    }
}

/// `ip` as its `Display` writes it, in a string with room for a prefix length.
pub(crate) fn ip_string(ip: IpAddr) -> String {
    let mut out = String::with_capacity(MAX_NET_TEXT);
    push_ip(&mut out, ip);
    out
}

/// `net` as its `Display` writes it: the address, `/`, the prefix length.
pub(crate) fn net_string(net: IpNet) -> String {
    let mut out = String::with_capacity(MAX_NET_TEXT);
    push_ip(&mut out, net.addr());
    out.push('/');
    push_decimal(&mut out, net.prefix_len());
    out
}

/// Four decimal octets, no leading zeros.
fn push_v4(out: &mut String, v4: Ipv4Addr) {
    for (at, octet) in v4.octets().into_iter().enumerate() {
        if at > 0 {
            out.push('.');
        }
        push_decimal(out, octet);
    }
}

/// RFC 5952 as std applies it: an IPv4-mapped address as `::ffff:` and its dotted quad; otherwise
/// lowercase hex groups without leading zeros, the first longest run of two or more zero groups
/// written `::`.
fn push_v6(out: &mut String, v6: Ipv6Addr) {
    if let Some(v4) = v6.to_ipv4_mapped() {
        out.push_str("::ffff:");
        push_v4(out, v4);
        return;
    }
    let groups = v6.segments();
    let (mut start, mut len) = (0, 0);
    let mut run = 0;
    for (at, group) in groups.iter().enumerate() {
        run = if *group == 0 { run + 1 } else { 0 };
        if run > len {
            (start, len) = (at + 1 - run, run);
        }
    }
    if len < 2 {
        push_groups(out, &groups);
    } else {
        push_groups(out, &groups[..start]);
        out.push_str("::");
        push_groups(out, &groups[start + len..]);
    }
}

/// Hex groups joined by `:`.
fn push_groups(out: &mut String, groups: &[u16]) {
    for (at, group) in groups.iter().enumerate() {
        if at > 0 {
            out.push(':');
        }
        let digits = (16 - group.leading_zeros()).div_ceil(4).max(1);
        for shift in (0..digits).rev() {
            let digit = (group >> (4 * shift)) & 0xf;
            out.push(char::from(b"0123456789abcdef"[usize::from(digit)]));
        }
    }
}

/// A byte in decimal, no leading zeros.
fn push_decimal(out: &mut String, n: u8) {
    if n >= 100 {
        out.push(char::from(b'0' + n / 100));
    }
    if n >= 10 {
        out.push(char::from(b'0' + n / 10 % 10));
    }
    out.push(char::from(b'0' + n % 10));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dotted_quad_is_read_exactly_when_std_reads_one() {
        // Every spelling of an octet std might take or refuse, in every place; then too few or too
        // many parts, and text that is no address at all.
        let octets = [
            "0", "00", "01", "000", "1", "9", "10", "99", "100", "199", "255", "256", "300", "999", "0255",
            "1000", "", "a", "1a", " 1", "+1", "-1", "\u{0661}",
        ];
        for a in octets {
            for b in octets {
                for c in ["0", "01", "255", "256", ""] {
                    for d in octets {
                        let text = format!("{a}.{b}.{c}.{d}");
                        assert_eq!(read_v4(&text), text.parse().ok(), "{text:?}");
                    }
                }
            }
        }
        for text in [
            "",
            ".",
            "...",
            "1.2.3",
            "1.2.3.4.",
            ".1.2.3.4",
            "1.2.3.4.5",
            "1..2.3",
            "1.2.3.4 ",
            "192.0.2.7/32",
            "::1",
            "2001:db8::1",
            "localhost",
            "1.2.3.4:80",
        ] {
            assert_eq!(read_v4(text), text.parse().ok(), "{text:?}");
        }
    }

    #[test]
    fn every_octet_in_every_place_is_spelled_as_std_prints_it() {
        for octet in 0..=u8::MAX {
            for at in 0..4 {
                let mut octets = [192, 0, 2, 7];
                octets[at] = octet;
                let ip = IpAddr::from(octets);
                assert_eq!(ip_string(ip), ip.to_string());
            }
        }
    }

    #[test]
    fn every_shape_of_zero_groups_is_spelled_as_std_prints_it() {
        // Each of the 256 patterns of zero and non-zero groups (so every run of zeros, at every place,
        // ties included), with group values of every digit count.
        let values = [0x1, 0xa, 0x10, 0xdb8, 0xfff, 0x1000, 0xabcd, 0xffff];
        for zeros in 0..=u8::MAX {
            for turn in 0..values.len() {
                let mut groups = [0u16; 8];
                for (at, group) in groups.iter_mut().enumerate() {
                    if zeros & (1 << at) == 0 {
                        *group = values[(at + turn) % values.len()];
                    }
                }
                let ip = IpAddr::from(groups);
                assert_eq!(ip_string(ip), ip.to_string(), "{groups:x?}");
            }
        }
    }

    #[test]
    fn special_ipv6_forms_are_spelled_as_std_prints_them() {
        for text in [
            "::",
            "::1",
            "::ffff:192.0.2.7",
            "::ffff:0.0.0.0",
            "::192.0.2.7",
            "::ffff:0:c000:207",
            "64:ff9b::192.0.2.7",
            "fe80::1:2:3:4",
            "2001:db8:0:0:1:0:0:1",
            "1:0:0:2:0:0:0:3",
        ] {
            let ip: IpAddr = text.parse().expect("an address");
            assert_eq!(ip_string(ip), ip.to_string(), "{text}");
        }
    }

    #[test]
    fn a_network_is_spelled_as_ipnet_prints_it() {
        for (text, len) in [
            ("192.0.2.7", 24),
            ("192.0.2.7", 32),
            ("2001:db8:1:2::9", 64),
            ("::", 0),
        ] {
            let ip: IpAddr = text.parse().expect("an address");
            let net = IpNet::new(ip, len).expect("a prefix length").trunc();
            assert_eq!(net_string(net), net.to_string());
            assert!(net_string(net).len() <= MAX_NET_TEXT);
        }
        let widest = IpNet::new(
            "1111:2222:3333:4444:5555:6666:7777:8888".parse().expect("ip"),
            128,
        );
        assert_eq!(net_string(widest.expect("a prefix length")).len(), MAX_NET_TEXT);
    }
}
