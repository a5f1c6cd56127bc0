//! Directory discovery and per-domain merging.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::ConfigError;
use super::model::DomainConfig;
use super::parse_text;
use super::validate::{Siblings, final_key};

/// Every rules file below a directory, read once: what a load parses and what a reload compares.
#[derive(Debug)]
pub struct Snapshot {
    /// (path, contents), in the order the files are loaded.
    files: Vec<(PathBuf, Vec<u8>)>,
    /// Links to directories outside the rules directory, not walked.
    skipped: Vec<PathBuf>,
}

/// Most rules files below a rules directory: far above any real deployment, low enough that a
/// misplaced mount cannot make every poll read a whole filesystem.
pub(super) const MAX_RULES_FILES: usize = 10_000;

/// Default for the largest rules file read (`TOLLGATE_RULES_MAX_FILE_BYTES`): 64 MiB holds some
/// 400,000 Envoy Gateway routes, far above what one listener carries.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

impl Snapshot {
    /// Reads every rules file below `dir` (see [`super::load_dir`] for which), each of at most
    /// `max_file_bytes`. A link to a directory outside `dir` is not followed (see
    /// [`Snapshot::skipped`]): a link to `/` must not make every poll walk the filesystem. Links to
    /// files are followed wherever they point.
    pub fn read(dir: &Path, max_file_bytes: u64) -> Result<Self, ConfigError> {
        let (files, skipped) = each_file(dir, |path| read_at_most(path, max_file_bytes))?;
        Ok(Self { files, skipped })
    }

    /// The links to directories outside the rules directory that were not walked.
    pub fn skipped(&self) -> &[PathBuf] {
        &self.skipped
    }

    /// A content hash of the files (names and bytes): the rules' version.
    pub fn fingerprint(&self) -> String {
        fingerprint(
            self.files
                .iter()
                .map(|(path, bytes)| (path.as_path(), blake3::hash(bytes))),
        )
    }

    /// The [`Snapshot::fingerprint`] of what [`Snapshot::read`] would read below `dir`, without holding
    /// the files: each is hashed as it is read, through a small buffer. A poll that finds nothing changed
    /// (nearly every poll) costs no memory, where holding a large rules file to hash it left tens of
    /// megabytes with the allocator at every poll.
    pub fn fingerprint_of(dir: &Path, max_file_bytes: u64) -> Result<String, ConfigError> {
        let (hashes, _) = each_file(dir, |path| hash_at_most(path, max_file_bytes))?;
        Ok(fingerprint(
            hashes.iter().map(|(path, hash)| (path.as_path(), *hash)),
        ))
    }

    /// Parses and validates the files into one config per domain (sorted by domain).
    pub fn parse(&self, merge_domains: bool) -> Result<Vec<DomainConfig>, ConfigError> {
        let configs = self.files.iter().map(|(path, bytes)| {
            let file = path.display().to_string();
            let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Invalid {
                file: file.clone(),
                message: format!("error loading config file: invalid UTF-8: {e}"),
            })?;
            let config = parse_text(&file, text).map_err(|message| ConfigError::Invalid {
                file: file.clone(),
                message,
            })?;
            Ok((file, config))
        });
        by_domain(configs, merge_domains)
    }
}

/// The rules' version from each file's path and content hash, in load order.
fn fingerprint<'p>(files: impl Iterator<Item = (&'p Path, blake3::Hash)>) -> String {
    let mut hasher = blake3::Hasher::new();
    for (path, content) in files {
        let name = path.to_string_lossy();
        hasher.update(&(name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
        hasher.update(content.as_bytes());
    }
    hasher.finalize().to_hex()[..16].to_owned()
}

/// The bytes of the file at `path`, refused when there are more than `max` (read no further than
/// that, so a file that grows while it is read cannot take more).
fn read_at_most(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let file = fs::File::open(path).map_err(|e| format!("cannot read file: {e}"))?;
    // Sized from the file's length (within the cap): grown by doubling, a 30 MB file took 60.
    let expected = file.metadata().map_or(0, |m| m.len().min(max));
    let mut bytes = Vec::with_capacity(usize::try_from(expected).unwrap_or(0).saturating_add(1));
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read file: {e}"))?;
    check_size(bytes.len() as u64, max)?;
    Ok(bytes)
}

/// The content hash of the file at `path`, read through a small buffer, refused as [`read_at_most`]
/// refuses it.
fn hash_at_most(path: &Path, max: u64) -> Result<blake3::Hash, String> {
    let file = fs::File::open(path).map_err(|e| format!("cannot read file: {e}"))?;
    let mut hasher = blake3::Hasher::new();
    let read = std::io::copy(&mut file.take(max.saturating_add(1)), &mut hasher)
        .map_err(|e| format!("cannot read file: {e}"))?;
    check_size(read, max)?;
    Ok(hasher.finalize())
}

fn check_size(len: u64, max: u64) -> Result<(), String> {
    if len > max {
        return Err(format!(
            "the file is larger than the {max} bytes a rules file may hold: raise \
             TOLLGATE_RULES_MAX_FILE_BYTES, or split the file"
        ));
    }
    Ok(())
}

/// One config per domain (sorted by domain) from validated configs in load order, each with the name
/// its errors carry (a file's path, an xDS config's name). Without `merge_domains` a second config of a
/// domain is an error reported on it; with it, its top-level descriptors join the first's.
pub(super) fn by_domain(
    configs: impl IntoIterator<Item = Result<(String, DomainConfig), ConfigError>>,
    merge_domains: bool,
) -> Result<Vec<DomainConfig>, ConfigError> {
    let mut domains: BTreeMap<String, DomainConfig> = BTreeMap::new();
    for named in configs {
        let (file, config) = named?;
        let invalid = |message: String| ConfigError::Invalid {
            file: file.clone(),
            message,
        };
        match domains.entry(config.domain.clone()) {
            Entry::Vacant(slot) => {
                slot.insert(config);
            }
            Entry::Occupied(_) if !merge_domains => {
                return Err(invalid(format!(
                    "duplicate domain '{}' in config file",
                    config.domain
                )));
            }
            Entry::Occupied(mut slot) => merge(slot.get_mut(), config).map_err(invalid)?,
        }
    }
    Ok(domains.into_values().collect())
}

/// Append `extra`'s top-level descriptors to `base`, applying the sibling checks across files
/// (Go loads the second file into the same descriptor map, so duplicates error the same way).
fn merge(base: &mut DomainConfig, extra: DomainConfig) -> Result<(), String> {
    let mut siblings = Siblings::default();
    for d in base.descriptors.iter().chain(&extra.descriptors) {
        let key = final_key(&d.key, d.value.as_deref());
        siblings.check_duplicate(&key, &format!("{}.{key}", base.domain))?;
        siblings.check_normalisation(&d.key, &d.normalize)?;
    }
    base.all_or_nothing |= extra.all_or_nothing;
    if extra.proxy.is_some() {
        if base.proxy.is_some() {
            return Err(format!(
                "domain '{}' has a proxy block in two files (one file holds it)",
                base.domain
            ));
        }
        base.proxy = extra.proxy;
    }
    base.descriptors.extend(extra.descriptors);
    Ok(())
}

/// What `each` makes of every rules file below `dir`, in load order (a file it fails on fails them
/// all), and the links to directories outside `dir`, not walked.
fn each_file<T>(dir: &Path, each: impl Fn(&Path) -> Result<T, String>) -> Result<EachFile<T>, ConfigError> {
    let mut paths = Vec::new();
    let mut seen = Seen {
        root: fs::canonicalize(dir).ok(),
        ..Seen::default()
    };
    collect(dir, &mut paths, &mut seen)?;
    let files = paths
        .into_iter()
        .map(|path| match each(&path) {
            Ok(value) => Ok((path, value)),
            Err(message) => Err(ConfigError::Invalid {
                file: path.display().to_string(),
                message,
            }),
        })
        .collect::<Result<_, _>>()?;
    Ok((files, seen.outside))
}

/// [`each_file`]'s answer: each file's path and value, and the links not walked.
type EachFile<T> = (Vec<(PathBuf, T)>, Vec<PathBuf>);

/// Canonical paths already visited, so symlink loops terminate and a file or directory reached
/// through two visible links is read once.
#[derive(Default)]
struct Seen {
    /// The rules directory, canonical: no directory outside it is walked.
    root: Option<PathBuf>,
    dirs: HashSet<PathBuf>,
    files: HashSet<PathBuf>,
    /// Links to directories outside `root`, not walked.
    outside: Vec<PathBuf>,
}

/// Depth-first, lexically sorted walk collecting rules files below `dir`.
fn collect(dir: &Path, out: &mut Vec<PathBuf>, seen: &mut Seen) -> Result<(), ConfigError> {
    let io = |source| ConfigError::Io {
        dir: dir.display().to_string(),
        source,
    };
    let mut entries = fs::read_dir(dir)
        .map_err(io)?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    if let Ok(canonical) = fs::canonicalize(dir)
        && !seen.dirs.insert(canonical)
    {
        return Ok(());
    }
    entries.sort();
    for name in entries {
        // Dot entries: hidden files, editor swap files, and the `..data` / `..<timestamp>`
        // directories of Kubernetes ConfigMap volumes (their files are reached via the visible
        // symlinks instead, so each domain is loaded once).
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = dir.join(&name);
        // `fs::metadata` follows symlinks.
        let meta = match fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if is_rules_file(&name) => {
                return Err(ConfigError::Invalid {
                    file: path.display().to_string(),
                    message: format!("cannot read file: {e}"),
                });
            }
            // A dangling link or unreadable entry that would not be loaded anyway.
            Err(_) => continue,
        };
        if meta.is_dir() {
            let canonical = fs::canonicalize(&path).ok();
            let inside = match (&seen.root, &canonical) {
                (Some(root), Some(canonical)) => canonical.starts_with(root),
                _ => true,
            };
            if inside {
                collect(&path, out, seen)?;
            } else {
                seen.outside.push(path);
            }
        } else if meta.is_file() && is_rules_file(&name) {
            let first_time = fs::canonicalize(&path)
                .map(|c| seen.files.insert(c))
                .unwrap_or(true);
            if first_time {
                if out.len() == MAX_RULES_FILES {
                    return Err(ConfigError::Invalid {
                        file: dir.display().to_string(),
                        message: format!("more than {MAX_RULES_FILES} rules files below the rules directory"),
                    });
                }
                out.push(path);
            }
        }
    }
    Ok(())
}

fn is_rules_file(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.ends_with(".yaml") || name.ends_with(".yml")
}

// Symlinks are part of the layouts under test (Kubernetes ConfigMap volumes).
#[cfg(all(test, unix))]
mod tests {
    use super::super::{ConfigError, load_dir};
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    fn write(dir: &Path, rel: &str, text: &str) {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("mkdir");
        }
        fs::write(path, text).expect("write");
    }

    fn rules(domain: &str, key: &str) -> String {
        format!(
            "domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        )
    }

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().expect("tempdir")
    }

    fn load_err(dir: &Path, merge: bool) -> String {
        match load_dir(dir, merge) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_file_over_the_size_cap_is_refused_naming_the_setting() {
        let tmp = tempdir();
        let text = rules("d", "k");
        write(tmp.path(), "d.yaml", &text);
        let len = text.len() as u64;
        assert!(
            super::Snapshot::read(tmp.path(), len).is_ok(),
            "exactly at the cap"
        );
        let error = super::Snapshot::read(tmp.path(), len - 1)
            .expect_err("over the cap")
            .to_string();
        assert!(
            error.contains("d.yaml") && error.contains("TOLLGATE_RULES_MAX_FILE_BYTES"),
            "{error}"
        );
    }

    /// A poll's fingerprint, hashed as the files are read, is the fingerprint of what a load reads: else
    /// every poll would see a change.
    #[test]
    fn a_poll_fingerprints_what_a_load_reads() {
        let tmp = tempdir();
        write(tmp.path(), "a.yaml", &rules("a", "k"));
        write(tmp.path(), "sub/b.yml", &rules("b", "k"));
        let max = super::DEFAULT_MAX_FILE_BYTES;
        let read = || {
            super::Snapshot::read(tmp.path(), max)
                .expect("reads")
                .fingerprint()
        };
        let polled = || super::Snapshot::fingerprint_of(tmp.path(), max).expect("hashes");
        let before = polled();
        assert_eq!(before, read());
        write(tmp.path(), "sub/b.yml", &rules("b", "j"));
        assert_ne!(polled(), before, "a changed file changes it");
        assert_eq!(polled(), read());
        // Moving bytes from one file to the next changes it too.
        let (a, b) = (rules("a", "k"), rules("b", "j"));
        let whole = polled();
        write(tmp.path(), "a.yaml", &format!("{a}{}", &b[..4]));
        write(tmp.path(), "sub/b.yml", &b[4..]);
        assert_ne!(polled(), whole);
        assert_eq!(polled(), read());
        let len = std::fs::metadata(tmp.path().join("a.yaml"))
            .expect("a.yaml")
            .len();
        let error = super::Snapshot::fingerprint_of(tmp.path(), len - 1).expect_err("over the cap");
        assert!(
            error.to_string().contains("TOLLGATE_RULES_MAX_FILE_BYTES"),
            "{error}"
        );
    }

    #[test]
    fn empty_directory() {
        let tmp = tempdir();
        assert_eq!(load_dir(tmp.path(), false).ok(), Some(vec![]));
    }

    #[test]
    fn missing_directory_is_io_error() {
        let tmp = tempdir();
        let missing = tmp.path().join("nope");
        let e = load_dir(&missing, false);
        assert!(matches!(e, Err(ConfigError::Io { ref dir, .. }) if *dir == missing.display().to_string()));
        let msg = load_err(&missing, false);
        assert!(msg.starts_with(&format!("{}: cannot read config directory: ", missing.display())));
    }

    #[test]
    fn kubernetes_configmap_layout_loads_each_domain_once() {
        let tmp = tempdir();
        let root = tmp.path();
        write(root, "..2024_01_01_00_00_00.123/rl.yaml", &rules("cm", "k"));
        symlink("..2024_01_01_00_00_00.123", root.join("..data")).expect("symlink");
        symlink("..data/rl.yaml", root.join("rl.yaml")).expect("symlink");
        let configs = load_dir(root, false).expect("load");
        assert_eq!(configs.len(), 1);
        assert_eq!(configs[0].domain, "cm");
        assert_eq!(configs[0].file, root.join("rl.yaml").display().to_string());
    }

    #[test]
    fn dotfiles_swap_files_and_other_extensions_are_ignored() {
        let tmp = tempdir();
        let root = tmp.path();
        write(root, "rl.yaml", &rules("a", "k"));
        write(root, ".rl.yaml.swp", "garbage: [");
        write(root, ".hidden.yaml", &rules("a", "k"));
        write(root, "rl.yaml~", "garbage: [");
        write(root, "rl.yaml.swp", "garbage: [");
        write(root, "README.md", "# notes");
        write(root, ".git/config.yaml", "garbage: [");
        let configs = load_dir(root, false).expect("load");
        assert_eq!(configs.len(), 1);
        assert_eq!(configs[0].domain, "a");
    }

    #[test]
    fn recursive_sorted_by_domain_with_paths_as_found() {
        let tmp = tempdir();
        let root = tmp.path();
        write(root, "a.yaml", &rules("zeta", "k"));
        write(root, "sub/b.yml", &rules("alpha", "k"));
        write(root, "sub/deeper/c.yaml", "domain: mid\n");
        let configs = load_dir(root, false).expect("load");
        let names: Vec<_> = configs
            .iter()
            .map(|c| (c.domain.as_str(), c.file.clone()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("alpha", root.join("sub/b.yml").display().to_string()),
                ("mid", root.join("sub/deeper/c.yaml").display().to_string()),
                ("zeta", root.join("a.yaml").display().to_string()),
            ]
        );
    }

    #[test]
    fn invalid_file_is_reported_with_its_path() {
        let tmp = tempdir();
        let root = tmp.path();
        write(root, "a.yaml", &rules("a", "k"));
        write(
            root,
            "sub/bad.yaml",
            "domain: b\ndescriptors:\n  - key: k\n    ratelimit: {}\n",
        );
        assert_eq!(
            load_err(root, false),
            format!(
                "{}: config error, unknown key 'ratelimit'",
                root.join("sub/bad.yaml").display()
            )
        );
    }

    #[test]
    fn duplicate_domain_without_merge() {
        let tmp = tempdir();
        let root = tmp.path();
        write(root, "a.yaml", &rules("d", "k1"));
        write(root, "b.yaml", &rules("d", "k2"));
        assert_eq!(
            load_err(root, false),
            format!(
                "{}: duplicate domain 'd' in config file",
                root.join("b.yaml").display()
            )
        );
    }

    #[test]
    fn merge_concatenates_in_file_order() {
        let tmp = tempdir();
        let root = tmp.path();
        write(root, "a.yaml", &rules("d", "k1"));
        write(
            root,
            "b.yaml",
            &format!("{}all_or_nothing: true\n", rules("d", "k2")),
        );
        write(root, "c.yaml", &rules("other", "k1"));
        let configs = load_dir(root, true).expect("load");
        assert_eq!(configs.len(), 2);
        let d = &configs[0];
        assert_eq!(d.domain, "d");
        assert_eq!(d.file, root.join("a.yaml").display().to_string());
        assert!(d.all_or_nothing);
        let keys: Vec<_> = d.descriptors.iter().map(|x| x.key.as_str()).collect();
        assert_eq!(keys, vec!["k1", "k2"]);
    }

    #[test]
    fn merge_rejects_duplicate_keys_across_files() {
        let tmp = tempdir();
        let root = tmp.path();
        write(root, "a.yaml", &rules("d", "k1"));
        write(root, "b.yaml", &rules("d", "k1"));
        assert_eq!(
            load_err(root, true),
            format!(
                "{}: duplicate descriptor composite key 'd.k1'",
                root.join("b.yaml").display()
            )
        );
    }

    #[test]
    fn merge_rejects_conflicting_normalisation_across_files() {
        let tmp = tempdir();
        let root = tmp.path();
        write(
            root,
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: u\n    lowercase: true\n",
        );
        write(
            root,
            "b.yaml",
            "domain: d\ndescriptors:\n  - key: u\n    value: x\n    trim: true\n",
        );
        assert_eq!(
            load_err(root, true),
            format!(
                "{}: conflicting value normalisation for key 'u'",
                root.join("b.yaml").display()
            )
        );
    }

    #[test]
    fn links_to_directories_outside_the_rules_directory_are_not_walked() {
        let tmp = tempdir();
        let outside = tempdir();
        write(outside.path(), "elsewhere.yaml", &rules("other", "k"));
        write(outside.path(), "shared.yaml", &rules("shared", "k"));
        let root = tmp.path().join("rules");
        write(&root, "a.yaml", &rules("d", "k"));
        symlink("/", root.join("slash")).expect("symlink");
        symlink(outside.path(), root.join("away")).expect("symlink");
        // A link to a file is followed wherever it points.
        symlink(outside.path().join("shared.yaml"), root.join("shared.yaml")).expect("symlink");
        let snapshot = super::Snapshot::read(&root, super::DEFAULT_MAX_FILE_BYTES).expect("reads");
        assert_eq!(snapshot.skipped(), [root.join("away"), root.join("slash")]);
        let domains: Vec<String> = snapshot
            .parse(false)
            .expect("parses")
            .into_iter()
            .map(|c| c.domain)
            .collect();
        assert_eq!(domains, ["d", "shared"]);
    }

    #[test]
    fn symlink_loops_and_aliases_are_read_once() {
        let tmp = tempdir();
        let root = tmp.path();
        write(root, "rules/a.yaml", &rules("d", "k"));
        symlink(".", root.join("rules/loop")).expect("symlink");
        symlink("rules", root.join("alias")).expect("symlink");
        symlink("rules/a.yaml", root.join("z.yaml")).expect("symlink");
        let configs = load_dir(root, false).expect("load");
        assert_eq!(configs.len(), 1);
        // The first path in walk order wins.
        assert_eq!(configs[0].file, root.join("alias/a.yaml").display().to_string());
    }

    #[test]
    fn dangling_links() {
        let tmp = tempdir();
        let root = tmp.path();
        write(root, "a.yaml", &rules("d", "k"));
        symlink("missing.txt", root.join("notes.txt")).expect("symlink");
        assert_eq!(load_dir(root, false).map(|c| c.len()).ok(), Some(1));
        symlink("missing.yaml", root.join("b.yaml")).expect("symlink");
        let e = load_err(root, false);
        assert!(
            e.starts_with(&format!("{}: cannot read file: ", root.join("b.yaml").display())),
            "{e}"
        );
    }

    #[test]
    fn non_utf8_file() {
        let tmp = tempdir();
        fs::write(tmp.path().join("a.yaml"), b"domain: \xff\n").expect("write");
        let e = load_err(tmp.path(), false);
        assert!(e.contains("error loading config file: invalid UTF-8"), "{e}");
    }
}
