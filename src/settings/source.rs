//! Where a setting's value comes from, and how its text becomes a typed value.
//!
//! Every setting is read through `Reader::get` with its key, its envoyproxy/ratelimit name and its
//! default, in the section that owns it. The value is the last of, in order: the default, the
//! settings file, the Go variable, the `TOLLGATE_*` variable, the command-line flag. Every layer holds
//! text and every setting parses its text the same way, wherever it came from, so `REDIS_POOL_SIZE=4`,
//! `TOLLGATE_REDIS_POOL_SIZE=4` and `redis_pool_size: 4` in a file mean the same thing, and an error
//! names the setting as the operator wrote it (`REDIS_POOL_SIZE`, `TOLLGATE_REDIS_POOL_SIZE`, or
//! `settings.yaml: redis_pool_size`).
//!
//! The reader also records each setting it is asked for, so the list of settings ([`Entry`]) is the
//! code itself: it names unknown keys and variables with the nearest known one, and a test holds
//! docs/settings.md to it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use tollgate_core::algorithm::Algorithm;

use super::{
    ConfigType, ExtraTags, HeaderStyles, LogFormat, Secret, SettingsError, StatsdProtocol, TraceSampler,
};

/// envoyproxy/ratelimit's name for a setting, if it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Go {
    /// Tollgate's own setting.
    None,
    /// The key in upper case (`shadow_mode` is `SHADOW_MODE`).
    Same,
    /// Another name (`redis_connect_timeout` is `REDIS_TIMEOUT`).
    Named(&'static str),
    /// An address composed of a host and a port variable, either alone replacing its half of the
    /// default (`GRPC_HOST`, `GRPC_PORT`).
    HostPort(&'static str, &'static str),
    /// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, with Go's defaults for the parts not set.
    RuntimeDir,
}

/// One setting, as the sections read it: the list the code defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key: the settings file's name for it, and `TOLLGATE_` + its upper case.
    pub key: String,
    /// envoyproxy/ratelimit's variables for it (none for Tollgate's own settings).
    pub go: Vec<&'static str>,
    /// The default, as text (empty for an empty string; secrets show as empty).
    pub default: String,
}

/// The layers a setting's text may come from, below the defaults.
#[derive(Debug, Default)]
pub(super) struct Sources {
    /// The settings file: its name (for messages) and its keys' values.
    pub(super) file: Option<(String, BTreeMap<String, String>)>,
    /// The process environment (Go names and `TOLLGATE_*`).
    pub(super) env: HashMap<String, String>,
    /// Command-line flags, by key.
    pub(super) flags: BTreeMap<String, String>,
}

/// Reads typed settings out of [`Sources`], recording each one it is asked for.
#[derive(Debug)]
pub(super) struct Reader<'a> {
    sources: &'a Sources,
    /// Every setting read so far, in order.
    pub(super) entries: Vec<Entry>,
    /// Where each setting that was given came from, as its name there (for later messages).
    pub(super) origins: BTreeMap<String, String>,
    /// What reading noticed and did not refuse.
    pub(super) warnings: Vec<String>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(sources: &'a Sources) -> Self {
        Self {
            sources,
            entries: Vec::new(),
            origins: BTreeMap::new(),
            warnings: Vec::new(),
        }
    }

    /// The setting `key` (envoyproxy/ratelimit's `go`), else `default`. A value that does not parse is
    /// an error naming the setting where it was given.
    pub(super) fn get<T: Value>(&mut self, key: &str, go: Go, default: T) -> Result<T, SettingsError> {
        self.entries.push(Entry {
            key: key.to_owned(),
            go: go_names(key, go),
            default: default.show(),
        });
        let Some((origin, text)) = self.given(key, go) else {
            return Ok(default);
        };
        let value = T::parse(&text).map_err(|reason| SettingsError::BadValue {
            name: origin.clone(),
            value: if T::SECRET { "<redacted>".into() } else { text },
            reason,
        })?;
        self.origins.insert(key.to_owned(), origin);
        Ok(value)
    }

    /// The text given for `key` and where, from the highest layer that has it.
    fn given(&mut self, key: &str, go: Go) -> Option<(String, String)> {
        let native = native_name(key);
        if let Some(text) = self.sources.flags.get(key) {
            return Some((format!("--{}", key.replace('_', "-")), text.clone()));
        }
        if let Some(text) = self.sources.env.get(&native) {
            return Some((native, text.clone()));
        }
        if let Some(given) = self.go_value(key, go) {
            return Some(given);
        }
        let (file, values) = self.sources.file.as_ref()?;
        let text = values.get(key)?;
        Some((format!("{file}: {key}"), text.clone()))
    }

    /// The value envoyproxy/ratelimit's variables give `key`, if any.
    fn go_value(&mut self, key: &str, go: Go) -> Option<(String, String)> {
        let env = &self.sources.env;
        match go {
            Go::None => None,
            Go::Same => {
                let name = key.to_ascii_uppercase();
                env.get(&name).map(|text| (name, text.clone()))
            }
            Go::Named(name) => env.get(name).map(|text| (name.to_owned(), text.clone())),
            Go::HostPort(host, port) => {
                let address = host_port(env, host, port, &mut self.warnings)?;
                Some((format!("{host}/{port}"), address))
            }
            Go::RuntimeDir => runtime_dir(env).map(|dir| {
                (
                    "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY".into(),
                    dir.display().to_string(),
                )
            }),
        }
    }
}

/// The `TOLLGATE_*` variable of a key.
pub(super) fn native_name(key: &str) -> String {
    format!("TOLLGATE_{}", key.to_ascii_uppercase())
}

/// The Go variables a setting answers to.
fn go_names(key: &str, go: Go) -> Vec<&'static str> {
    match go {
        Go::None => Vec::new(),
        // Leaked once per setting at startup (about a hundred short names), so the catalogue can hold
        // `&'static str` for every kind of name.
        Go::Same => vec![Box::leak(key.to_ascii_uppercase().into_boxed_str())],
        Go::Named(name) => vec![name],
        Go::HostPort(host, port) => vec![host, port],
        Go::RuntimeDir => vec!["RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"],
    }
}

/// `HOST` and `PORT` style pairs: either one alone overrides only its half of the default address.
fn host_port(
    env: &HashMap<String, String>,
    host: &str,
    port: &str,
    warnings: &mut Vec<String>,
) -> Option<String> {
    // Kubernetes service links set `<SERVICE>_PORT=tcp://10.0.0.1:8081` for a Service named `grpc` (or
    // the like); that is not a port number, and envoyproxy/ratelimit's meaning must not be read into it.
    let p = env.get(port).filter(|p| {
        let numeric = p.parse::<u16>().is_ok();
        if !numeric {
            warnings.push(format!("ignoring {port}={p:?}: not a port number"));
        }
        numeric
    });
    let h = env.get(host);
    if h.is_none() && p.is_none() {
        return None;
    }
    let default_port = match port {
        "GRPC_PORT" => "8081",
        "PORT" => "8080",
        _ => "6070",
    };
    let h = h.map_or("0.0.0.0", String::as_str);
    let p = p.map_or(default_port, String::as_str);
    // An IPv6 literal needs brackets in `host:port` form.
    Some(if h.contains(':') {
        format!("[{h}]:{p}")
    } else {
        format!("{h}:{p}")
    })
}

/// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, when any of them is set.
fn runtime_dir(env: &HashMap<String, String>) -> Option<PathBuf> {
    let keys = ["RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"];
    if keys.iter().all(|k| !env.contains_key(*k)) {
        return None;
    }
    let root = env
        .get(keys[0])
        .map_or("/srv/runtime_data/current", String::as_str);
    let sub = env.get(keys[1]).map_or("", String::as_str);
    let app = env.get(keys[2]).map_or("config", String::as_str);
    Some(Path::new(root).join(sub).join(app))
}

/// A setting's type: how its text parses, and how its default reads in the list of settings.
pub(super) trait Value: Sized {
    /// Whether the value is a secret: never shown, in errors or in the list.
    const SECRET: bool = false;
    /// The value the text stands for, or why it does not parse.
    fn parse(text: &str) -> Result<Self, String>;
    /// The value as text.
    fn show(&self) -> String;
}

/// Types whose text form is their `FromStr` and `Display`.
macro_rules! text_values {
    ($($t:ty),* $(,)?) => {$(
        impl Value for $t {
            fn parse(text: &str) -> Result<Self, String> {
                text.trim().parse().map_err(|e: <$t as FromStr>::Err| e.to_string())
            }
            fn show(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

text_values!(
    u16,
    u32,
    u64,
    usize,
    Algorithm,
    LogFormat,
    TraceSampler,
    HeaderStyles,
    ConfigType,
    StatsdProtocol,
    ExtraTags
);

impl Value for String {
    fn parse(text: &str) -> Result<Self, String> {
        Ok(text.to_owned())
    }
    fn show(&self) -> String {
        self.clone()
    }
}

impl Value for PathBuf {
    fn parse(text: &str) -> Result<Self, String> {
        Ok(PathBuf::from(text))
    }
    fn show(&self) -> String {
        self.display().to_string()
    }
}

impl Value for Secret {
    const SECRET: bool = true;
    fn parse(text: &str) -> Result<Self, String> {
        Ok(Secret::new(text))
    }
    fn show(&self) -> String {
        String::new()
    }
}

impl Value for f64 {
    fn parse(text: &str) -> Result<Self, String> {
        match text.trim().parse::<f64>() {
            Ok(number) if number.is_finite() => Ok(number),
            Ok(_) => Err("expected a finite number".into()),
            Err(error) => Err(error.to_string()),
        }
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl Value for bool {
    /// Go's `strconv.ParseBool` (`1`, `t`, `T`, `TRUE`, `true`, `True` and their false twins), and
    /// `yes`/`no`, `on`/`off` in any case.
    fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
            other => match other.to_ascii_lowercase().as_str() {
                "yes" | "on" | "true" => Ok(true),
                "no" | "off" | "false" => Ok(false),
                _ => Err("expected a boolean (true or false)".into()),
            },
        }
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl Value for Duration {
    /// With units (`1s`, `20ms`, `1m 30s`); Go's forms (`1m30s`, `150us`, `1.5s`) too.
    fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        humantime::parse_duration(text)
            .or_else(|_| go_duration(text).ok_or(()))
            .map_err(|()| format!("expected a duration with a unit, such as 20ms or 1s (got {text:?})"))
    }
    fn show(&self) -> String {
        humantime::format_duration(*self).to_string()
    }
}

/// Go's `time.ParseDuration` forms humantime does not read: decimals (`1.5s`) and `µs`.
fn go_duration(text: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&at| at > 0)?;
        let (number, after) = rest.split_at(number_end);
        let unit_end = after.find(|c: char| c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number.parse::<f64>().ok()? * seconds;
        rest = next;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Reads a settings file: a YAML map of keys to single values. Every key must be a setting of
/// `known`; an unknown one is refused naming the file, the key and the nearest known key.
pub(super) fn read_file(path: &Path, known: &[Entry]) -> Result<BTreeMap<String, String>, SettingsError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| SettingsError::File {
        file: name.clone(),
        reason: error.to_string(),
    })?;
    let values: BTreeMap<String, Scalar> = if text.trim().is_empty() {
        BTreeMap::new()
    } else {
        serde_saphyr::from_str(&text).map_err(|error| SettingsError::File {
            file: name.clone(),
            reason: format!("not a map of settings to values: {error}"),
        })?
    };
    let values: BTreeMap<String, String> = values.into_iter().map(|(k, v)| (k, v.0)).collect();
    if let Some(key) = values.keys().find(|key| !known.iter().any(|e| &e.key == *key)) {
        let keys = known.iter().map(|e| e.key.as_str());
        return Err(SettingsError::UnknownKey {
            file: name,
            key: key.clone(),
            nearest: nearest(key, keys).map(str::to_owned),
        });
    }
    Ok(values)
}

/// One value of a settings file, as text: a string, a number or a boolean (never a list or a map).
struct Scalar(String);

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a single value (a string, a number or a boolean)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_owned()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar(String::new()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The candidate closest to `name` if it is close enough to be a typo of it: the same name in another
/// case, or one or two edits away on a name long enough that this is unlikely to be chance.
pub(super) fn nearest<'k>(name: &str, candidates: impl IntoIterator<Item = &'k str>) -> Option<&'k str> {
    let name_lower = name.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|candidate| {
            (
                edit_distance(&name_lower, &candidate.to_ascii_lowercase()),
                candidate,
            )
        })
        .filter(|(distance, candidate)| {
            let len = name.len().min(candidate.len());
            *distance == 0 || (*distance == 1 && len >= 6) || (*distance == 2 && len >= 10)
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance, by bytes (setting names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_humantime_and_go_forms() {
        for (text, expected) in [
            ("20ms", Duration::from_millis(20)),
            ("1m 30s", Duration::from_secs(90)),
            ("1m30s", Duration::from_secs(90)),
            ("150us", Duration::from_micros(150)),
            ("150µs", Duration::from_micros(150)),
            ("1.5s", Duration::from_millis(1500)),
            ("0s", Duration::ZERO),
        ] {
            assert_eq!(Duration::parse(text), Ok(expected), "{text}");
        }
        for text in ["20", "", "-1s", "1x"] {
            assert!(Duration::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn booleans_read_go_forms_and_words() {
        for text in ["1", "t", "TRUE", "True", "yes", "On", "true"] {
            assert_eq!(bool::parse(text), Ok(true), "{text}");
        }
        for text in ["0", "F", "false", "no", "OFF"] {
            assert_eq!(bool::parse(text), Ok(false), "{text}");
        }
        assert!(bool::parse("maybe").is_err());
    }

    #[test]
    fn near_misses_are_named_and_strangers_are_not() {
        let known = ["REDIS_URL", "REDIS_TYPE", "HOST", "PORT", "SHADOW_MODE"];
        assert_eq!(nearest("REDIS_URl", known), Some("REDIS_URL"));
        assert_eq!(nearest("REDIS_URLS", known), Some("REDIS_URL"));
        assert_eq!(nearest("SHADOW_MOD", known), Some("SHADOW_MODE"));
        for stranger in ["HOME", "PATH", "HOSTNAME", "TERM", "PWD"] {
            assert_eq!(nearest(stranger, known), None, "{stranger}");
        }
    }

    #[test]
    fn the_edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
