//! The timestamps access logs write, to microseconds since the Unix epoch, and back: RFC 3339 (Envoy's
//! `%START_TIME%`, NGINX's `$time_iso8601`, JSON logs), NGINX's `$time_local`
//! (`05/Dec/2026:14:02:11 +0000`) and epoch seconds (`1733407331.123`, NGINX's `$msec`).

/// A timestamp as `text` writes it, in microseconds since the epoch; `None` if it is none of the
/// forms above (or before 1970).
pub(super) fn parse(text: &str) -> Option<u64> {
    let text = text.trim();
    let first = *text.as_bytes().first()?;
    if first.is_ascii_digit() && text.len() > 4 && text.as_bytes()[4] == b'-' {
        rfc3339(text)
    } else if first.is_ascii_digit() && text.as_bytes().get(2) == Some(&b'/') {
        nginx_local(text)
    } else {
        epoch_seconds(text)
    }
}

/// `1733407331`, `1733407331.5`.
fn epoch_seconds(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let seconds: u64 = whole.parse().ok()?;
    seconds.checked_mul(1_000_000)?.checked_add(micros(fraction)?)
}

/// `2026-12-05T14:02:11.310Z`, `2026-12-05T14:02:11+01:00`, `2026-12-05 14:02:11.123456Z`.
fn rfc3339(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() < 19 || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':'
    {
        return None;
    }
    let date = civil_days(num(&text[0..4])?, num(&text[5..7])?, num(&text[8..10])?)?;
    let clock = num(&text[11..13])? * 3600 + num(&text[14..16])? * 60 + num(&text[17..19])?;
    let rest = &text[19..];
    let (fraction, zone) = match rest.strip_prefix('.') {
        Some(after) => after.split_at(after.bytes().take_while(u8::is_ascii_digit).count()),
        None => ("", rest),
    };
    let offset = zone_offset(zone)?;
    let seconds = (date * 86_400 + i64::try_from(clock).ok()?).checked_sub(offset)?;
    u64::try_from(seconds)
        .ok()?
        .checked_mul(1_000_000)?
        .checked_add(micros(fraction)?)
}

/// `05/Dec/2026:14:02:11 +0000`.
fn nginx_local(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() < 26 || b[6] != b'/' || b[11] != b':' || b[20] != b' ' {
        return None;
    }
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| *m == &text[3..6])? as u64 + 1;
    let date = civil_days(num(&text[7..11])?, month, num(&text[0..2])?)?;
    let clock = num(&text[12..14])? * 3600 + num(&text[15..17])? * 60 + num(&text[18..20])?;
    let zone = &text[21..];
    let offset = zone_offset(zone.get(..5)?)?;
    let seconds = (date * 86_400 + i64::try_from(clock).ok()?).checked_sub(offset)?;
    u64::try_from(seconds).ok()?.checked_mul(1_000_000)
}

/// `Z`, `+01:00`, `-0530` as seconds east of UTC.
fn zone_offset(zone: &str) -> Option<i64> {
    if matches!(zone, "Z" | "z") {
        return Some(0);
    }
    let sign = match zone.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let (hours, minutes) = match zone.len() {
        6 if zone.as_bytes()[3] == b':' => (zone.get(1..3)?, zone.get(4..6)?),
        5 => (zone.get(1..3)?, zone.get(3..5)?),
        _ => return None,
    };
    let minutes = num(hours)? * 60 + num(minutes)?;
    Some(sign * i64::try_from(minutes).ok()? * 60)
}

/// Digits as a number (no sign, nothing else).
fn num(digits: &str) -> Option<u64> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A fraction of a second's digits as microseconds (digits past the sixth dropped).
fn micros(fraction: &str) -> Option<u64> {
    if fraction.is_empty() {
        return Some(0);
    }
    let kept = &fraction[..fraction.len().min(6)];
    Some(num(kept)? * 10u64.pow(6 - kept.len() as u32))
}

/// Days from 1970-01-01 to the date (proleptic Gregorian), for plausible dates.
fn civil_days(year: u64, month: u64, day: u64) -> Option<i64> {
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || !(1970..=9999).contains(&year) {
        return None;
    }
    let (year, month, day) = (year as i64, month as i64, day as i64);
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// Microseconds since the epoch as RFC 3339 in UTC, to the millisecond.
pub(super) fn format(us: u64) -> String {
    let system = std::time::UNIX_EPOCH + std::time::Duration::from_micros(us);
    humantime::format_rfc3339_millis(system).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_logs_write_read_as_one_instant() {
        let instant = 1_796_532_131_310_000; // 2026-12-06T04:42:11.310Z
        for text in [
            "2026-12-06T04:42:11.310Z",
            "2026-12-06T05:42:11.310+01:00",
            "2026-12-05T23:42:11.310-0500",
            "2026-12-06 04:42:11.310000Z",
            "1796532131.31",
            "1796532131.310000001",
        ] {
            assert_eq!(parse(text), Some(instant), "{text}");
        }
        assert_eq!(parse("06/Dec/2026:05:42:11 +0100"), Some(instant - 310_000));
        assert_eq!(format(instant), "2026-12-06T04:42:11.310Z");
        for bad in [
            "",
            "-",
            "yesterday",
            "2026-13-06T04:42:11Z",
            "06/Foo/2026:05:42:11 +0100",
            "06/Dec/2026:05:42:11 +01",
            "2026-12-06T05:42:11+0:100",
            "2026-12-06T05:42:11+01:0",
            "12.5.6",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
