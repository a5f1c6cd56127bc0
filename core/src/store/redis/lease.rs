//! Concurrency leases in Redis: one sorted set per key, updated by `lua/lease.lua` in one call per
//! Acquire or Release (see [`crate::store::lease`] for the semantics).
//!
//! Key: `{CACHE_KEY_PREFIX + domain}` + the rest of the descriptor's key + `concurrency`. The hash tag
//! is the domain, so every key of one call lives in one Redis Cluster slot and the all-or-none acquire
//! stays one atomic script. Leases guard expensive work, so their rate is low and concentrating a
//! domain's leases in one slot costs nothing noticeable.

use std::sync::{Arc, LazyLock};

use redis::{Script, Value};

use super::RedisStore;
use super::call::Caller;
use crate::store::StoreError;
use crate::store::lease::{AcquireRequest, LeaseSlot, LeaseStore, ReleaseRequest, Released};

/// The script, loaded by SHA (`EVALSHA`; a `NOSCRIPT` costs one `SCRIPT LOAD` and a retry).
static LEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/lease.lua")));

/// The sorted set holding the leases of a descriptor key that starts with `scope`.
fn lease_key(key: &str, scope_len: usize) -> String {
    // The scope always ends on a character boundary; anything else tags the whole key.
    let at = if key.is_char_boundary(scope_len) {
        scope_len
    } else {
        key.len()
    };
    let (tag, rest) = key.split_at(at);
    format!("{{{tag}}}{rest}concurrency")
}

/// One lease script call on `count` keys (the first named `first_key`, for the log), answering
/// `fields` integers per key.
async fn lease_call(
    call: &Caller,
    invocation: redis::ScriptInvocation<'_>,
    first_key: &str,
    fields: usize,
    count: usize,
) -> Result<Vec<u64>, StoreError> {
    let reply: Value = call
        .link
        .call_whole(|mut conn| async move { invocation.invoke_async(&mut conn).await })
        .await
        .map_err(|e| call.store_error(e))?;
    let mut values = integers(&reply, 2 + fields * count)
        .ok_or_else(|| StoreError::Unavailable(format!("unexpected lease script reply: {reply:?}")))?;
    let (now_us, impossible) = (values[0], values[1]);
    if impossible > 0 {
        call.counters.impossible.found(
            usize::try_from(impossible).unwrap_or(usize::MAX),
            first_key,
            now_us,
        );
    }
    Ok(values.split_off(2))
}

/// The integers of an array reply of exactly `len` elements.
fn integers(reply: &Value, len: usize) -> Option<Vec<u64>> {
    let Value::Array(items) = reply else { return None };
    if items.len() != len {
        return None;
    }
    items
        .iter()
        .map(|item| match item {
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        })
        .collect()
}

impl LeaseStore for Arc<RedisStore> {
    async fn acquire(&self, request: &AcquireRequest) -> Result<Vec<LeaseSlot>, StoreError> {
        let mut invocation = LEASE_SCRIPT.prepare_invoke();
        for item in &request.items {
            invocation.key(lease_key(&item.key, request.scope_len));
        }
        invocation
            .arg(if request.renew { "renew" } else { "acquire" })
            .arg(&request.lease_id)
            .arg(request.ttl_us);
        for item in &request.items {
            invocation.arg(item.max_in_flight);
        }
        let first = request.items.first().map_or("", |item| item.key.as_str());
        let values = lease_call(&self.call, invocation, first, 3, request.items.len()).await?;
        Ok(values
            .chunks_exact(3)
            .map(|v| LeaseSlot {
                available: v[0] == 1,
                in_flight: v[1],
                retry_after_us: v[2],
            })
            .collect())
    }

    async fn release(&self, request: &ReleaseRequest) -> Result<Vec<Released>, StoreError> {
        let mut invocation = LEASE_SCRIPT.prepare_invoke();
        for key in &request.keys {
            invocation.key(lease_key(key, request.scope_len));
        }
        invocation.arg("release").arg(&request.lease_id);
        let first = request.keys.first().map_or("", String::as_str);
        let values = lease_call(&self.call, invocation, first, 2, request.keys.len()).await?;
        Ok(values
            .chunks_exact(2)
            .map(|v| Released {
                released: v[0] == 1,
                in_flight: v[1],
            })
            .collect())
    }
}
