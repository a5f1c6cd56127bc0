//! Rules files: the envoyproxy/ratelimit YAML format plus Tollgate extensions.
//!
//! A rules file holds one domain and its descriptor tree:
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   - key: path
//!     value: "/api/*"          # '*' makes it a wildcard
//!     rate_limits:             # Tollgate: several windows on one node
//!       - { unit: minute, requests_per_unit: 100, algorithm: gcra, burst: 20 }
//!       - { unit: day, requests_per_unit: 10000 }
//! ```
//!
//! Compatibility with the Go service (its config loader and validation, as docs/rules.md describes them;
//! `tests/it/compat.rs` holds Tollgate to them):
//!
//! - Parsing follows yaml.v2: only the first YAML document is read, YAML 1.1 scalars (`yes`,
//!   `010`), a repeated key keeps its last value, and a non-string scalar in a string field is
//!   kept as spelled (`value: yes` is the string `"yes"`).
//! - Validation messages are Go's, formatted `<file>: <message>`. The key allow-list is flat:
//!   a known key is accepted (and ignored) anywhere; `metadata` contents are free-form.
//! - Extensions (`rate_limits`, `algorithm`, `burst`, `unit_multiplier`, `failure_mode`,
//!   `match`, `lowercase`, `trim`, `ip_prefix`, `hash`, `all_or_nothing`) are validated with
//!   messages that name the key and the descriptor's composite key; the top-level `proxy:` block
//!   (`proxy.rs`) with messages that name its place in the block.
//!
//! Layout: `model` holds the validated types; `yaml` parses to a generic node tree and runs Go's
//! structural checks; `decode` turns the tree into raw descriptors (Go's typed unmarshal);
//! `validate` checks their meaning and builds the model; `stream` does all three per top-level
//! descriptor as the file is parsed, for files that pass; `pieces` does that on several cores for a
//! large file; `load` walks directories. Rules from elsewhere (the server's xDS client) are built as
//! the raw form and validated by [`validate_raw`].

mod decode;
mod load;

pub use load::{DEFAULT_MAX_FILE_BYTES, Snapshot};
mod model;
mod pieces;
mod proxy;
mod stream;
mod validate;
pub(crate) use validate::final_key;
mod yaml;

pub use decode::{RawConcurrency, RawDescriptor, RawLimit, RawRoot};

pub use model::*;

/// Why a rules file or directory was rejected.
///
/// Any error rejects the whole load: callers keep the previously active configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file failed to parse or validate. `message` is the Go-compatible text (e.g.
    /// `config file cannot have empty domain`); `file` is the name given to [`parse_file`] or the
    /// path found by [`load_dir`].
    #[error("{file}: {message}")]
    Invalid {
        /// File name or path, as used in the message.
        file: String,
        /// Message without the file prefix.
        message: String,
    },
    /// A directory could not be listed (missing, not a directory, permission denied).
    #[error("{dir}: cannot read config directory: {source}")]
    Io {
        /// The directory that could not be read.
        dir: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The options rules files are parsed with, for a document of `len` bytes: yaml.v2's spellings and
/// budgets that grow with the size. For tools that read rules files into a form of their own (the
/// server's `xds-serve`), so that a file loads there exactly when it loads here.
pub fn parser_options(len: usize) -> serde_saphyr::Options {
    yaml::options_for(len)
}

/// Parse and validate one file's text. `file` is the name used in error messages.
///
/// Only the first YAML document of `text` is read. The returned config's `file` is `file`.
pub fn parse_file(file: &str, text: &str) -> Result<DomainConfig, ConfigError> {
    parse_text(file, text).map_err(|message| ConfigError::Invalid {
        file: file.to_owned(),
        message,
    })
}

/// Load every rules file below `dir`, validate, and return one DomainConfig per domain (sorted by domain).
/// merge_domains = envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG.
///
/// Discovery: `dir` is walked recursively in lexical order, following symlinks; entries whose
/// name starts with `.` are skipped (hidden files, editor swap files, Kubernetes ConfigMap
/// `..data`/`..<timestamp>` entries); only `*.yaml` and `*.yml` files are read, each at most once
/// even when reachable through several links. File names in errors are `dir` joined with the
/// relative path. Without `merge_domains`, a second file with an already-seen domain is an error
/// reported on that file; with it, top-level descriptors are concatenated in file order and
/// checked for duplicates across files. An empty directory yields `Ok(vec![])`; a missing one
/// an [`ConfigError::Io`].
/// Files larger than [`DEFAULT_MAX_FILE_BYTES`] are refused.
pub fn load_dir(dir: &std::path::Path, merge_domains: bool) -> Result<Vec<DomainConfig>, ConfigError> {
    Snapshot::read(dir, DEFAULT_MAX_FILE_BYTES)?.parse(merge_domains)
}

/// Validates rules that did not come from a file (the server's xDS client builds the raw form from
/// pushed `RateLimitConfig`s): the checks and messages of files, `name` standing where a file name
/// would be. The parts of a [`RawRoot`], its descriptors as an iterator: each is validated and dropped
/// before the next is taken, so a source that converts them as they are taken never holds the raw
/// form of the whole set.
pub fn validate_raw(
    domain: String,
    all_or_nothing: bool,
    descriptors: impl IntoIterator<Item = RawDescriptor>,
    name: &str,
) -> Result<DomainConfig, ConfigError> {
    validate::build_from(domain, all_or_nothing, descriptors, None, name).map_err(|message| {
        ConfigError::Invalid {
            file: name.to_owned(),
            message,
        }
    })
}

/// Validated configs, named, into one config per domain with the per-domain merging of [`load_dir`]
/// (`merge_domains`: `MERGE_DOMAIN_CONFIG`; without it a second config of one domain is an error).
pub fn by_domain(
    named: impl IntoIterator<Item = Result<(String, DomainConfig), ConfigError>>,
    merge_domains: bool,
) -> Result<Vec<DomainConfig>, ConfigError> {
    load::by_domain(named, merge_domains)
}

/// Parses, structurally validates, decodes and semantically validates one file's text. Errors are the
/// bare message; the caller prefixes the file name.
///
/// A valid file is read in one pass that builds each top-level descriptor as it is parsed
/// ([`stream`]); a large one in pieces, one per core ([`pieces`]). A file that fails it is read again
/// whole, in Go's order (so a file with several problems reports the same one first): only a file that
/// fails pays for more than one read.
fn parse_text(file: &str, text: &str) -> Result<DomainConfig, String> {
    match pieces::parse(file, text).or_else(|| stream::parse(file, text)) {
        Some(config) => Ok(config),
        None => parse_text_in_go_order(file, text),
    }
}

/// [`parse_text`] in Go's order: the whole file's keys checked, then decoded, then validated.
fn parse_text_in_go_order(file: &str, text: &str) -> Result<DomainConfig, String> {
    let root = yaml::parse_document(text).map_err(|e| format!("error loading config file: {e}"))?;
    yaml::validate_structure(&root)?;
    // The node tree is the largest thing a load builds (several times the file's size): decoding
    // consumes it, so it is gone before the validated rules are built.
    let raw = decode::decode_root(root).map_err(|e| match e {
        decode::DecodeError::Type(m) => format!("error loading config file: {m}"),
        decode::DecodeError::Metadata(m) => format!("error parsing metadata: {m}"),
        decode::DecodeError::Proxy(m) => m,
    })?;
    validate::build(raw, file)
}
