-- batch.lua: Tollgate's batch driver. Decides every limit of one request in one script call.
--
-- The script Redis runs is exact.lua + fixed_window.lua + sliding_window.lua + sliding_log.lua +
-- token_bucket.lua + gcra.lua + this file, concatenated (src/store/redis/script.rs), so one
-- EVALSHA handles a whole request whatever mix of algorithms it has. It reproduces
-- MemoryStore::apply_batch (src/store/memory.rs) exactly:
--
--   1. Evaluate the items in order with their costs. An in-script overlay holds each key's
--      state as left by earlier items, so a key appearing twice sees the first item's effect.
--   2. If some item is denied, settle the costs per policy (settled_costs): AllOrNothing -> all 0;
--      StopIncrementWhenOverLimit -> allowed items 0; Independent -> allowed items of a group
--      (a contiguous run of equal group ids, more than one item) holding a denied item 0. If
--      that changed any cost, evaluate again from the ORIGINAL states with the settled costs and
--      report the second decision for items whose cost did not change, and for the others the
--      first verdict and retry with the second (zero-cost) remaining and reset (`unconsumed`).
--   3. Write: only items with a settled cost > 0 store state (peeks never write). Fixed window:
--      `INCRBY key total_settled_cost` then `EXPIRE key ttl_secs` (envoyproxy/ratelimit's
--      commands; a denied item still increments). Other algorithms: `SET key state PXAT expiry`
--      when the final state differs from the stored string, `DEL` when it is now equivalent to no
--      state; expiry = the algorithm's expires_at (the instant the state stops mattering), in ms
--      rounded up. Every key written therefore has a TTL.
--
-- KEYS: one per item, in batch order (duplicates allowed). Fixed window: the caller-named window
--   counter (Go's key). Others: the caller's state key. In Redis Cluster all must share a slot.
-- ARGV: [1] policy (0 Independent, 1 AllOrNothing, 2 StopIncrementWhenOverLimit), then 8 fields
--   per item: algorithm (0 fixed_window, 1 sliding_window, 2 sliding_log, 3 token_bucket,
--   4 gcra), requests, window_us, burst, cost, group, window_start_us (fixed window; else 0),
--   ttl_secs (fixed window; else 0). All decimal integers.
-- Returns: an array { now_us, then per item: allowed (1/0), remaining, reset_after_us,
--   retry_after_us }. Values are integer replies, or decimal strings above 2^53 (only for absurd
--   limits; saturated at u64::MAX). Malformed arguments -> an error reply `ERR tollgate: ...`.
--
-- Atomic: Redis runs a script to completion without interleaving any other command, so the read,
--   the settling and the writes form one step; and during a script Redis evaluates key expiry
--   against the time the script started, so no key can expire between our GET and our write.
--   Effects replication (the only mode since Redis 7; TIME is therefore allowed before writes)
--   ships the resulting SET/INCRBY/EXPIRE/DEL, with PXAT being absolute, to replicas and AOF.
-- Time: `TIME` is read once (µs since the epoch, the Redis server's clock), so every item is
--   decided at the same instant, and returned so the caller can track its offset from Redis.
-- Requires Redis >= 6.2 (SET ... PXAT).
--
-- Exactness (Lua numbers are doubles): every decision field equals the Rust one whenever requests,
--   burst, costs and window_us are < 2^52, instants (now + the algorithm's longest duration) are
--   < 2^53 µs, and the true durations reported are < 2^53 µs; products beyond 2^53 (burst * window
--   and the like) are computed exactly by exact.lua's muldiv. Each algorithm file states its bound.
--   Outside them results are rounded but finite, non-negative and never NaN. Counters and costs
--   above 2^53 still deny, as in Rust (where they saturate at u64::MAX instead of 2^53 - 1).
--
-- Stored values of the other algorithms are strings `<algorithm>:<window_us>:<fields...>`; a
-- value whose algorithm or window differs from the item's (or that is malformed) reads as no
-- state, as MemoryStore keys its entries by (key, algorithm, window). A fixed-window key holding
-- a non-integer reads as 0 and is overwritten with SET ... EX.

local now
do
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local FIELDS = 8
local nitems = #KEYS
local policy = tonumber(ARGV[1])
if #ARGV ~= 1 + FIELDS * nitems or (policy ~= 0 and policy ~= 1 and policy ~= 2) then
  return redis.error_reply('ERR tollgate: expected policy 0..2 and 8 arguments per key')
end

-- Algorithms other than the fixed window, by code.
local ALGORITHMS = {
  [1] = { decide = sliding_window_decide, expires = sliding_window_expires,
          encode = sliding_window_encode, decode = sliding_window_decode },
  [2] = { decide = sliding_log_decide, expires = sliding_log_expires,
          encode = sliding_log_encode, decode = sliding_log_decode },
  [3] = { decide = token_bucket_decide, expires = token_bucket_expires,
          encode = token_bucket_encode, decode = token_bucket_decode },
  [4] = { decide = gcra_decide, expires = gcra_expires,
          encode = gcra_encode, decode = gcra_decode },
}

local items = {}
for i = 1, nitems do
  local base = 1 + (i - 1) * FIELDS
  local v = {}
  for j = 1, FIELDS do
    v[j] = tonumber(ARGV[base + j])
    -- Non-negative integers only (also rejects NaN and inf).
    if v[j] == nil or not (v[j] >= 0) or v[j] ~= math.floor(v[j]) or v[j] == math.huge then
      return redis.error_reply('ERR tollgate: argument ' .. (base + j) .. ' is not a non-negative integer')
    end
  end
  if v[1] > 4 then
    return redis.error_reply('ERR tollgate: unknown algorithm ' .. ARGV[base + 1])
  end
  items[i] = {
    key = KEYS[i],
    algorithm = v[1],
    lim = { requests = v[2], window_us = v[3], w = math.max(v[3], 1), burst = v[4] },
    cost = v[5],
    group = v[6],
    window_start = v[7],
    ttl = v[8],
  }
end

-- Raw stored values, read once per key (false when absent).
local raw = {}
local function raw_value(key)
  local value = raw[key]
  if value == nil then
    value = redis.call('GET', key)
    raw[key] = value
  end
  return value
end

-- Splits a stored string into numbers; nil if any field is not a number.
local function numeric_fields(value)
  local f = {}
  for part in string.gmatch(value, '[^:]+') do
    local x = tonumber(part)
    if x == nil then
      return nil
    end
    f[#f + 1] = x
  end
  return f
end

-- The stored state of a non-fixed item, or nil for no state (absent, another algorithm or
-- window, malformed, or already expired: MemoryStore ignores expired entries too).
local function stored_state(item)
  local value = raw_value(item.key)
  if not value then
    return nil
  end
  local f = numeric_fields(value)
  if f == nil or f[1] ~= item.algorithm or f[2] ~= item.lim.window_us then
    return nil
  end
  local algorithm = ALGORITHMS[item.algorithm]
  local st = algorithm.decode(item.lim, f, 3)
  if st == nil or algorithm.expires(item.lim, st) <= now then
    return nil
  end
  return st
end

-- The stored counter of a fixed-window item, and whether the key holds something else.
local function stored_count(item)
  local value = raw_value(item.key)
  if not value then
    return 0, false
  end
  local count = tonumber(value)
  if count == nil then
    return 0, true
  end
  return count, false
end

-- One pass over the batch with the given costs, from the original states. Returns the decisions
-- and the overlay: key -> { algorithm, window_us, state (false: none), writer (item index) }.
local function run(costs)
  local overlay = {}
  local decisions = {}
  for i = 1, nitems do
    local item = items[i]
    local cost = costs[i]
    local entry = overlay[item.key]
    if entry ~= nil and (entry.algorithm ~= item.algorithm or entry.window_us ~= item.lim.window_us) then
      -- The same key under another algorithm or window: a different entry in MemoryStore's terms;
      -- not a layout the caller produces, handled only so that it cannot break the script.
      entry = nil
    end
    local allowed, remaining, reset, retry, next_state
    if item.algorithm == 0 then
      local count = 0
      if entry ~= nil then
        count = entry.state
      else
        count = stored_count(item)
      end
      allowed, remaining, reset, retry, next_state =
        fixed_window_decide(item.lim, count, now, cost, item.window_start)
    else
      local st
      if entry ~= nil then
        st = entry.state or nil
      else
        st = stored_state(item)
      end
      local algorithm = ALGORITHMS[item.algorithm]
      allowed, remaining, reset, retry, next_state = algorithm.decide(item.lim, st, now, cost)
      -- Stored as MemoryStore stores it: a state already expired under this limit is no state.
      if next_state ~= nil and algorithm.expires(item.lim, next_state) <= now then
        next_state = false
      end
    end
    if cost > 0 then
      overlay[item.key] = {
        algorithm = item.algorithm,
        window_us = item.lim.window_us,
        state = next_state or false,
        writer = i,
      }
    end
    decisions[i] = { allowed = allowed, remaining = remaining, reset = reset, retry = retry }
  end
  return decisions, overlay
end

-- The settled costs (MemoryStore's settled_costs), or nil when the first pass stands.
local function settled_costs(decisions)
  local all_allowed = true
  for i = 1, nitems do
    if not decisions[i].allowed then
      all_allowed = false
    end
  end
  if all_allowed then
    return nil
  end
  local settled = {}
  if policy == 1 then
    for i = 1, nitems do
      settled[i] = 0
    end
  elseif policy == 2 then
    for i = 1, nitems do
      settled[i] = decisions[i].allowed and 0 or items[i].cost
    end
  else
    -- Groups are contiguous runs of equal ids; refund the allowed items of a run with a denial.
    local start = 1
    while start <= nitems do
      local stop = start
      while stop < nitems and items[stop + 1].group == items[start].group do
        stop = stop + 1
      end
      local denied = false
      for i = start, stop do
        if not decisions[i].allowed then
          denied = true
        end
      end
      local refund = denied and stop > start
      for i = start, stop do
        settled[i] = (refund and decisions[i].allowed) and 0 or items[i].cost
      end
      start = stop + 1
    end
  end
  for i = 1, nitems do
    if settled[i] ~= items[i].cost then
      return settled
    end
  end
  return nil
end

local costs = {}
for i = 1, nitems do
  costs[i] = items[i].cost
end
local decisions, overlay = run(costs)
local settled = settled_costs(decisions)
if settled ~= nil then
  local first = decisions
  decisions, overlay = run(settled)
  for i = 1, nitems do
    if settled[i] ~= costs[i] then
      -- Evaluated but not consumed: the verdict (and retry) stand, the counters are a peek's.
      decisions[i].allowed = first[i].allowed
      decisions[i].retry = first[i].retry
    end
  end
else
  settled = costs
end

-- Fixed-window increments per key, in first-appearance order, and the last item's TTL.
local increments, ttls, order = {}, {}, {}
for i = 1, nitems do
  local item = items[i]
  if item.algorithm == 0 and settled[i] > 0 then
    if increments[item.key] == nil then
      increments[item.key] = 0
      order[#order + 1] = item.key
    end
    increments[item.key] = increments[item.key] + settled[i]
    -- EXPIRE 0 would delete the counter, so a TTL is at least one second; and at most 2^53 ms
    -- in seconds, beyond which EXPIRE fails ("invalid expire time") instead of meaning "forever".
    ttls[item.key] = math.min(math.max(item.ttl, 1), 9007199254740)
  end
end
for _, key in ipairs(order) do
  local count, foreign = stored_count({ key = key })
  local total = count + increments[key]
  if foreign or total > 9007199254740991 then
    -- Not a counter we can INCRBY (or it would leave the exact range): set the value outright,
    -- saturated at 2^53 - 1 (still far above any limit, so still denying).
    redis.call('SET', key, int_str(math.min(total, 9007199254740991)), 'EX', int_str(ttls[key]))
  else
    redis.call('INCRBY', key, int_str(increments[key]))
    redis.call('EXPIRE', key, int_str(ttls[key]))
  end
end

-- Other algorithms: write each touched key's final state, in first-appearance order.
local written = {}
for i = 1, nitems do
  local item = items[i]
  local entry = overlay[item.key]
  if item.algorithm ~= 0 and entry ~= nil and not written[item.key] and entry.algorithm ~= 0 then
    written[item.key] = true
    local writer = items[entry.writer]
    local algorithm = ALGORITHMS[entry.algorithm]
    local old = raw_value(item.key)
    if entry.state then
      local value = int_str(entry.algorithm) .. ':' .. int_str(writer.lim.window_us) .. ':'
        .. algorithm.encode(writer.lim, entry.state)
      if value ~= old then
        -- Milliseconds rounded up: the key outlives the state's last relevant µs.
        local at_ms = math.ceil(algorithm.expires(writer.lim, entry.state) / 1000)
        redis.call('SET', item.key, value, 'PXAT', int_str(at_ms))
      end
    elseif old then
      redis.call('DEL', item.key)
    end
  end
end

local reply = { reply_int(now) }
for i = 1, nitems do
  local d = decisions[i]
  reply[#reply + 1] = d.allowed and 1 or 0
  reply[#reply + 1] = reply_int(d.remaining)
  reply[#reply + 1] = reply_int(d.reset)
  reply[#reply + 1] = reply_int(d.retry)
end
return reply
