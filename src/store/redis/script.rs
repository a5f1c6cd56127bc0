//! The batch script: one Lua script that decides a whole request inside Redis.
//!
//! The script is `lua/exact.lua` (exact integer helpers), the five algorithm files and
//! `lua/batch.lua` (the driver), concatenated at compile time, so one `EVALSHA` handles a request
//! whatever mix of algorithms it has. It reproduces [`crate::algorithm::decide`] and the batch
//! semantics of [`crate::store::memory::MemoryStore`] exactly (sequential duplicate keys, settling per
//! [`CommitPolicy`], peeks never write); `tests/it/redis_parity.rs` checks that against a real server.
//! The header of `lua/batch.lua` documents KEYS, ARGV and the reply; [`BatchScript::invocation`] and
//! [`BatchScript::decode`] are the only code that knows that layout.

use crate::algorithm::{Algorithm, Decision, Limit};
use crate::store::CommitPolicy;

/// The script's source: the shared helpers, every algorithm, then the driver (which must come last:
/// it is the chunk's main body and refers to the functions defined before it).
pub const SOURCE: &str = concat!(
    include_str!("../../../lua/exact.lua"),
    "\n",
    include_str!("../../../lua/fixed_window.lua"),
    "\n",
    include_str!("../../../lua/sliding_window.lua"),
    "\n",
    include_str!("../../../lua/sliding_log.lua"),
    "\n",
    include_str!("../../../lua/token_bucket.lua"),
    "\n",
    include_str!("../../../lua/gcra.lua"),
    "\n",
    include_str!("../../../lua/batch.lua"),
);

/// One item of a batch, as the script sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptItem<'a> {
    /// The Redis key (`KEYS[i]`). For a fixed window, the caller-named counter of the window starting
    /// at `window_start_us` (envoyproxy/ratelimit's key); otherwise the key holding the state.
    pub key: &'a str,
    /// The limit to enforce.
    pub limit: Limit,
    /// Units to consume; 0 checks without consuming (and never writes).
    pub cost: u64,
    /// Items with the same group are contiguous and pass or fail together (see [`crate::store::BatchItem`]).
    pub group: u32,
    /// Fixed window only (else 0): the first µs of the window `key` counts, on the Redis clock as the
    /// caller estimates it. `reset_after_us` is measured to its end.
    pub window_start_us: u64,
    /// Fixed window only (else 0): the counter's `EXPIRE` in seconds (Go: window + jitter); at least 1 is
    /// used.
    pub ttl_secs: u64,
}

/// The decisions of one script call and the Redis clock reading it used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptReply {
    /// The Redis server's `TIME` when the script ran, in µs since the epoch: every decision was made at
    /// this instant. The caller tracks its clock offset from it to name fixed-window keys.
    pub now_us: u64,
    /// One decision per item, in batch order.
    pub decisions: Vec<Decision>,
}

/// Why a reply could not be decoded. None of these happens with the script this module sends; they
/// mean the server is not the Redis we expect (or the reply was corrupted), never a decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// The reply was not an array.
    #[error("expected an array reply, got {0}")]
    NotAnArray(String),
    /// The array had the wrong number of elements.
    #[error("expected {expected} values in the reply, got {got}")]
    WrongLength {
        /// `1 + 4 × items`.
        expected: usize,
        /// What arrived.
        got: usize,
    },
    /// An element was not a non-negative integer (or, for `allowed`, not 0 or 1).
    #[error("reply value {index} is not a valid integer: {value}")]
    BadValue {
        /// Position in the reply array.
        index: usize,
        /// The value as received, for the log.
        value: String,
    },
}

/// The batch script (all algorithms + driver), loaded by SHA.
#[derive(Clone)]
pub struct BatchScript {
    script: redis::Script,
}

impl std::fmt::Debug for BatchScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The source is long and fixed; the SHA identifies it.
        f.debug_struct("BatchScript").field("sha", &self.sha()).finish()
    }
}

impl Default for BatchScript {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchScript {
    /// The script, hashed once.
    pub fn new() -> Self {
        Self {
            script: redis::Script::new(SOURCE),
        }
    }

    /// The SHA1 `EVALSHA` uses.
    pub fn sha(&self) -> &str {
        self.script.get_hash()
    }

    /// KEYS and ARGV for one batch, ready to invoke on any redis connection type.
    /// [`redis::ScriptInvocation::invoke_async`] sends `EVALSHA` and, on `NOSCRIPT` (after a Redis
    /// restart or `SCRIPT FLUSH`), loads the script and retries once.
    pub fn invocation(&self, items: &[ScriptItem<'_>], policy: CommitPolicy) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(policy_code(policy));
        // Eight ARGV fields per item, in the order `lua/batch.lua` reads them.
        for item in items {
            invocation
                .key(item.key)
                .arg(algorithm_code(item.limit.algorithm))
                .arg(item.limit.requests)
                .arg(item.limit.window_us)
                .arg(item.limit.burst)
                .arg(item.cost)
                .arg(item.group)
                .arg(item.window_start_us)
                .arg(item.ttl_secs);
        }
        invocation
    }

    /// Decodes the script's reply for `items` items.
    pub fn decode(reply: redis::Value, items: usize) -> Result<ScriptReply, ScriptError> {
        let values = match reply {
            redis::Value::Array(values) | redis::Value::Set(values) => values,
            other => return Err(ScriptError::NotAnArray(format!("{other:?}"))),
        };
        let expected = items.checked_mul(4).and_then(|n| n.checked_add(1));
        if expected != Some(values.len()) {
            return Err(ScriptError::WrongLength {
                expected: expected.unwrap_or(usize::MAX),
                got: values.len(),
            });
        }
        let number = |index: usize| -> Result<u64, ScriptError> {
            integer(&values[index]).ok_or_else(|| ScriptError::BadValue {
                index,
                value: format!("{:?}", values[index]),
            })
        };
        let now_us = number(0)?;
        let mut decisions = Vec::with_capacity(items);
        for item in 0..items {
            let at = 1 + 4 * item;
            let allowed = match number(at)? {
                0 => false,
                1 => true,
                _ => {
                    return Err(ScriptError::BadValue {
                        index: at,
                        value: format!("{:?}", values[at]),
                    });
                }
            };
            decisions.push(Decision {
                allowed,
                remaining: number(at + 1)?,
                reset_after_us: number(at + 2)?,
                retry_after_us: number(at + 3)?,
            });
        }
        Ok(ScriptReply { now_us, decisions })
    }
}

/// The policy code `lua/batch.lua` expects in `ARGV[1]`.
fn policy_code(policy: CommitPolicy) -> u8 {
    match policy {
        CommitPolicy::Independent => 0,
        CommitPolicy::AllOrNothing => 1,
        CommitPolicy::StopIncrementWhenOverLimit => 2,
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

/// A non-negative integer from an integer reply or a decimal string (the script sends values above
/// 2^53 as strings, since Lua numbers are doubles).
fn integer(value: &redis::Value) -> Option<u64> {
    match value {
        redis::Value::Int(n) => u64::try_from(*n).ok(),
        redis::Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        redis::Value::SimpleString(text) => text.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    fn reply(values: Vec<Value>) -> Value {
        Value::Array(values)
    }

    #[test]
    fn decodes_integers_and_big_decimal_strings() {
        let got = BatchScript::decode(
            reply(vec![
                Value::Int(1_700_000_000_000_000),
                Value::Int(1),
                Value::Int(4),
                Value::BulkString(b"18446744073709551615".to_vec()),
                Value::Int(0),
            ]),
            1,
        )
        .expect("valid reply");
        assert_eq!(got.now_us, 1_700_000_000_000_000);
        assert_eq!(
            got.decisions,
            vec![Decision {
                allowed: true,
                remaining: 4,
                reset_after_us: u64::MAX,
                retry_after_us: 0
            }]
        );
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let bad = [
            (Value::Nil, 0),
            (Value::Okay, 1),
            (reply(vec![Value::Int(1)]), 1),
            (reply(vec![Value::Int(1); 5]), usize::MAX),
            (reply(vec![Value::Int(-1)]), 0),
            (
                reply(vec![
                    Value::Int(1),
                    Value::Int(2),
                    Value::Int(0),
                    Value::Int(0),
                    Value::Int(0),
                ]),
                1,
            ),
            (
                reply(vec![
                    Value::Int(1),
                    Value::Int(1),
                    Value::Nil,
                    Value::Int(0),
                    Value::Int(0),
                ]),
                1,
            ),
            (
                reply(vec![
                    Value::Int(1),
                    Value::Int(1),
                    Value::BulkString(b"1e5".to_vec()),
                    Value::Int(0),
                    Value::Int(0),
                ]),
                1,
            ),
        ];
        for (value, items) in bad {
            assert!(BatchScript::decode(value.clone(), items).is_err(), "{value:?}");
        }
    }

    #[test]
    fn script_is_the_concatenation_and_hashes_stably() {
        assert!(SOURCE.starts_with("-- exact.lua"));
        assert!(SOURCE.contains("local function gcra_decide"));
        assert_eq!(BatchScript::new().sha(), BatchScript::new().sha());
        assert_eq!(BatchScript::new().sha().len(), 40);
    }
}
