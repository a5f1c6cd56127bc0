//! Prometheus text exposition format 0.0.4, the pieces every series needs: a histogram's lines and an
//! escaped label value.

use std::fmt::Write as _;

use tollgate_core::observe::metrics::{BUCKETS, Histogram};

/// One histogram's `_bucket`, `_sum` and `_count` lines; `labels` ends with a comma when not empty.
/// Bounds and sum are in seconds times `unit` (1: seconds, 1000: milliseconds).
pub(super) fn render_histogram(histogram: &Histogram, out: &mut String, name: &str, labels: &str, unit: f64) {
    let (buckets, count, sum) = histogram.read();
    for (bound, cumulative) in BUCKETS.iter().zip(buckets) {
        // Rounded: 0.015 s in milliseconds is 15, not 15.000000000000002.
        let bound = (bound * unit * 1e9).round() / 1e9;
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}");
    }
    let sum = sum * unit;
    let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {count}");
    let labels = labels.trim_end_matches(',');
    let labels = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(out, "{name}_sum{labels} {sum}");
    let _ = writeln!(out, "{name}_count{labels} {count}");
}

/// `value` as a label value: backslash, double quote and newline escaped.
pub(super) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn histograms_render_cumulative_buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(40));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(5));
        let mut out = String::new();
        render_histogram(&h, &mut out, "t", "", 1.0);
        assert!(out.contains("t_bucket{le=\"0.00005\"} 1"), "{out}");
        assert!(out.contains("t_bucket{le=\"0.005\"} 2"), "{out}");
        assert!(out.contains("t_bucket{le=\"1\"} 2"), "{out}");
        assert!(out.contains("t_bucket{le=\"+Inf\"} 3"), "{out}");
        assert!(out.contains("t_count 3"), "{out}");
        let mut ms = String::new();
        render_histogram(&h, &mut ms, "t", "", 1000.0);
        for bound in ["0.05", "15", "1000"] {
            assert!(ms.contains(&format!("le=\"{bound}\"")), "{bound} in {ms}");
        }
    }
}
