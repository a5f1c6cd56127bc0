//! The report, as text for the terminal and as JSON for machines (the HTML report is `html.rs`).

use serde_json::{Value, json};

use super::Summary;
use super::tally::{CURRENT, PROPOSED, RuleTally, Tally};
use super::time;

/// Newly refused clients shown by name in the text and HTML reports (the JSON lists up to 1,000).
pub(super) const CLIENTS_SHOWN: usize = 20;

/// Clients the JSON report lists.
const CLIENTS_IN_JSON: usize = 1_000;

/// `1234567` as `1,234,567`.
pub(super) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A share as a percentage with one decimal.
pub(super) fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0%".to_owned();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// The summary for the terminal.
pub(super) fn text(summary: &Summary, tally: &Tally) -> String {
    let mut out = String::new();
    let span = tally.span_us.map_or_else(String::new, |(first, last)| {
        format!(", {} to {}", time::format(first), time::format(last))
    });
    out.push_str(&format!(
        "what-if: {} requests replayed from {} ({}){span}\n",
        count(tally.requests),
        summary.inputs.join(", "),
        summary.format
    ));
    if summary.bad_lines > 0 {
        out.push_str(&format!(
            "         {} lines not read (first: {})\n",
            count(summary.bad_lines),
            summary.first_bad.as_deref().unwrap_or("")
        ));
    }
    out.push_str(&format!(
        "rules:   current {}, proposed {}\n\n",
        summary.current, summary.proposed
    ));
    let [before, after] = [&tally.sides[CURRENT], &tally.sides[PROPOSED]];
    out.push_str(&format!(
        "refused: {} → {} requests ({} → {} of all)\n",
        count(before.refused),
        count(after.refused),
        percent(before.refused, tally.requests),
        percent(after.refused, tally.requests)
    ));
    let width = tally
        .rules
        .iter()
        .map(|r| r.label().chars().count())
        .max()
        .unwrap_or(0);
    for rule in &tally.rules {
        out.push_str(&format!(
            "  {:<width$} {:>7} → {:<7}  peak use {:>4} → {:<4}  {} → {}\n",
            rule.label(),
            count(rule.refused[CURRENT]),
            count(rule.refused[PROPOSED]),
            peak(rule, CURRENT),
            peak(rule, PROPOSED),
            rule.limit[CURRENT].as_deref().unwrap_or("(no such limit)"),
            rule.limit[PROPOSED].as_deref().unwrap_or("(no such limit)"),
        ));
    }
    for (side, name) in [(CURRENT, "current"), (PROPOSED, "proposed")] {
        for (reason, n) in &tally.sides[side].unreadable {
            out.push_str(&format!(
                "  unreadable on the {name} side ({reason}): {}\n",
                count(*n)
            ));
        }
        for (reason, n) in &tally.sides[side].errors {
            out.push_str(&format!(
                "  not decided on the {name} side ({reason}): {}\n",
                count(*n)
            ));
        }
    }
    out.push_str(&format!(
        "\nnewly refused: {} requests from {} clients\n",
        count(tally.newly_refused),
        count(tally.clients.len() as u64)
    ));
    let clients = tally.top_clients(CLIENTS_SHOWN);
    let width = clients.iter().map(|(c, _)| c.chars().count()).max().unwrap_or(0);
    for (client, seen) in clients {
        out.push_str(&format!(
            "  {:<width$} {:>9} requests, first at {}\n",
            client,
            count(seen.requests),
            time::format(seen.first_us)
        ));
    }
    if tally.unlisted > 0 {
        out.push_str(&format!(
            "  (and {} requests of clients beyond the first 100,000)\n",
            count(tally.unlisted)
        ));
    }
    out.push_str(&format!(
        "now allowed:   {} requests the current rules refuse\n",
        count(tally.now_allowed)
    ));
    out
}

/// A limit's peak use on one side, or `-` where it does not apply.
fn peak(rule: &RuleTally, side: usize) -> String {
    if rule.requests[side] == 0 {
        "-".to_owned()
    } else {
        format!("{:.0}%", rule.peak[side] * 100.0)
    }
}

/// The report as JSON.
pub(super) fn json(summary: &Summary, tally: &Tally) -> Value {
    let side = |side: usize| {
        let totals = &tally.sides[side];
        json!({
            "refused": totals.refused,
            "not_limited": totals.not_limited,
            "unreadable": totals.unreadable,
            "errors": totals.errors,
        })
    };
    let rules: Vec<Value> = tally
        .rules
        .iter()
        .map(|rule| {
            json!({
                "rule": rule.path.as_ref(),
                "name": rule.name.as_deref(),
                "limit": {"current": rule.limit[CURRENT], "proposed": rule.limit[PROPOSED]},
                "requests": {"current": rule.requests[CURRENT], "proposed": rule.requests[PROPOSED]},
                "refused": {"current": rule.refused[CURRENT], "proposed": rule.refused[PROPOSED]},
                "peak_use": {"current": rule.peak[CURRENT], "proposed": rule.peak[PROPOSED]},
            })
        })
        .collect();
    let clients: Vec<Value> = tally
        .top_clients(CLIENTS_IN_JSON)
        .into_iter()
        .map(|(client, seen)| {
            json!({"client": client, "requests": seen.requests, "first_refused": time::format(seen.first_us)})
        })
        .collect();
    let timeline = &tally.timeline;
    let series: Vec<Value> = tally
        .rules
        .iter()
        .zip(&timeline.series)
        .map(|(rule, sides)| {
            json!({
                "rule": rule.label(),
                "current": &sides[CURRENT][..timeline.buckets],
                "proposed": &sides[PROPOSED][..timeline.buckets],
            })
        })
        .collect();
    json!({
        "input": {
            "files": summary.inputs,
            "format": summary.format,
            "lines": summary.lines,
            "bad_lines": summary.bad_lines,
            "first": tally.span_us.map(|(first, _)| time::format(first)),
            "last": tally.span_us.map(|(_, last)| time::format(last)),
        },
        "rules_dirs": {"current": summary.current, "proposed": summary.proposed},
        "requests": tally.requests,
        "current": side(CURRENT),
        "proposed": side(PROPOSED),
        "newly_refused": {
            "requests": tally.newly_refused,
            "clients": tally.clients.len(),
            "top": clients,
            "requests_of_unlisted_clients": tally.unlisted,
        },
        "now_allowed": tally.now_allowed,
        "rules": rules,
        "timeline": {
            "start": time::format(timeline.start_us),
            "bucket_seconds": timeline.bucket_us as f64 / 1e6,
            "refused": series,
        },
    })
}
