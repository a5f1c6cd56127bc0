-- batch.lua: Tollgate's batch driver. Decides (or peeks at, refunds, reserves) every limit of a
-- batch, one request or several coalesced ones, in one call.
--
-- The code Redis runs is exact.lua + fixed_window.lua + sliding_window.lua + sliding_log.lua +
-- token_bucket.lua + gcra.lua + this file, concatenated (src/store/redis/script.rs) into one
-- chunk, so one call handles a whole request whatever mix of algorithms it has. This file
-- defines `tollgate_batch(keys, args)`; script.rs appends one line that exposes it:
--   - As a Redis Function library (Redis >= 7.0, the normal mode): `#!lua name=tollgate_<hash>`
--     is prepended and `redis.register_function('tollgate_batch_<hash>', tollgate_batch)`
--     appended, the library is loaded once (`FUNCTION LOAD REPLACE`), and each request is
--     `FCALL tollgate_batch_<hash> numkeys KEYS... ARGV...`. The chunk, and so the creation of
--     every helper, runs once at load; a call runs only tollgate_batch. <hash> is derived from
--     the code, so Tollgate versions with different code never replace each other's function.
--   - As an EVAL script (the fallback for servers without FCALL): `return tollgate_batch(KEYS,
--     ARGV)` is appended and each request is `EVALSHA`; the whole chunk then runs per call.
-- It reproduces MemoryStore::apply_batch (src/store/memory/mod.rs) exactly. Consuming policies
-- (0 Independent, 1 AllOrNothing, 2 StopIncrementWhenOverLimit):
--
--   1. Evaluate the items in order with their costs. An in-call overlay holds each key's
--      state as left by earlier items, so a key appearing twice sees the first item's effect.
--   2. If some item is denied, settle the costs per policy (settle): AllOrNothing -> all 0;
--      StopIncrementWhenOverLimit -> allowed items 0; Independent -> allowed items of a group
--      (a contiguous run of equal group ids, more than one item) holding a denied item 0. If
--      that changed any cost, evaluate again from the ORIGINAL states with the settled costs and
--      report the second decision for items whose cost did not change, and for the others the
--      first verdict and retry with the second (zero-cost) remaining and reset (`unconsumed`).
--   3. Write: only items with a settled cost > 0 store state (peeks never write). Fixed window:
--      `SET key count EX ttl_secs`, count = the stored counter + the key's total settled cost,
--      which leaves the key exactly as envoyproxy/ratelimit's `INCRBY key cost` + `EXPIRE key
--      ttl_secs` would (a plain integer, int-encoded, with that TTL; a denied item still counts)
--      in one command instead of two; the script is atomic, so no concurrent INCRBY of a Go
--      replica is lost. Other algorithms: `SET key state PXAT expiry` when the final state
--      differs from the stored value, `DEL` when it is now equivalent to no state; expiry = the
--      algorithm's expires_at (the instant the state stops mattering), in ms rounded up. Every
--      key written therefore has a TTL.
--
-- Peek (3): step 1 alone. The decisions are the first pass's, with the real costs (no
--   settling), and nothing is written, for any algorithm.
-- Refund (4) (refund_all): each item gives its cost back to its key, in order, through the same
--   overlay (a key appearing twice sees the first refund), with the algorithm's <name>_refund
--   (algorithm::refund). Every decision is allowed with no retry. A key without state (absent,
--   another algorithm's or window's, malformed, expired; for a fixed window, a counter that is
--   absent or not an integer) is never written, and neither is a state the refund left as it
--   was. Other algorithms: written as in step 3 (SET ... PXAT expiry, DEL when the refunded
--   state is equivalent to no state). Fixed window: `SET key count KEEPTTL`, lowering the
--   existing counter in place with the TTL it has, so a Go replica's INCRBY + EXPIRE on the same
--   key go on working; the key is never created (a fresh window has nothing to refund).
--   With a refund token, KEYS holds after the items one single-use marker per item (items of one
--   descriptor share theirs) and ARGV[4] its TTL in ms: each marker is claimed with SET NX PX in this
--   call, and an item whose marker was already there gives nothing back and reports not allowed.
--
-- KEYS: one per item, in batch order (duplicates allowed). Fixed window: the caller-named window
--   counter (Go's key). Others: the caller's state key. In Redis Cluster all must share a slot.
-- ARGV: [1] policy (0 Independent, 1 AllOrNothing, 2 StopIncrementWhenOverLimit, 3 Peek,
--   4 Refund, 5 Reserve: one item and its reservers hash, see reserve below) in decimal; [2] the call's distinct limits, 32 bytes each: algorithm (0
--   fixed_window, 1 sliding_window, 2 sliding_log, 3 token_bucket, 4 gcra), requests, window_us,
--   burst; [3] the items, 40 bytes each: the index of the item's limit in [2] (from 1), cost (a
--   refund's amount), group (unused by peeks and refunds), window_start_us (fixed window; else
--   0), ttl_secs (fixed window, used by consuming policies only; else 0). Every field is a
--   little-endian unsigned 64-bit integer (struct '<I8'). Binary because decimal parsing (strtod)
--   was a large share of a call; unsigned because then every field read is a non-negative integer
--   and needs no check (struct converts each to the nearest double, as tonumber() of the decimal
--   did); each limit once because a call's items mostly share a few (coalesced requests for the
--   same rule), and unpacking a field costs more than anything done with it.
-- Returns: one binary string, 8 + 25 bytes per item: now_us as a little-endian double, then per
--   item struct '<Bddd': flags (1: allowed; 2: its key held an impossible value, see exact.lua,
--   decided as none and removed or overwritten unless peeking; 4, a reservation only: its reservers
--   hash held what no Tollgate writes, and was removed, see reserve below), remaining, reset_after_us,
--   retry_after_us; a reservation's reply then ends with the extra units granted, a double. Doubles hold
--   every value exactly below 2^53 (beyond, only for absurd limits, the caller saturates them at
--   u64::MAX as Rust does). One string instead of an array of 1 + 4n integers: Redis turns each
--   array element into a reply of its own, which cost more than packing. Malformed arguments ->
--   an error reply `ERR tollgate: ...`, before anything is written.
--
-- Atomic: Redis runs a function or script to completion without interleaving any other command,
--   so the read, the settling and the writes form one step; and during a call Redis evaluates
--   key expiry against the time the call started, so no key can expire between our GET and our
--   write. Effects replication (the only mode since Redis 7; TIME is therefore allowed before
--   writes) ships the resulting SET/DEL, with PXAT being absolute, to replicas and AOF.
-- Time: `TIME` is read once (µs since the epoch, the Redis server's clock), so every item is
--   decided at the same instant, and returned so the caller can track its offset from Redis.
-- Requires Redis >= 6.2 (SET ... PXAT, KEEPTTL); Redis >= 7.0 for the function library.
--
-- Exactness (Lua numbers are doubles): every decision field equals the Rust one whenever requests,
--   burst, costs and window_us are < 2^52, instants (now + the algorithm's longest duration) are
--   < 2^53 µs, and the true durations reported are < 2^53 µs; products beyond 2^53 (burst * window
--   and the like) are computed exactly by exact.lua's muldiv. Each algorithm file states its bound.
--   Outside them results are rounded but finite, non-negative and never NaN. Counters and costs
--   above 2^53 still deny, as in Rust (where they saturate at u64::MAX instead of 2^53 - 1).
--   A refund's amount only ever meets quantities below those bounds (it is capped at the burst,
--   at a count, or compared with whole intervals of debt), so any amount, up to u64::MAX rounded
--   to a double, has the effect it has in Rust: beyond what is held, it gives everything back.
--
-- Stored values of the other algorithms are binary (struct.pack): an algorithm byte, window_us as
-- a double, then the algorithm's fields as doubles (exact: they are integers, and a double
-- round-trips bit for bit). A value whose algorithm or window differs from the item's (or that
-- is malformed, e.g. of the wrong length) reads as no state, as MemoryStore keys its entries by
-- (key, algorithm, window). A fixed-window key holding anything but a decimal integer reads as 0
-- and is overwritten. A value no Tollgate could have written (exact.lua) reads as no state too, and
-- is overwritten or removed by any call but a peek, and flagged in the reply.

-- Algorithms other than the fixed window, by code. `decides_expired_as_none`: deciding from a state
-- that has expired gives exactly what deciding from no state gives (each such file shows why), so
-- a decision need not compute the expiry of the state it reads. A refund still does: refunding an
-- expired state would rewrite a key that MemoryStore treats as absent.
local ALGORITHMS = {
  [1] = { decide = sliding_window_decide, refund = sliding_window_refund,
          expires = sliding_window_expires, encode = sliding_window_encode,
          decode = sliding_window_decode },
  [2] = { decide = sliding_log_decide, refund = sliding_log_refund,
          expires = sliding_log_expires, encode = sliding_log_encode,
          decode = sliding_log_decode },
  [3] = { decide = token_bucket_decide, refund = token_bucket_refund,
          expires = token_bucket_expires, encode = token_bucket_encode,
          decode = token_bucket_decode, decides_expired_as_none = true },
  [4] = { decide = gcra_decide, refund = gcra_refund, expires = gcra_expires,
          encode = gcra_encode, decode = gcra_decode, decides_expired_as_none = true },
}

-- Per-item scratch arrays, indexed 1..#keys and overwritten by every call before being read (a call
-- never sees another call's values). As a function library they are created once at load and
-- reused, so a call allocates no table but its states and its reply. alg_of[i] is
-- lim_of[i].algorithm, copied once because every pass reads it for every item.
local key_of, alg_of, lim_of, cost_of, group_of, start_of, ttl_of = {}, {}, {}, {}, {}, {}, {}
-- first_of[i]: the first item with item i's key ("its key's slot"); the per-key arrays below are
-- indexed by that slot.
local first_of = {}
-- Per key slot: the stored value (false when absent); the overlay (state as left by earlier items
-- of the pass: live, algorithm, window, state (false: none), writer item, and for a state of the
-- other algorithms the instant it expires, computed once for both the check and the write);
-- written in this call.
local raw, ov_live, ov_alg, ov_win, ov_state, ov_writer, written = {}, {}, {}, {}, {}, {}, {}
-- The key slots found holding an impossible value (exact.lua) in this call: broken[g] is true for
-- each, and broken_slots lists them. Cleared at the start of a call, so that a call that finds none
-- (every call, normally) pays nothing per item.
local broken, broken_slots, broken_count = {}, {}, 0

local function mark_broken(g)
  if not broken[g] then
    broken[g] = true
    broken_count = broken_count + 1
    broken_slots[broken_count] = g
  end
end
local ov_expiry = {}
-- Per item: the decision of the current pass, the first pass's verdict, the costs.
local allowed, remaining, reset, retry, first_allowed, first_retry = {}, {}, {}, {}, {}, {}
local settled = {}
-- Per distinct limit of the call: its fields as the algorithms read them (lim_of[i] points to its
-- item's). Reused across calls like the arrays above, so a call allocates no limit table: as many
-- as the most distinct limits a call has carried, which the caller bounds.
local lim_pool = {}
-- The distinct keys to read, in first-appearance order, and each one's key slot.
local read_key, read_slot = {}, {}
local MGET_CHUNK = 1000
-- The reply's pieces (now, then one per item), joined into one string.
local reply_parts = {}

-- The stored state of non-fixed item i, or nil for no state (absent, another algorithm or
-- window, malformed, or already expired: MemoryStore ignores expired entries too; `deciding` skips
-- that check where the algorithm decides an expired state as none anyway).
local function stored_state(i, now, deciding)
  local value = raw[first_of[i]]
  local a = alg_of[i]
  -- The algorithm byte is read without struct (a C call per field is costly); the algorithm's
  -- decode unpacks the rest, window included, in one call.
  if not value or string.byte(value) ~= a then
    return nil
  end
  local lim, algorithm = lim_of[i], ALGORITHMS[a]
  local st = algorithm.decode(lim, value, now)
  if st == false then
    mark_broken(first_of[i])
    return nil
  end
  if st == nil or not (deciding and algorithm.decides_expired_as_none)
      and algorithm.expires(lim, st) <= now then
    return nil
  end
  return st
end

-- The state item i starts from (not a fixed window): the overlay's when an earlier item of this
-- call left one on its key (`entry`), else the stored one; nil for none.
local function current_state(i, g, entry, now, deciding)
  if entry then
    return ov_state[g] or nil
  end
  return stored_state(i, now, deciding)
end

-- The largest counter INCRBY leaves (2^63 - 1, as a double).
local MAX_COUNT = 9223372036854775807

-- A fixed-window counter as stored, and whether the key holds something else: not a number, or one
-- no INCRBY leaves (NaN, an infinity, negative), which is impossible (exact.lua) and read as 0. (A
-- fraction is read as it is; the first write stores the count as a whole number.)
local function stored_count(value)
  if not value then
    return 0, false
  end
  local count = tonumber(value)
  if count == nil or not (count >= 0 and count <= MAX_COUNT) then
    return 0, true
  end
  return count, false
end

-- The counter fixed-window item i starts from: the overlay's when an earlier item of this call left
-- one on its key (`entry`), else the stored one; and whether the key holds a counter at all.
local function current_count(g, entry)
  if entry then
    return ov_state[g], true
  end
  local stored, garbage = stored_count(raw[g])
  if garbage then
    mark_broken(g)
  end
  return stored, raw[g] and not garbage
end

-- One pass over the batch with the given costs (costs[i]), from the original states. Fills
-- allowed/remaining/reset/retry and the overlay.
local function run(n, costs, now)
  for i = 1, n do
    ov_live[first_of[i]] = false
  end
  for i = 1, n do
    local g, a, lim, cost = first_of[i], alg_of[i], lim_of[i], costs[i]
    -- The same key under another algorithm or window is a different entry in MemoryStore's
    -- terms; not a layout the caller produces, handled only so that it cannot break the script.
    local entry = ov_live[g] and ov_alg[g] == a and ov_win[g] == lim.window_us
    local ok, left, rst, rty, next_state, expiry
    if a == 0 then
      local count = current_count(g, entry)
      ok, left, rst, rty, next_state = fixed_window_decide(lim, count, now, cost, start_of[i])
    else
      local st = current_state(i, g, entry, now, true)
      local algorithm = ALGORITHMS[a]
      -- A decide may return the new state's expiry when it computed it anyway (token_bucket.lua),
      -- and whether it found the state impossible after all (sliding_log.lua: its live total).
      local impossible
      ok, left, rst, rty, next_state, expiry, impossible = algorithm.decide(lim, st, now, cost)
      if impossible then
        mark_broken(g)
      end
      -- Stored as MemoryStore stores it: a state already expired under this limit is no state.
      if cost > 0 and next_state ~= nil then
        expiry = expiry or algorithm.expires(lim, next_state)
        if expiry <= now then
          next_state = false
        end
      end
    end
    if cost > 0 then
      ov_live[g], ov_alg[g], ov_win[g], ov_state[g], ov_writer[g], ov_expiry[g] =
        true, a, lim.window_us, next_state or false, i, expiry
    end
    allowed[i], remaining[i], reset[i], retry[i] = ok, left, rst, rty
  end
end

-- Settles the costs (MemoryStore's settled_costs) into `settled`; false when the first pass stands.
local function settle(n, policy)
  local all_allowed = true
  for i = 1, n do
    if not allowed[i] then
      all_allowed = false
    end
  end
  if all_allowed then
    return false
  end
  if policy == 1 then
    for i = 1, n do
      settled[i] = 0
    end
  elseif policy == 2 then
    for i = 1, n do
      settled[i] = allowed[i] and 0 or cost_of[i]
    end
  else
    -- Groups are contiguous runs of equal ids; refund the allowed items of a run with a denial.
    local start = 1
    while start <= n do
      local stop = start
      while stop < n and group_of[stop + 1] == group_of[start] do
        stop = stop + 1
      end
      local denied = false
      for i = start, stop do
        if not allowed[i] then
          denied = true
        end
      end
      local refund = denied and stop > start
      for i = start, stop do
        settled[i] = (refund and allowed[i]) and 0 or cost_of[i]
      end
      start = stop + 1
    end
  end
  for i = 1, n do
    if settled[i] ~= cost_of[i] then
      return true
    end
  end
  return false
end

-- The refund pass (policy 4; MemoryStore's give_back): each item's cost given back to its key,
-- in order, through the overlay. Only a refund that changed a stored state enters the overlay,
-- and only the overlay is written, so a key without state is never written.
local function refund_all(n, now, keys, marker_ttl)
  for i = 1, n do
    ov_live[first_of[i]] = false
  end
  -- Single use: marker -> whether this call claimed it (an item whose marker it could not claim
  -- gives nothing back and reports not allowed).
  local claimed = {}
  for i = 1, n do
    local g, a, lim, amount = first_of[i], alg_of[i], lim_of[i], cost_of[i]
    local mine = true
    if keys then
      local marker = keys[n + i]
      if claimed[marker] == nil then
        claimed[marker] = redis.call('SET', marker, '1', 'NX', 'PX', marker_ttl) ~= false
      end
      mine = claimed[marker]
      if not mine then
        amount = 0
      end
    end
    local entry = ov_live[g] and ov_alg[g] == a and ov_win[g] == lim.window_us
    local ok, left, rst, rty, next_state, changed, expiry
    if a == 0 then
      local count, exists = current_count(g, entry)
      ok, left, rst, rty, next_state = fixed_window_refund(lim, count, now, amount, start_of[i])
      changed = exists and next_state ~= count
    else
      local st = current_state(i, g, entry, now)
      local algorithm = ALGORITHMS[a]
      -- Each refund returns `st` itself when it changed nothing (always when `st` is nil).
      ok, left, rst, rty, next_state = algorithm.refund(lim, st, now, amount)
      changed = next_state ~= st
      if changed then
        expiry = algorithm.expires(lim, next_state)
        if expiry <= now then
          next_state = false
        end
      end
    end
    if changed then
      ov_live[g], ov_alg[g], ov_win[g], ov_state[g], ov_writer[g], ov_expiry[g] =
        true, a, lim.window_us, next_state, i, expiry
    end
    allowed[i], remaining[i], reset[i], retry[i] = ok and mine, left, rst, rty
  end
end

-- Consumed fixed windows: each key's counter plus its items' settled costs (`costs`), in
-- first-appearance order, with the last item's TTL.
local function write_counters(n, costs)
  -- One pass sums each counter's settled costs (and keeps its last TTL), a second writes them.
  local increment_of, ttl_for = {}, {}
  for j = 1, n do
    if alg_of[j] == 0 and costs[j] > 0 then
      local g = first_of[j]
      increment_of[g] = (increment_of[g] or 0) + costs[j]
      ttl_for[g] = ttl_of[j]
    end
  end
  for i = 1, n do
    local g = first_of[i]
    if alg_of[i] == 0 and costs[i] > 0 and not written[g] then
      written[g] = true
      local increment, ttl = increment_of[g], ttl_for[g]
      -- A counter holding something else (or leaving the exact range) is set outright, saturated
      -- at 2^53 - 1 (still far above any limit, so still denying). EX 0 would delete the counter,
      -- so a TTL is at least one second; and at most 2^53 ms in seconds, beyond which SET fails
      -- ("invalid expire time") instead of meaning "forever".
      local total = math.min(stored_count(raw[g]) + increment, MAX_EXACT)
      redis.call('SET', key_of[i], int_str(total), 'EX', int_str(math.min(math.max(ttl, 1), 9007199254740)))
    end
  end
end

-- Refunded fixed windows: each lowered counter set in place, keeping the TTL the key has (the
-- overlay only holds counters that exist, so none is created).
local function write_refunded_counters(n)
  for i = 1, n do
    local g = first_of[i]
    if alg_of[i] == 0 and ov_live[g] and ov_alg[g] == 0 and not written[g] then
      written[g] = true
      redis.call('SET', key_of[i], int_str(ov_state[g]), 'KEEPTTL')
    end
  end
end

-- Other algorithms: write each key's final state in the overlay, in first-appearance order.
local function write_states(n)
  for i = 1, n do
    local g = first_of[i]
    if alg_of[i] ~= 0 and ov_live[g] and not written[g] and ov_alg[g] ~= 0 then
      written[g] = true
      local st, old = ov_state[g], raw[g]
      if st then
        -- Encoded under the limit of the item that left the state (the key's last writer).
        local value = ALGORITHMS[ov_alg[g]].encode(lim_of[ov_writer[g]], st)
        if value ~= old then
          -- Milliseconds rounded up: the key outlives the state's last relevant µs.
          redis.call('SET', key_of[i], value, 'PXAT', int_str(math.ceil(ov_expiry[g] / 1000)))
        end
      elseif old then
        redis.call('DEL', key_of[i])
      end
    end
  end
end

-- Keys found impossible and not written by this call: removed, so that they cannot outlive it (a
-- value without a TTL would never heal).
local function remove_broken()
  for j = 1, broken_count do
    local g = broken_slots[j]
    if not written[g] then
      written[g] = true
      redis.call('DEL', key_of[g])
    end
  end
end

-- Hot-key reservations (policy 5; src/store/redis/reserve.rs sends them, src/store/hot_keys.rs
-- states the guarantee). One item, whose cost is what the request in hand takes; KEYS[2] is the key's
-- reservers hash, in the item's slot: one field per replica holding units of the key, valued
-- "<units it holds>:<its lease's end, ms>:<the window they belong to, µs>". In one atomic step:
--   1. Reservers whose lease ended a lease ago (as long as this caller's) are dropped: their units
--      are not given back (some may have been admitted, and only the replica knew how many). One
--      whose lease ended more recently is kept, uncounted, so its owner's give-back, sent once the
--      lease has ended, still finds its grant. The others, this one included, are counted.
--   2. `give_back` units go back to the key (the algorithm's refund), at most the units of this
--      replica's last grant, and for a window algorithm only in the window that granted them: a
--      replica returns only what it was granted. (It gives back all it has not admitted on each call,
--      so after the call it holds the new grant alone.)
--   3. The item is decided with its cost plus an extra slice for the replica to admit from locally:
--      at most `want`, at most what the key admits divided by twice the reservers, at least nothing.
--      So as the key runs out the slices shrink to none and each decision is made here again. A
--      denied item is counted as any consuming call counts it (a fixed window counts denials).
-- The hash as Tollgate leaves it is a hash of at most MAX_RESERVERS fields with a TTL (every write sets
-- one). Anything else under its name (another type, more fields, no TTL: written by hand, or by
-- something else) would fail every reservation of the key, or count reservers forever: it is removed,
-- the call goes on as with no reservers, and the reply flags it.
-- Returns the extra units granted (0 when denied), and whether the hash was removed. ARGV[4..8]: want,
-- give_back, the replica's id, the lease in ms, how long the hash outlives its last reservation in ms.
local MAX_RESERVERS = 256
local ZERO = { 0 }

-- Whether the reservers hash is one Tollgate could have left (an absent one is). HLEN first: O(1),
-- and an error (caught) for a key of another type, so a crafted key costs no more than a real one.
local function reservers_intact(reservers)
  local size = redis.pcall('HLEN', reservers)
  if type(size) ~= 'number' then
    return false
  end
  return size == 0 or size <= MAX_RESERVERS and redis.call('PTTL', reservers) >= 0
end

-- The window a slice belongs to: a window algorithm's current window start; 0 for the buckets, whose
-- units stay good until the lease ends.
local function slice_window(now)
  if alg_of[1] == 0 then
    return start_of[1]
  elseif alg_of[1] == 1 then
    return now - math.fmod(now, lim_of[1].w)
  end
  return 0
end

local function reserve(keys, now, want, give_back, replica, lease_ms, keep_ms)
  local reservers, now_ms, window = keys[2], math.floor(now / 1000), slice_window(now)
  local take, held, live, mine = cost_of[1], 0, 1, false
  local repaired = not reservers_intact(reservers)
  if repaired then
    redis.call('DEL', reservers)
  end
  -- held: the units of this replica's last grant in this window, the most it may give back.
  local fields = repaired and {} or redis.call('HGETALL', reservers)
  for j = 1, #fields, 2 do
    local units, until_ms, at = string.match(fields[j + 1], '^(%d+):(%d+):(%d+)$')
    if fields[j] == replica then
      mine = true
      if tonumber(at) == window then
        held = tonumber(units)
      end
    elseif until_ms and tonumber(until_ms) > now_ms then
      live = live + 1
    elseif not until_ms or tonumber(until_ms) + lease_ms <= now_ms then
      -- Ended a lease ago: its owner, had it been alive, would have given its units back by now.
      -- (Until then the record stays, not counted live, so the owner's give-back still finds it.)
      redis.call('HDEL', reservers, fields[j])
    end
  end
  local back = math.min(give_back, held)
  if back > 0 then
    cost_of[1] = back
    refund_all(1, now)
    write_refunded_counters(1)
    write_states(1)
    remove_broken()
    -- The decision below starts from what the refund left (MGET: a key of another type reads as
    -- none, as it did before the refund, where GET would fail the call).
    raw[1] = redis.call('MGET', keys[1])[1]
    written[1] = false
  end
  local grant = take
  -- A new reserver is admitted while the hash has room; past MAX_RESERVERS, decisions are made here.
  if want > 0 and take > 0 and (mine or #fields < 2 * MAX_RESERVERS) then
    run(1, ZERO, now)
    local room = remaining[1]
    if allowed[1] and room >= take then
      grant = math.min(room, take + want, math.max(take, math.floor(room / (2 * live))))
    end
  end
  cost_of[1] = grant
  run(1, cost_of, now)
  write_counters(1, cost_of)
  write_states(1)
  remove_broken()
  -- The replica gives back everything it has not admitted whenever it calls, so what it holds from
  -- now on is this grant alone (units of an earlier grant it admitted are spent, not held).
  local extra = allowed[1] and grant - take or 0
  if extra > 0 then
    redis.call('HSET', reservers, replica,
      int_str(extra) .. ':' .. int_str(now_ms + lease_ms) .. ':' .. int_str(window))
    redis.call('PEXPIRE', reservers, keep_ms)
  elseif mine then
    redis.call('HDEL', reservers, replica)
  end
  return extra, repaired
end

local function tollgate_batch(keys, args)
  for j = 1, broken_count do
    broken[broken_slots[j]] = nil
  end
  broken_count = 0
  local now
  do
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  local n = #keys
  local policy, limits, items = tonumber(args[1]), args[2], args[3]
  -- A refund with a token (a fourth argument) sends one single-use marker key per item after the
  -- items' keys.
  local marker_ttl, reservation = nil, nil
  if policy == 5 then
    -- A reservation: one item, then its reservers hash (see reserve above).
    local want, give_back, lease_ms, keep_ms = tonumber(args[4]), tonumber(args[5]), tonumber(args[7]), tonumber(args[8])
    if n ~= 2 or #args ~= 8 or not (want and give_back and lease_ms and keep_ms and want >= 0
        and give_back >= 0 and lease_ms >= 1 and keep_ms >= lease_ms and #args[6] > 0) then
      return redis.error_reply('ERR tollgate: a reservation takes one item, its reservers key, want, give back, a replica id, a lease and a keep time')
    end
    n = 1
    reservation = { want = want, give_back = give_back, replica = args[6], lease_ms = lease_ms, keep_ms = keep_ms }
  elseif #args == 4 and policy == 4 and n % 2 == 0 then
    n = n / 2
    marker_ttl = tonumber(args[4])
    if not (marker_ttl and marker_ttl >= 1 and marker_ttl % 1 == 0) then
      return redis.error_reply('ERR tollgate: the marker TTL must be a positive number of ms')
    end
  elseif #args ~= 3 then
    return redis.error_reply('ERR tollgate: expected a policy, the limits and the items (and, for a refund, a marker TTL)')
  end
  if #items ~= 40 * n or #limits % 32 ~= 0 or not (policy == 0 or policy == 1 or policy == 2
      or policy == 3 or policy == 4 or policy == 5) then
    return redis.error_reply('ERR tollgate: expected a policy 0..5, 32 bytes per limit and 40 per key')
  end
  -- Unsigned integers, so every field is a non-negative integer without a check.
  local unpack_fields, pos = struct.unpack, 1
  local limit_count = #limits / 32
  for j = 1, limit_count do
    local a, requests, window_us, burst
    a, requests, window_us, burst, pos = unpack_fields('<I8I8I8I8', limits, pos)
    if a > 4 then
      return redis.error_reply('ERR tollgate: unknown algorithm ' .. int_str(a))
    end
    local lim = lim_pool[j]
    if not lim then
      lim = { algorithm = 0, requests = 0, window_us = 0, w = 1, burst = 0 }
      lim_pool[j] = lim
    end
    lim.algorithm, lim.requests, lim.window_us, lim.w, lim.burst =
      a, requests, window_us, math.max(window_us, 1), burst
  end
  pos = 1
  for i = 1, n do
    local l, cost, group, start, ttl
    l, cost, group, start, ttl, pos = unpack_fields('<I8I8I8I8I8', items, pos)
    if not (l >= 1 and l <= limit_count) then
      return redis.error_reply('ERR tollgate: item ' .. i .. ' names no limit')
    end
    local lim = lim_pool[l]
    key_of[i], lim_of[i], alg_of[i], cost_of[i], group_of[i], start_of[i], ttl_of[i] =
      keys[i], lim, lim.algorithm, cost, group, start, ttl
  end
  -- Read every distinct key once. A table keyed by key name keeps this linear: a request may carry
  -- thousands of descriptors. One MGET per MGET_CHUNK keys instead of a GET each: every redis.call
  -- has a fixed cost, and unpack() is bounded by Lua's C stack (8,000 values).
  local first_index, distinct = {}, 0
  for i = 1, n do
    local key = keys[i]
    local g = first_index[key]
    if not g then
      g = i
      first_index[key] = i
      distinct = distinct + 1
      read_key[distinct], read_slot[distinct] = key, i
      written[i] = false
    end
    first_of[i] = g
  end
  for from = 1, distinct, MGET_CHUNK do
    local to = math.min(from + MGET_CHUNK - 1, distinct)
    local values = redis.call('MGET', unpack(read_key, from, to))
    for j = from, to do
      raw[read_slot[j]] = values[j - from + 1]
    end
  end

  local extra, reservers_repaired = nil, false
  if reservation then
    local r = reservation
    extra, reservers_repaired = reserve(keys, now, r.want, r.give_back, r.replica, r.lease_ms, r.keep_ms)
  elseif policy == 4 then
    refund_all(n, now, marker_ttl and keys, marker_ttl)
    write_refunded_counters(n)
    write_states(n)
    remove_broken()
  else
    run(n, cost_of, now)
    -- A peek (3) is the first pass alone: its decisions, no settling, nothing written.
    if policy ~= 3 then
      local costs = cost_of
      if settle(n, policy) then
        for i = 1, n do
          first_allowed[i], first_retry[i] = allowed[i], retry[i]
        end
        run(n, settled, now)
        for i = 1, n do
          if settled[i] ~= cost_of[i] then
            -- Evaluated but not consumed: the verdict (and retry) stand, the counters are a peek's.
            allowed[i], retry[i] = first_allowed[i], first_retry[i]
          end
        end
        costs = settled
      end
      write_counters(n, costs)
      write_states(n)
      remove_broken()
    end
  end

  local pack = struct.pack
  reply_parts[1] = pack('<d', now)
  for i = 1, n do
    reply_parts[i + 1] = pack('<Bddd', allowed[i] and 1 or 0, remaining[i], reset[i], retry[i])
  end
  -- The other flags are rare: only the items they mark are packed again.
  for i = 1, (broken_count > 0 or reservers_repaired) and n or 0 do
    local flags = (broken[first_of[i]] and 2 or 0) + (reservers_repaired and 4 or 0)
    if flags > 0 then
      reply_parts[i + 1] = pack('<Bddd', (allowed[i] and 1 or 0) + flags, remaining[i], reset[i], retry[i])
    end
  end
  if extra then
    -- A reservation's reply ends with the extra units granted.
    reply_parts[n + 2] = pack('<d', extra)
    return table.concat(reply_parts, '', 1, n + 2)
  end
  return table.concat(reply_parts, '', 1, n + 1)
end
