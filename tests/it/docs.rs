//! The documentation against the code: every setting the code reads is in docs/settings.md, with its
//! envoyproxy/ratelimit names, and nothing there is a setting the code does not read; every Go setting
//! Tollgate accepts without acting on is listed too; and every file a document links to, or names as a
//! repository path, exists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tollgate::settings::Settings;
use tollgate::settings::go_env::GO_IGNORED;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The backticked words of `text` that look like setting names (`SHADOW_MODE`).
fn names_in(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| {
            !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_owned)
        .collect()
}

/// The rows of docs/settings.md's settings tables: (setting names, Go cell).
fn settings_rows(doc: &str) -> Vec<(Vec<String>, String)> {
    doc.lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split(" | ").collect();
            let first = cells[0].trim_start_matches("| ");
            (names_in(first), cells.get(1).copied().unwrap_or("").to_owned())
        })
        .collect()
}

#[test]
fn every_setting_the_code_reads_is_documented_with_its_go_names_and_nothing_else_is() {
    let doc = read(&repo().join("docs/settings.md"));
    let rows = settings_rows(&doc);
    let documented: BTreeSet<String> = rows.iter().flat_map(|(names, _)| names.clone()).collect();
    let catalogue = Settings::catalogue();
    let read: BTreeSet<String> = catalogue.iter().map(|e| e.key.to_ascii_uppercase()).collect();
    let missing: Vec<_> = read.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "read by the code, not in docs/settings.md: {missing:?}"
    );
    let unread: Vec<_> = documented.difference(&read).collect();
    assert!(
        unread.is_empty(),
        "in docs/settings.md, not read by the code: {unread:?}"
    );
    for entry in &catalogue {
        let name = entry.key.to_ascii_uppercase();
        let (_, go_cell) = rows
            .iter()
            .find(|(names, _)| names.contains(&name))
            .expect("documented");
        let same = go_cell.trim_start().starts_with("same");
        let go_documented = names_in(go_cell);
        for go in &entry.go {
            assert!(
                go_documented.iter().any(|g| g == go) || (same && *go == name),
                "{name}: its Go name {go} is not in its row's Go column ({go_cell:?})"
            );
        }
        assert!(
            !(same && entry.go.is_empty()),
            "{name}: has no Go name, but docs/settings.md says \"same\""
        );
    }
    for (ignored, _) in GO_IGNORED {
        let ignored = ignored.trim_end_matches('_');
        assert!(
            doc.contains(ignored),
            "the Go setting {ignored} is warned about but not in docs/settings.md"
        );
    }
}

/// The Markdown files a reader of the repository meets.
fn documents() -> Vec<PathBuf> {
    let root = repo();
    let mut docs: Vec<PathBuf> = [
        "README.md",
        "SECURITY.md",
        "CHANGELOG.md",
        "helm/tollgate/README.md",
        "clients/rust/README.md",
        "clients/python/README.md",
        "clients/node/README.md",
    ]
    .iter()
    .map(|p| root.join(p))
    .collect();
    let mut dir: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    dir.sort();
    docs.extend(dir);
    docs
}

/// Top-level folders of the repository: a backticked path starting with one names a file in it.
const TOP_LEVEL: [&str; 10] = [
    "src/",
    "core/",
    "scripts/",
    "tests/",
    "benches/",
    "docs/",
    "helm/",
    "clients/",
    "examples/",
    "proto/",
];

#[test]
fn every_file_a_document_links_to_or_names_exists() {
    let root = repo();
    let mut broken = Vec::new();
    for doc in documents() {
        let text = read(&doc);
        let here = doc.parent().expect("a folder");
        // Markdown links: `](target)`, relative ones only.
        for target in text.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
            let target = target.split('#').next().unwrap_or("").trim();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !here.join(target).exists() {
                broken.push(format!("{}: links to {target}", doc.display()));
            }
        }
        // Repository paths in code spans: `core/src/store/redis/coalesce.rs` (from the repository's
        // root, or from the document's folder: a client's README names its own package's files).
        for path in text.split('`').skip(1).step_by(2) {
            let plain = !path.contains(|c: char| c.is_whitespace() || "{}*<>$…,".contains(c));
            let exists = root.join(path).exists() || here.join(path).exists();
            if plain && TOP_LEVEL.iter().any(|top| path.starts_with(top)) && !exists {
                broken.push(format!("{}: names {path}", doc.display()));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "documents point at files that do not exist:\n{}",
        broken.join("\n")
    );
}
