//! Reading a large rules file on several cores. Parsing the YAML is most of a large load and one
//! parser reads on one core, so the file's top-level descriptor list is cut between items into runs;
//! each run is parsed, checked and built on a thread of its own ([`stream::read_run`]), the rest of the
//! file is read on its own, and the runs are joined in file order with the checks among their
//! descriptors ([`stream::Top::append`]). The result is the fast path's or nothing: whatever the cut
//! cannot vouch for gives up, and the file is read whole.
//!
//! Where a cut is sound. A line scan finds the root's `descriptors:` key (nothing after the colon) and
//! its list: a block sequence whose items start with `- ` at one indentation. An item ends where the
//! next such line begins, the list at the first line less indented. The scan cannot see quotes and flow
//! collections that span lines, but the parsers can: a cut inside one leaves a run with an unclosed
//! quote or bracket, which does not parse. That the key line is the root's `descriptors` key is checked
//! by reading the rest of the file: the key must be there, at that line, with nothing under it. What
//! would tie one run to another is excluded before the scan: anchors (a file with a `&` is read whole,
//! so no alias reaches across a cut and the parser's alias budgets stay one file's) and directives (a
//! line starting `%` before the list). The nesting budget is one level less in a run
//! ([`yaml::deserialize_run`]), so what is too deep for the file is too deep for its run.

use super::super::cores;
use super::model::DomainConfig;
use super::stream;
#[cfg(doc)]
use super::yaml;

/// The least text a thread is started for: a file smaller than two of these is read whole. (A thread
/// costs tens of microseconds; a mebibyte of rules takes tens of milliseconds to parse.)
const MIN_RUN_BYTES: usize = 1 << 20;

/// `file`'s text as the fast path reads it, read on as many threads as the machine has cores and the
/// file has mebibytes. `None` if the file is read whole: too small, or the cut gave up, or the fast
/// path would.
pub(super) fn parse(file: &str, text: &str) -> Option<DomainConfig> {
    parse_in(file, text, cores::parts_for(text.len(), MIN_RUN_BYTES))
}

/// [`parse`] in at most `runs` runs.
fn parse_in(file: &str, text: &str, runs: usize) -> Option<DomainConfig> {
    let cut = Cut::find(text, runs)?;
    let mut read = stream::read(&cut.rest)?;
    if read.descriptors_line != Some(cut.descriptors_line) || !read.top.is_empty() {
        return None;
    }
    let domain = read.domain();
    let built = cores::each_in_order(cut.runs, |run| stream::read_run(run, domain));
    for top in built {
        read.top.append(top?)?;
    }
    Some(read.into_config(file))
}

/// A rules file cut for reading in pieces.
#[derive(Debug, PartialEq)]
struct Cut<'t> {
    /// The text without the `descriptors` list (its key stays, with nothing under it).
    rest: String,
    /// The 1-based line of the `descriptors` key.
    descriptors_line: u32,
    /// The list's items, in runs of whole items, in file order.
    runs: Vec<&'t str>,
}

/// What the scan makes of one line.
#[derive(Debug, PartialEq)]
enum Line {
    /// Only spaces, or a comment.
    Blank,
    /// Content starting after `indent` spaces; `item` if it starts a block sequence's item (`- `).
    Content { indent: usize, item: bool },
    /// Something the scan does not vouch for (a tab in the indentation).
    Unknown,
}

impl Line {
    fn of(line: &str) -> Line {
        let body = line.trim_end_matches(['\n', '\r']);
        let after = body.trim_start_matches(' ');
        let indent = body.len() - after.len();
        if after.is_empty() || after.starts_with('#') {
            Line::Blank
        } else if after.starts_with('\t') {
            Line::Unknown
        } else {
            let item = after == "-" || after.starts_with("- ");
            Line::Content { indent, item }
        }
    }
}

/// Whether `line` is a `descriptors:` key at the start of a line with nothing after it but a comment.
fn is_descriptors_key(line: &str) -> bool {
    let Some(rest) = line.trim_end_matches(['\n', '\r']).strip_prefix("descriptors:") else {
        return false;
    };
    let after = rest.trim_start_matches(' ');
    after.is_empty() || (after.starts_with('#') && after.len() < rest.len())
}

impl<'t> Cut<'t> {
    /// Cuts `text`'s `descriptors` list into at most `runs` runs of about equal size; `None` if the
    /// file is not cut (fewer than two runs, or what the module docs exclude).
    fn find(text: &'t str, runs: usize) -> Option<Cut<'t>> {
        if runs < 2 || text.contains('&') {
            return None;
        }
        let mut lines = text.split_inclusive('\n');
        let mut offset = 0;
        let mut descriptors_line = 0u32;
        loop {
            let line = lines.next()?;
            offset += line.len();
            descriptors_line = descriptors_line.checked_add(1)?;
            if line.starts_with('%') {
                return None;
            }
            if is_descriptors_key(line) {
                break;
            }
        }
        let list_start = offset;
        // Where each run but the first is to begin at the earliest.
        let run_len = (text.len() - list_start) / runs;
        let mut cuts: Vec<usize> = Vec::with_capacity(runs + 1);
        // The indentation of the list's items, from its first item on.
        let mut items_at = None;
        let mut list_end = text.len();
        for line in lines {
            let start = offset;
            offset += line.len();
            let (indent, item) = match Line::of(line) {
                Line::Blank => continue,
                Line::Unknown => return None,
                Line::Content { indent, item } => (indent, item),
            };
            match items_at {
                None if item => {
                    items_at = Some(indent);
                    cuts.push(start);
                }
                Some(k) if indent > k => {}
                Some(k) if indent == k && item => {
                    let next_run_at = list_start + run_len * cuts.len();
                    if start >= next_run_at && cuts.len() < runs {
                        cuts.push(start);
                    }
                }
                Some(_) if indent == 0 => {
                    list_end = start;
                    break;
                }
                _ => return None,
            }
        }
        cuts.push(list_end);
        if cuts.len() < 3 {
            return None;
        }
        let runs = cuts
            .windows(2)
            .map(|w| text.get(w[0]..w[1]))
            .collect::<Option<Vec<_>>>()?;
        let mut rest = String::with_capacity(list_start + text.len() - list_end);
        rest.push_str(text.get(..list_start)?);
        rest.push_str(text.get(list_end..)?);
        Some(Cut {
            rest,
            descriptors_line,
            runs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::stream;
    use super::{Cut, parse_in};
    use proptest::prelude::*;

    /// A file of `n` top-level descriptors (two levels each) whose list items start after `indent`.
    fn rules(n: usize, indent: &str) -> String {
        let mut text = "domain: d  # the domain\ndescriptors:   # the list\n\n".to_owned();
        for i in 0..n {
            text.push_str(&format!(
                "{indent}- key: route\n{indent}  value: r-{i}\n{indent}  descriptors:\n\
                 {indent}    - key: user\n{indent}      rate_limit: {{unit: minute, requests_per_unit: {i}}}\n"
            ));
            if i % 7 == 0 {
                text.push_str(&format!(
                    "\n# between items\n{indent}  # indented\n{indent}- {{key: flow, value: f-{i}}}\n"
                ));
            }
        }
        text.push_str("all_or_nothing: true\n");
        text
    }

    /// The fast path's reading of `text`, whole.
    fn whole(text: &str) -> Option<super::DomainConfig> {
        stream::parse("f.yaml", text)
    }

    #[test]
    fn a_list_is_read_in_runs_exactly_as_whole() {
        for indent in ["", "  ", "    "] {
            for text in [rules(40, indent), rules(40, indent).replace('\n', "\r\n")] {
                let expected = whole(&text);
                assert!(
                    expected
                        .as_ref()
                        .is_some_and(|c| c.all_or_nothing && c.descriptors.len() > 40)
                );
                for runs in 2..=5 {
                    let cut = Cut::find(&text, runs).expect("cut");
                    assert_eq!(cut.runs.len(), runs, "{indent:?} {runs}");
                    assert!(cut.runs.iter().all(|run| run.starts_with(&format!("{indent}- "))));
                    // The runs are the list from its first item; the rest is the file without it.
                    let first = text.find(&format!("{indent}- key: route")).expect("an item");
                    let after = text.find("all_or_nothing").expect("a key after the list");
                    assert_eq!(cut.runs.concat(), text[first..after]);
                    let eol = if text.contains('\r') { "\r\n" } else { "\n" };
                    let rest = format!(
                        "domain: d  # the domain{eol}descriptors:   # the list{eol}all_or_nothing: true{eol}"
                    );
                    assert_eq!(cut.rest, rest);
                    assert_eq!(parse_in("f.yaml", &text, runs), expected, "{indent:?} {runs}");
                }
            }
        }
    }

    #[test]
    fn what_ties_runs_together_is_read_whole() {
        let anchored = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &r {unit: hour, requests_per_unit: 5}\n  \
                        - key: b\n    rate_limit: *r\n";
        let directive = "%YAML 1.1\n---\ndomain: d\ndescriptors:\n  - key: a\n  - key: b\n";
        for text in [anchored, directive] {
            assert_eq!(Cut::find(text, 2), None, "{text:?}");
            assert!(whole(text).is_some(), "{text:?}");
        }
        // A tab, or a line less indented than the items but not at the root, is not vouched for.
        for text in [
            "domain: d\ndescriptors:\n  - key: a\n\t- key: b\n  - key: c\n",
            "domain: d\ndescriptors:\n  - key: a\n - key: b\n  - key: c\n",
            "domain: d\ndescriptors:\n  key: a\n  - key: b\n",
        ] {
            assert_eq!(Cut::find(text, 2), None, "{text:?}");
        }
    }

    #[test]
    fn a_cut_the_parsers_refuse_gives_up() {
        let texts = [
            // A quoted value spanning the line a cut falls on.
            "domain: d\ndescriptors:\n  - key: a\n    value: \"x\n  - key: b\"\n  - key: c\n",
            // `descriptors:` inside a quoted domain: not the root's key.
            "domain: \"d\ndescriptors:\n  - key: a\n  - key: b\n\"\n",
            // A flow list spanning items.
            "domain: d\ndescriptors:\n  - key: a\n    value: [x,\n  - key: b]\n  - key: c\n",
        ];
        for text in texts {
            assert_eq!(parse_in("f.yaml", text, 3), None, "{text:?}");
        }
    }

    #[test]
    fn checks_among_top_level_descriptors_span_runs() {
        let clash = "domain: d\ndescriptors:\n  - key: a\n  - key: b\n  - key: c\n  - key: a\n";
        let normalised = "domain: d\ndescriptors:\n  - key: a\n    value: x\n    lowercase: true\n  - key: b\n  \
                          - key: a\n    value: y\n    trim: true\n";
        let agreeing = normalised.replace("trim", "lowercase");
        for runs in 2..=4 {
            assert_eq!(parse_in("f.yaml", clash, runs), None);
            assert_eq!(parse_in("f.yaml", normalised, runs), None);
            assert_eq!(parse_in("f.yaml", &agreeing, runs), whole(&agreeing));
        }
        assert_eq!(whole(clash), None);
        assert_eq!(whole(normalised), None);
    }

    #[test]
    fn what_is_too_deep_for_the_file_is_too_deep_for_its_run() {
        let nested = |levels: usize| {
            let mut text = "domain: d\ndescriptors:\n".to_owned();
            let mut indent = "  ".to_owned();
            for level in 0..levels {
                text.push_str(&format!("{indent}- key: k{level}\n{indent}  descriptors:\n"));
                indent.push_str("    ");
            }
            text.push_str(&format!("{indent}- key: last\n"));
            // Small items after the deep one, for the cut to fall between.
            text.push_str("  - key: a\n  - key: b\n  - key: c\n");
            text
        };
        let outcomes = move || {
            (26..36)
                .map(|levels| {
                    let text = nested(levels);
                    let expected = whole(&text);
                    assert!(Cut::find(&text, 2).is_some());
                    assert_eq!(parse_in("f.yaml", &text, 2), expected, "{levels} levels");
                    expected.is_some()
                })
                .collect::<Vec<bool>>()
        };
        // A debug build's frames are several times a release build's: the deepest nesting allowed needs
        // more than a test thread's stack there.
        let thread = std::thread::Builder::new().stack_size(8 << 20).spawn(outcomes);
        let outcomes = thread.expect("starts").join().expect("no panic");
        assert!(
            outcomes.contains(&true) && outcomes.contains(&false),
            "the range spans the limit: {outcomes:?}"
        );
    }

    /// Lines a hostile or odd file may hold, each placed anywhere in a valid file.
    const ODD_LINES: &[&str] = &[
        "",
        "# c",
        "  # c",
        "\"",
        "'",
        "  - \"",
        "  - '",
        "[",
        "]",
        "{",
        "}",
        "  - [",
        "  ]",
        "---",
        "...",
        "descriptors:",
        "descriptors: # c",
        "  - key: dup",
        "- key: z",
        " - key: z",
        "   - key: z",
        "    value: \"multi",
        "      line\"",
        "    value: |",
        "      - key: literal",
        "\t- key: t",
        "%TAG ! tag:x:",
        "all_or_nothing: yes",
        "domain: e",
        "  - key: route\n    value: r-1",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever the text, reading it in runs gives the whole reading or gives up.
        #[test]
        fn runs_never_read_a_file_otherwise(
            inserts in proptest::collection::vec((0usize..200, 0usize..ODD_LINES.len()), 0..4),
            indent in prop::sample::select(vec!["", "  ", "    "]),
            runs in 2usize..5,
        ) {
            let mut lines: Vec<String> = rules(12, indent).lines().map(str::to_owned).collect();
            for (at, odd) in inserts {
                lines.insert(at % (lines.len() + 1), ODD_LINES[odd].to_owned());
            }
            let text = lines.join("\n") + "\n";
            if let Some(config) = parse_in("f.yaml", &text, runs) {
                prop_assert_eq!(Some(config), whole(&text), "{:?}", text);
            }
        }
    }
}
