//! The report as one self-contained HTML page: no script, no font, nothing fetched. The chart of
//! refusals over time is inline SVG (one line per rule, dashed for the current rules, solid for the
//! proposed), then the newly refused clients and each limit's peak use as bars.

use std::fmt::Write as _;

use super::Summary;
use super::report::{CLIENTS_SHOWN, count, percent};
use super::tally::{CURRENT, PROPOSED, Tally};
use super::time;

/// Line colours, one per rule, in turn.
const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:980px;color:#222}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em}table{border-collapse:collapse;width:100%}\
td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}td.n{text-align:right}\
.bar{height:10px;background:#1f77b4;display:inline-block}.bar.c{background:#bbb}\
.big{font-size:1.6em;font-weight:600}.cards{display:flex;gap:2em}.legend span{margin-right:1.5em}\
svg text{font-size:11px;fill:#555}";

/// Escapes text for HTML.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page.
pub(super) fn page(summary: &Summary, tally: &Tally) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Tollgate what-if</title>\
         <style>{STYLE}</style></head><body><h1>What the proposed rules would have done</h1>"
    );
    let span = tally.span_us.map_or_else(String::new, |(first, last)| {
        format!(" from {} to {}", time::format(first), time::format(last))
    });
    let _ = write!(
        out,
        "<p>{} requests{span}, replayed from {} ({}); current rules <code>{}</code>, proposed <code>{}</code>.</p>",
        count(tally.requests),
        escape(&summary.inputs.join(", ")),
        summary.format,
        escape(&summary.current),
        escape(&summary.proposed)
    );
    let [before, after] = [&tally.sides[CURRENT], &tally.sides[PROPOSED]];
    let _ = write!(
        out,
        "<div class=\"cards\"><div><div class=\"big\" id=\"refused-current\">{}</div>refused now ({})</div>\
         <div><div class=\"big\" id=\"refused-proposed\">{}</div>refused by the proposal ({})</div>\
         <div><div class=\"big\" id=\"newly-refused\">{}</div>newly refused, from {} clients</div>\
         <div><div class=\"big\" id=\"now-allowed\">{}</div>would now pass</div></div>",
        count(before.refused),
        percent(before.refused, tally.requests),
        count(after.refused),
        percent(after.refused, tally.requests),
        count(tally.newly_refused),
        count(tally.clients.len() as u64),
        count(tally.now_allowed)
    );
    chart(&mut out, tally);
    clients(&mut out, tally);
    peaks(&mut out, tally);
    out.push_str("</body></html>\n");
    out
}

/// Refusals over time: one polyline per rule and side.
fn chart(out: &mut String, tally: &Tally) {
    let (width, height, left, bottom) = (900.0, 260.0, 50.0, 20.0);
    let timeline = &tally.timeline;
    let buckets = timeline.buckets.max(1);
    let top = timeline
        .series
        .iter()
        .flat_map(|sides| sides.iter().flat_map(|s| s[..buckets].iter()))
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let seconds = timeline.bucket_us as f64 / 1e6;
    let _ = write!(
        out,
        "<h2>Refused requests over time (per {seconds} s)</h2>\
         <svg id=\"refusals\" class=\"chart\" role=\"img\" viewBox=\"0 0 {width} {height}\" width=\"100%\">\
         <line x1=\"{left}\" y1=\"{y0}\" x2=\"{width}\" y2=\"{y0}\" stroke=\"#999\"/>\
         <line x1=\"{left}\" y1=\"0\" x2=\"{left}\" y2=\"{y0}\" stroke=\"#999\"/>\
         <text x=\"4\" y=\"12\">{top}</text><text x=\"4\" y=\"{y0}\">0</text>\
         <text x=\"{left}\" y=\"{height}\">{start}</text>\
         <text x=\"{width}\" y=\"{height}\" text-anchor=\"end\">{end}</text>",
        y0 = height - bottom,
        start = time::format(timeline.start_us),
        end = time::format(timeline.start_us + timeline.bucket_us * buckets as u64),
    );
    let x = |i: usize| left + (width - left) * (i as f64 + 0.5) / buckets as f64;
    let y = |n: u64| (height - bottom) - (height - bottom - 16.0) * n as f64 / top as f64;
    let mut legend = String::new();
    for (at, (rule, sides)) in tally.rules.iter().zip(&timeline.series).enumerate() {
        let colour = PALETTE[at % PALETTE.len()];
        for (side, dash) in [(CURRENT, " stroke-dasharray=\"4 3\""), (PROPOSED, "")] {
            if rule.refused[side] == 0 {
                continue;
            }
            let points: Vec<String> = sides[side][..buckets]
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{:.1},{:.1}", x(i), y(*n)))
                .collect();
            let _ = write!(
                out,
                "<polyline class=\"series\" data-rule=\"{}\" data-side=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\"{dash} points=\"{}\"/>",
                escape(&rule.label()),
                if side == CURRENT { "current" } else { "proposed" },
                points.join(" ")
            );
        }
        let _ = write!(
            legend,
            "<span style=\"color:{colour}\">&#9632; {}</span>",
            escape(&rule.label())
        );
    }
    let _ = write!(
        out,
        "</svg><p class=\"legend\">{legend}</p><p>Dashed: the current rules. Solid: the proposed rules.</p>"
    );
}

/// The newly refused clients, most requests first.
fn clients(out: &mut String, tally: &Tally) {
    out.push_str(
        "<h2>Newly refused clients</h2><table id=\"clients\"><tr><th>client</th><th>requests</th><th>first refused</th></tr>",
    );
    for (client, seen) in tally.top_clients(CLIENTS_SHOWN) {
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            escape(client),
            count(seen.requests),
            time::format(seen.first_us)
        );
    }
    out.push_str("</table>");
    if tally.clients.len() > CLIENTS_SHOWN {
        let _ = write!(
            out,
            "<p>and {} more clients (the JSON report lists up to 1,000).</p>",
            count((tally.clients.len() - CLIENTS_SHOWN) as u64)
        );
    }
}

/// Each limit: what it is on each side, what it refused, and its peak use as bars.
fn peaks(out: &mut String, tally: &Tally) {
    out.push_str(
        "<h2>Limits: refusals and peak use</h2><p>Peak use is the highest share of a limit in use right \
         after a request: 100% means some client reached it; well below, the limit has room.</p>\
         <table id=\"limits\"><tr><th>limit</th><th>current</th><th>proposed</th><th>refused</th><th>peak use</th></tr>",
    );
    for rule in &tally.rules {
        let bar = |side: usize, class: &str| {
            if rule.requests[side] == 0 {
                return "-".to_owned();
            }
            let share = rule.peak[side] * 100.0;
            format!(
                "<span class=\"bar{class}\" style=\"width:{:.0}px\"></span> {share:.0}%",
                share.clamp(1.0, 100.0) * 1.2
            )
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{} → {}</td><td>{}<br>{}</td></tr>",
            escape(&rule.label()),
            escape(rule.limit[CURRENT].as_deref().unwrap_or("-")),
            escape(rule.limit[PROPOSED].as_deref().unwrap_or("-")),
            count(rule.refused[CURRENT]),
            count(rule.refused[PROPOSED]),
            bar(CURRENT, " c"),
            bar(PROPOSED, "")
        );
    }
    out.push_str("</table>");
}
