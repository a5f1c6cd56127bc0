//! The batch script: one Lua program that decides a whole request inside Redis.
//!
//! The program is `lua/exact.lua` (exact integer helpers), the five algorithm files and
//! `lua/batch.lua` (the driver, which defines `tollgate_batch(keys, args)`), concatenated at compile
//! time, so one call handles a request whatever mix of algorithms it has. It reproduces
//! [`crate::algorithm::decide`] and the batch semantics of [`crate::store::memory::MemoryStore`]
//! exactly (sequential duplicate keys, settling per [`CommitPolicy`], zero-cost items and
//! [`CommitPolicy::Peek`] batches never write, [`CommitPolicy::Refund`] writes only keys that hold state);
//! `tests/it/redis_parity.rs` checks that against a real server. The header of `lua/batch.lua`
//! documents KEYS, ARGV and the reply; [`BatchScript::call`] (with its helpers) and
//! [`BatchScript::decode`] are the only code that knows that layout.
//!
//! How it runs (measured: docs/performance.md, "Redis CPU per decision: measured"):
//! - **Redis Function (Redis ≥ 7.0).** The program is loaded once as a function library
//!   ([`BatchScript::library`], `FUNCTION LOAD REPLACE`) and each call is one `FCALL`. Loading runs the
//!   chunk, and with it the creation of every helper, once; a call then only runs `tollgate_batch`. The
//!   library and function names carry a hash of the code, so two Tollgate versions sharing a Redis never
//!   replace each other's function. When a call meets `ERR Function not found` (a Redis restarted
//!   without persistence, `FUNCTION FLUSH`, a failover to a node without the library), the library is
//!   loaded on the connection the call used and the call retried (up to `MAX_LOADS` loads, in case
//!   another flush lands in between); in Redis Cluster the load goes to every master (redis-rs routes
//!   `FUNCTION LOAD` so) and the retry reaches the key's node.
//! - **EVAL fallback (Redis 6.2).** The first `ERR unknown command` for `FCALL` switches this
//!   [`BatchScript`] to `EVALSHA` of the same program for good (NOSCRIPT: load and retry once).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::ConnectionLike;

pub use super::link::ReplyError;
use crate::algorithm::{Algorithm, Decision, Limit};
use crate::store::CommitPolicy;
use crate::store::hot_keys::ReserveRequest;

/// The Lua files in load order, concatenated with `extra` text after them: the shared helpers, every
/// algorithm, then the driver (which must come last: it refers to the functions defined before it).
macro_rules! program {
    ($($extra:expr),*) => {
        concat!(
            include_str!("../../../lua/exact.lua"), "\n",
            include_str!("../../../lua/fixed_window.lua"), "\n",
            include_str!("../../../lua/sliding_window.lua"), "\n",
            include_str!("../../../lua/sliding_log.lua"), "\n",
            include_str!("../../../lua/token_bucket.lua"), "\n",
            include_str!("../../../lua/gcra.lua"), "\n",
            include_str!("../../../lua/batch.lua"),
            $($extra),*
        )
    };
}

/// The program. It defines `tollgate_batch` and runs nothing; see [`BatchScript::library`] and the EVAL
/// form for the line that exposes it.
pub const SOURCE: &str = program!();

/// The EVAL form: the program, then a call of the driver with EVAL's globals.
const EVAL_SOURCE: &str = program!("\nreturn tollgate_batch(KEYS, ARGV)\n");

/// Bytes per distinct limit in `ARGV[2]`: four little-endian `u64`s.
const LIMIT_BYTES: usize = 32;

/// Bytes per item in `ARGV[3]`: five little-endian `u64`s.
const ITEM_BYTES: usize = 40;

/// Bytes per item in the script's reply: `allowed`, then three little-endian doubles.
const REPLY_ITEM_BYTES: usize = 25;

/// Library loads one call may make before giving up. One suffices unless another `FUNCTION FLUSH` lands
/// between the load and the retry (a burst of flushes under load); a few more make that harmless.
const MAX_LOADS: u32 = 3;

/// One item of a batch, as the script sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptItem<'a> {
    /// The Redis key (`KEYS[i]`). For a fixed window, the caller-named counter of the window starting
    /// at `window_start_us` (envoyproxy/ratelimit's key); otherwise the key holding the state.
    pub key: &'a str,
    /// The limit to enforce.
    pub limit: Limit,
    /// Units to consume; 0 checks without consuming (and never writes). Under [`CommitPolicy::Refund`],
    /// units to give back.
    pub cost: u64,
    /// Items with the same group are contiguous and pass or fail together (see [`crate::store::BatchItem`]).
    pub group: u32,
    /// Fixed window only (else 0): the first µs of the window `key` counts, on the Redis clock as the
    /// caller estimates it. `reset_after_us` is measured to its end.
    pub window_start_us: u64,
    /// Fixed window only (else 0): the counter's `EXPIRE` in seconds (Go: window + jitter); at least 1 is
    /// used. A refund keeps the counter's TTL instead.
    pub ttl_secs: u64,
}

/// The single-use markers of a refund batch (see [`crate::store::RefundOnce`]): one Redis key per item,
/// in its item's slot, sent after the items' keys; the script claims each with `SET NX PX ttl_ms` in
/// the same call and refunds only the items whose marker it claimed.
#[derive(Debug, Clone, Copy)]
pub struct Markers<'a> {
    /// One marker key per item, in batch order (items of one descriptor share theirs).
    pub keys: &'a [&'a str],
    /// How long a claimed marker lives, in ms (at least 1).
    pub ttl_ms: u64,
}

/// A hot-key reservation (`lua/batch.lua`, policy 5): the call's single item is decided with a slice
/// of extra units for the replica to admit from locally, after giving back units it holds. Its
/// reservers hash is sent after the item's key, in the same slot.
#[derive(Debug, Clone, Copy)]
pub struct Reservation<'a> {
    /// The key's reservers hash (one field per replica holding units of the key).
    pub reservers: &'a str,
    /// What to give back and ask for, by whom, for how long.
    pub request: ReserveRequest<'a>,
}

/// What a call sends after its items' keys and arguments.
#[derive(Debug, Clone, Copy, Default)]
pub enum Tail<'a> {
    /// Nothing: a plain batch.
    #[default]
    None,
    /// A refund token's single-use markers.
    Markers(Markers<'a>),
    /// A hot-key reservation (policy 5 whatever the batch's policy).
    Reserve(Reservation<'a>),
}

impl<'a> From<Option<Markers<'a>>> for Tail<'a> {
    fn from(markers: Option<Markers<'a>>) -> Self {
        markers.map_or(Tail::None, Tail::Markers)
    }
}

impl Tail<'_> {
    /// The policy code the script runs (`ARGV[1]`).
    fn policy_code(&self, policy: CommitPolicy) -> u8 {
        match self {
            Tail::Reserve(_) => 5,
            _ => policy_code(policy),
        }
    }

    /// The keys sent after the items'.
    fn keys(&self) -> &[&str] {
        match self {
            Tail::None => &[],
            Tail::Markers(markers) => markers.keys,
            Tail::Reserve(reservation) => std::slice::from_ref(&reservation.reservers),
        }
    }

    /// The arguments sent after the items'.
    fn args(&self) -> Vec<String> {
        match self {
            Tail::None => Vec::new(),
            Tail::Markers(markers) => vec![markers.ttl_ms.max(1).to_string()],
            Tail::Reserve(Reservation { request: r, .. }) => {
                let lease_ms = r.lease_us.div_ceil(1_000).max(1);
                vec![
                    r.want.to_string(),
                    r.give_back.to_string(),
                    r.replica.to_owned(),
                    lease_ms.to_string(),
                    // The hash only counts reservers: it must outlive every lease in it.
                    lease_ms.saturating_mul(2).to_string(),
                ]
            }
        }
    }
}

/// The decisions of one script call and the Redis clock reading it used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptReply {
    /// The Redis server's `TIME` when the script ran, in µs since the epoch: every decision was made at
    /// this instant. The caller tracks its clock offset from it to name fixed-window keys.
    pub now_us: u64,
    /// One decision per item, in batch order.
    pub decisions: Vec<Decision>,
    /// The items whose key held a value no Tollgate could have written (`lua/exact.lua`): decided as
    /// from no state, and the value removed or overwritten (unless the call was a peek).
    pub impossible: Vec<usize>,
}

/// A reservation's reply (see [`BatchScript::decode_reserved`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedReply {
    /// The decision of the reservation's item, as any call's.
    pub reply: ScriptReply,
    /// Units granted beyond the item's cost.
    pub extra: u64,
    /// The key's reservers hash held what no Tollgate writes (another type, more fields than reservers
    /// are admitted, no TTL) and was removed.
    pub reservers_repaired: bool,
}

/// The flag of a reservation's item whose reservers hash was removed (`lua/batch.lua`).
const RESERVERS_REPAIRED: u8 = 4;

/// The batch script (all algorithms + driver): a Redis Function library, or an EVAL script on servers
/// without functions.
#[derive(Clone)]
pub struct BatchScript {
    /// The EVAL form, hashed once; its SHA also names the library and the function.
    script: redis::Script,
    /// `FUNCTION LOAD` source.
    library: String,
    /// The function `FCALL` calls.
    function: String,
    /// Whether to use `FCALL`; cleared for good when the server does not know it (Redis < 7.0).
    functions: Arc<AtomicBool>,
    /// Held while the library is being loaded, so a burst of requests meeting "Function not found"
    /// (after a restart or `FUNCTION FLUSH`) loads it once instead of once per request.
    loading: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for BatchScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The source is long and fixed; the names identify it.
        f.debug_struct("BatchScript")
            .field("function", &self.function)
            .field("sha", &self.sha())
            .field("functions", &self.functions.load(Ordering::Relaxed))
            .finish()
    }
}

impl Default for BatchScript {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchScript {
    /// The script, hashed once; calls use `FCALL` until the server turns out not to know it.
    pub fn new() -> Self {
        let script = redis::Script::new(EVAL_SOURCE);
        // 16 hex digits (64 bits) of the code's SHA1 tell versions apart.
        let version = script.get_hash()[..16].to_owned();
        let function = format!("tollgate_batch_{version}");
        let library = format!(
            "#!lua name=tollgate_{version}\n{SOURCE}\nredis.register_function('{function}', tollgate_batch)\n"
        );
        Self {
            script,
            library,
            function,
            functions: Arc::new(AtomicBool::new(true)),
            loading: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Loads the library (at connect, so the first requests never meet "Function not found"). On a
    /// server without functions (Redis < 7.0) this switches to `EVALSHA` for good.
    pub async fn preload<C: ConnectionLike + Send>(&self, conn: &mut C) -> redis::RedisResult<()> {
        if !self.functions.load(Ordering::Relaxed) {
            return Ok(());
        }
        let load = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.library)
            .query_async(conn)
            .await;
        match load {
            Ok(redis::Value::Nil) | Ok(_) => Ok(()),
            Err(error) if is_err_detail(&error, "unknown command") => {
                tracing::info!("Redis has no functions (older than 7.0): using EVALSHA");
                self.functions.store(false, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// The same script, but always sent as `EVALSHA` (as on servers without functions). For tests of
    /// that path on a server that has functions.
    pub fn eval_only() -> Self {
        let script = Self::new();
        script.functions.store(false, Ordering::Relaxed);
        script
    }

    /// Whether the server runs functions (Redis 7.0 or newer) as far as calls have shown.
    pub fn has_functions(&self) -> bool {
        self.functions.load(Ordering::Relaxed)
    }

    /// The SHA1 of the EVAL form (what `EVALSHA` uses).
    pub fn sha(&self) -> &str {
        self.script.get_hash()
    }

    /// The name `FCALL` calls (`tollgate_batch_<16 hex digits of the SHA>`).
    pub fn function(&self) -> &str {
        &self.function
    }

    /// The function library's source, as `FUNCTION LOAD` takes it.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The `FCALL` command of one batch, to send as it is (a pipeline of them, in a Redis Cluster) when
    /// [`BatchScript::has_functions`]; its reply decodes with [`BatchScript::decode`].
    pub fn fcall(&self, items: &[ScriptItem<'_>], policy: CommitPolicy, tail: Tail<'_>) -> redis::Cmd {
        let mut fcall = redis::cmd("FCALL");
        let tail_keys = tail.keys();
        fcall.arg(&self.function).arg(items.len() + tail_keys.len());
        for item in items {
            fcall.arg(item.key);
        }
        for key in tail_keys {
            fcall.arg(*key);
        }
        let (limits, fields) = pack_items(items);
        fcall.arg(tail.policy_code(policy)).arg(limits).arg(fields);
        for arg in tail.args() {
            fcall.arg(arg);
        }
        fcall
    }

    /// Runs one batch and returns the raw reply (see [`BatchScript::decode`]; a reservation's decodes
    /// with [`BatchScript::decode_reserved`]); a refund may claim markers (see [`Markers`]). `FCALL`,
    /// and on `Function not found` a `FUNCTION LOAD REPLACE` and a retry (up to `MAX_LOADS` times); on
    /// a server without `FCALL`, `EVALSHA` from then on (NOSCRIPT: one `SCRIPT LOAD` and one retry).
    pub async fn call<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        items: &[ScriptItem<'_>],
        policy: CommitPolicy,
        tail: Tail<'_>,
    ) -> redis::RedisResult<redis::Value> {
        if self.functions.load(Ordering::Relaxed) {
            let fcall = self.fcall(items, policy, tail);
            let mut loads = 0;
            loop {
                match fcall.query_async(conn).await {
                    Err(error) if loads < MAX_LOADS && is_err_detail(&error, "Function not found") => {
                        loads += 1;
                        // One loader at a time; whoever waited retries first, as the library is
                        // usually there by then. (A lock across an await, but only on this cold
                        // path after a restart or FUNCTION FLUSH, never on the request path.)
                        let _loading = self.loading.lock().await;
                        match fcall.query_async(conn).await {
                            Err(error) if is_err_detail(&error, "Function not found") => {
                                redis::cmd("FUNCTION")
                                    .arg("LOAD")
                                    .arg("REPLACE")
                                    .arg(&self.library)
                                    .query_async::<redis::Value>(conn)
                                    .await?;
                            }
                            other => return other,
                        }
                    }
                    Err(error) if loads == 0 && is_err_detail(&error, "unknown command") => {
                        tracing::info!("Redis has no FCALL (older than 7.0): using EVALSHA");
                        self.functions.store(false, Ordering::Relaxed);
                        break;
                    }
                    other => return other,
                }
            }
        }
        self.invocation(items, policy, tail).invoke_async(conn).await
    }

    /// KEYS and ARGV of the EVAL form for one batch. [`redis::ScriptInvocation::invoke_async`] sends
    /// `EVALSHA` and, on `NOSCRIPT` (after a Redis restart or `SCRIPT FLUSH`), loads the script and
    /// retries once. [`BatchScript::call`] uses it only on servers without functions.
    pub fn invocation(
        &self,
        items: &[ScriptItem<'_>],
        policy: CommitPolicy,
        tail: Tail<'_>,
    ) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.script.prepare_invoke();
        for item in items {
            invocation.key(item.key);
        }
        for key in tail.keys() {
            invocation.key(*key);
        }
        let (limits, fields) = pack_items(items);
        invocation.arg(tail.policy_code(policy)).arg(limits).arg(fields);
        for arg in tail.args() {
            invocation.arg(arg);
        }
        invocation
    }

    /// Decodes a reservation's reply (see `lua/batch.lua`): its one decision, the extra units granted
    /// beyond the item's cost, and whether the key's reservers hash was found crafted and removed.
    pub fn decode_reserved(reply: redis::Value) -> Result<ReservedReply, ReplyError> {
        let mut bytes = bulk_bytes(reply)?;
        let extra_at = 8 + REPLY_ITEM_BYTES;
        if bytes.len() != extra_at + 8 {
            return Err(ReplyError::WrongLength {
                expected: extra_at + 8,
                got: bytes.len(),
            });
        }
        let extra = double_at(&bytes, extra_at);
        bytes.truncate(extra_at);
        // Bit 2 of the item's flags, a reservation's own; the others decode as any item's.
        let reservers_repaired = bytes[8] & RESERVERS_REPAIRED != 0;
        bytes[8] &= !RESERVERS_REPAIRED;
        Ok(ReservedReply {
            reply: Self::decode_bytes(bytes, 1)?,
            extra,
            reservers_repaired,
        })
    }

    /// Decodes the script's reply for `items` items: `8 + 25 × items` bytes (see `lua/batch.lua`).
    pub fn decode(reply: redis::Value, items: usize) -> Result<ScriptReply, ReplyError> {
        Self::decode_bytes(bulk_bytes(reply)?, items)
    }

    fn decode_bytes(bytes: Vec<u8>, items: usize) -> Result<ScriptReply, ReplyError> {
        let expected = items.checked_mul(REPLY_ITEM_BYTES).and_then(|n| n.checked_add(8));
        if expected != Some(bytes.len()) {
            return Err(ReplyError::WrongLength {
                expected: expected.unwrap_or(usize::MAX),
                got: bytes.len(),
            });
        }
        let (now, rest) = bytes.split_at(8);
        let mut decisions = Vec::with_capacity(items);
        let mut impossible = Vec::new();
        for (index, item) in rest.chunks_exact(REPLY_ITEM_BYTES).enumerate() {
            // Bit 0: allowed; bit 1: the key held an impossible value.
            let flags = item[0];
            if flags > 3 {
                return Err(ReplyError::BadValue {
                    index,
                    value: format!("flags = {flags}"),
                });
            }
            if flags & 2 != 0 {
                impossible.push(index);
            }
            let allowed = flags & 1 != 0;
            decisions.push(Decision {
                allowed,
                remaining: double_at(item, 1),
                reset_after_us: double_at(item, 9),
                retry_after_us: double_at(item, 17),
                from_local_cache: false,
                from_slice: false,
            });
        }
        Ok(ScriptReply {
            now_us: double_at(now, 0),
            decisions,
            impossible,
        })
    }
}

/// The bytes of a reply that must be a bulk string (the script's).
fn bulk_bytes(reply: redis::Value) -> Result<Vec<u8>, ReplyError> {
    match reply {
        redis::Value::BulkString(bytes) => Ok(bytes),
        other => Err(ReplyError::WrongType(format!("{other:?}"))),
    }
}

/// `ARGV[2]` and `ARGV[3]` (see `lua/batch.lua`): each distinct limit of the batch once (algorithm,
/// requests, window, burst), then per item the 1-based index of its limit, its cost, group, window
/// start and TTL; all little-endian `u64`s (the script's `struct.unpack` rounds each to the nearest
/// double). A batch's items mostly share a few limits, and the script pays per field it unpacks.
fn pack_items(items: &[ScriptItem<'_>]) -> (Vec<u8>, Vec<u8>) {
    let mut index_of: HashMap<Limit, u64> = HashMap::new();
    let mut limits = Vec::with_capacity(LIMIT_BYTES);
    let mut fields = Vec::with_capacity(items.len() * ITEM_BYTES);
    for item in items {
        let next = index_of.len() as u64 + 1;
        let index = *index_of.entry(item.limit).or_insert_with(|| {
            for field in [
                u64::from(algorithm_code(item.limit.algorithm)),
                item.limit.requests,
                item.limit.window_us,
                item.limit.burst,
            ] {
                limits.extend_from_slice(&field.to_le_bytes());
            }
            next
        });
        for field in [
            index,
            item.cost,
            u64::from(item.group),
            item.window_start_us,
            item.ttl_secs,
        ] {
            fields.extend_from_slice(&field.to_le_bytes());
        }
    }
    (limits, fields)
}

/// Whether `error` is a plain `ERR` reply whose text starts with `detail`.
fn is_err_detail(error: &redis::RedisError, detail: &str) -> bool {
    error.code() == Some("ERR") && error.detail().is_some_and(|d| d.starts_with(detail))
}

/// The policy code `lua/batch.lua` expects in `ARGV[1]`. The `all_or_nothing` of a peek or refund only
/// decides key names (the caller's business), so the script does not need it.
fn policy_code(policy: CommitPolicy) -> u8 {
    match policy {
        CommitPolicy::Independent => 0,
        CommitPolicy::AllOrNothing => 1,
        CommitPolicy::StopIncrementWhenOverLimit => 2,
        CommitPolicy::Peek => 3,
        CommitPolicy::Refund => 4,
    }
}

/// The algorithm code `lua/batch.lua` dispatches on.
fn algorithm_code(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::FixedWindow => 0,
        Algorithm::SlidingWindow => 1,
        Algorithm::SlidingLog => 2,
        Algorithm::TokenBucket => 3,
        Algorithm::Gcra => 4,
    }
}

/// The little-endian double at `at` in `bytes` as a `u64`. Values are integers, exact below 2^53;
/// `as` saturates beyond `u64::MAX`, as the Rust algorithms do, and maps a negative or NaN value
/// (which the script never sends) to 0.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn double_at(bytes: &[u8], at: usize) -> u64 {
    let mut double = [0; 8];
    double.copy_from_slice(&bytes[at..at + 8]);
    f64::from_le_bytes(double) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    /// A reply as the script packs it: `now`, then per item `allowed` and three doubles.
    fn reply(now: f64, items: &[(u8, [f64; 3])]) -> Value {
        let mut bytes = now.to_le_bytes().to_vec();
        for (allowed, values) in items {
            bytes.push(*allowed);
            for value in values {
                bytes.extend_from_slice(&value.to_le_bytes());
            }
        }
        Value::BulkString(bytes)
    }

    #[test]
    fn a_reservations_reply_ends_with_the_extra_units_and_nothing_else() {
        let Value::BulkString(mut bytes) = reply(5.0, &[(1, [7.0, 1.0, 0.0])]) else {
            unreachable!("reply() builds a bulk string")
        };
        assert!(BatchScript::decode_reserved(Value::BulkString(bytes.clone())).is_err());
        bytes.extend_from_slice(&42.0f64.to_le_bytes());
        let decoded = BatchScript::decode_reserved(Value::BulkString(bytes.clone())).expect("valid");
        assert_eq!(
            (
                decoded.reply.now_us,
                decoded.reply.decisions[0].remaining,
                decoded.extra
            ),
            (5, 7, 42)
        );
        assert!(!decoded.reservers_repaired);
        // Flags 7: allowed, the key repaired, the reservers hash repaired.
        bytes[8] = 7;
        let decoded = BatchScript::decode_reserved(Value::BulkString(bytes.clone())).expect("valid");
        assert!(decoded.reservers_repaired && decoded.reply.decisions[0].allowed);
        assert_eq!(decoded.reply.impossible, [0]);
        bytes[8] = 8;
        assert!(BatchScript::decode_reserved(Value::BulkString(bytes.clone())).is_err());
        bytes[8] = 1;
        bytes.push(0);
        assert!(BatchScript::decode_reserved(Value::BulkString(bytes)).is_err());
    }

    #[test]
    fn decodes_doubles_saturating_as_the_rust_algorithms_do() {
        let got = BatchScript::decode(
            reply(
                1_700_000_000_000_000.0,
                &[(1, [4.0, 1e30, 0.0]), (0, [0.0, 9_007_199_254_740_993.0, 3.0])],
            ),
            2,
        )
        .expect("valid reply");
        assert_eq!(got.now_us, 1_700_000_000_000_000);
        assert_eq!(
            got.decisions,
            vec![
                Decision {
                    allowed: true,
                    remaining: 4,
                    reset_after_us: u64::MAX,
                    retry_after_us: 0,
                    from_local_cache: false,
                    from_slice: false,
                },
                Decision {
                    allowed: false,
                    remaining: 0,
                    // The double nearest 2^53 + 1, as Lua holds it.
                    reset_after_us: 9_007_199_254_740_992,
                    retry_after_us: 3,
                    from_local_cache: false,
                    from_slice: false,
                }
            ]
        );
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let good = reply(1.0, &[(1, [1.0, 2.0, 3.0])]);
        let Value::BulkString(bytes) = good.clone() else {
            unreachable!("reply() builds a bulk string")
        };
        let bad = [
            (Value::Nil, 0),
            (Value::Okay, 1),
            (Value::Array(vec![Value::Int(1)]), 0),
            (good.clone(), 0),
            (good.clone(), 2),
            (good, usize::MAX),
            (Value::BulkString(bytes[..32].to_vec()), 1),
            (reply(1.0, &[(4, [1.0, 2.0, 3.0])]), 1),
        ];
        for (value, items) in bad {
            assert!(BatchScript::decode(value.clone(), items).is_err(), "{value:?}");
        }
    }

    #[test]
    fn items_whose_key_held_an_impossible_value_are_listed() {
        let flags = [
            (0, [0.0; 3]),
            (3, [9.0, 1.0, 0.0]),
            (1, [8.0, 1.0, 0.0]),
            (2, [0.0, 1.0, 1.0]),
        ];
        let got = BatchScript::decode(reply(1.0, &flags), 4).expect("valid reply");
        assert_eq!(got.impossible, [1, 3]);
        let allowed: Vec<bool> = got.decisions.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [false, true, true, false]);
    }

    #[test]
    fn script_is_the_concatenation_and_hashes_stably() {
        assert!(SOURCE.starts_with("-- exact.lua"));
        assert!(SOURCE.contains("local function gcra_decide"));
        assert!(EVAL_SOURCE.starts_with(SOURCE));
        assert_eq!(BatchScript::new().sha(), BatchScript::new().sha());
        assert_eq!(BatchScript::new().sha().len(), 40);
        let script = BatchScript::new();
        assert_eq!(
            script.function(),
            format!("tollgate_batch_{}", &script.sha()[..16])
        );
        assert!(script.library().starts_with("#!lua name=tollgate_"));
        assert!(
            script
                .library()
                .contains(&format!("register_function('{}'", script.function()))
        );
    }

    #[test]
    fn each_limit_is_packed_once_and_items_name_theirs() {
        let limit = |requests| Limit {
            algorithm: Algorithm::Gcra,
            requests,
            window_us: 1_000_000,
            burst: u64::MAX,
        };
        let item = |requests, cost| ScriptItem {
            key: "k",
            limit: limit(requests),
            cost,
            group: 7,
            window_start_us: 3,
            ttl_secs: 4,
        };
        let (limits, fields) = pack_items(&[item(10, 1), item(20, 2), item(10, 5)]);
        let words = |bytes: &[u8]| -> Vec<u64> {
            bytes
                .chunks_exact(8)
                .map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes")))
                .collect()
        };
        assert_eq!(limits.len(), 2 * LIMIT_BYTES);
        assert_eq!(
            words(&limits),
            [4, 10, 1_000_000, u64::MAX, 4, 20, 1_000_000, u64::MAX]
        );
        assert_eq!(fields.len(), 3 * ITEM_BYTES);
        assert_eq!(words(&fields), [1, 1, 7, 3, 4, 2, 2, 7, 3, 4, 1, 5, 7, 3, 4]);
    }
}
