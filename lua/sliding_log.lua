-- sliding_log.lua: the exact sliding window over a log of admitted requests, decided in Redis.
-- Mirrors src/algorithm/sliding_log.rs field for field (same module docs for remaining/reset/retry).
--
-- Part of Tollgate's batch script (exact.lua + the five algorithm files + batch.lua, concatenated
-- into one chunk; batch.lua reads KEYS/ARGV and performs every Redis call). This file defines
-- `sliding_log_decide` and `sliding_log_refund` (each handles one item and writes nothing),
-- `sliding_log_expires`, `sliding_log_encode` and `sliding_log_decode`.
--
-- Representation: struct.pack('<Bd', 2, window_us) (batch.lua checks the algorithm byte, the
-- decode below the window) followed by 16 bytes per entry, struct.pack('<dd', timestamp_us, cost), oldest first,
-- each cost >= 1; an empty log is never stored. Entries are sorted and have distinct
-- timestamps; admitting drops expired ones, and an admission needs live total + cost <=
-- requests, so the log holds at most `requests` entries (memory bounded as in Rust). Set with
-- PXAT = expiry of the newest entry, so every key has a TTL.
--
-- Arguments: `lim` = { requests, window_us, w = max(window_us, 1), burst }; `st` = { at = {...},
-- c = {...} } (parallel arrays, oldest first) or nil; `now` = Redis TIME in µs; `cost` (or a
-- refund's `amount`) >= 0.
-- Returns: allowed, remaining, reset_after_us, retry_after_us, next state (`st` itself when
-- unchanged: denials, peeks, and refunds with no live entry to take from).
--
-- Refunds (sliding_log::refund): the live entries are kept, then the newest of them removed
-- until `amount` is given back, the last one only in part if it holds more (its cost shrinks,
-- so every cost stays >= 1); an emptied log is no state (batch.lua deletes the key). Reported as
-- a peek of the new state sees it, allowed, no retry.
--
-- Atomicity: see batch.lua. Time: batch.lua's single TIME read.
--
-- Exactness: sums of costs are bounded by requests + cost and times by now + window: exact when
-- requests and costs are < 2^52 and instants + window_us < 2^53. Cost per decision: O(entries).

-- Index of the first live entry (at + w > now), #ats + 1 when none: binary search, the log is
-- sorted.
local function sliding_log_first(ats, w, now)
  local lo, hi = 1, #ats + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if ats[mid] + w <= now then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end

local function sliding_log_decide(lim, st, now, cost)
  local w = lim.w
  local ats, cs = {}, {}
  if st then
    ats, cs = st.at, st.c
  end
  local n = #ats
  local first = sliding_log_first(ats, w, now)
  local used = 0
  for i = first, n do
    used = used + cs[i]
  end
  local after = used + cost
  -- Time until the newest entry expires (0 when empty or already expired).
  local function reset_of(last_at)
    if last_at == nil then
      return 0
    end
    return math.max(last_at + w - now, 0)
  end
  if after > lim.requests then
    local reset = reset_of(ats[n])
    -- A cost above `requests` needs more freed than the log holds: full reset then.
    local retry = reset
    local excess = after - lim.requests
    local freed = 0
    for i = first, n do
      freed = freed + cs[i]
      if freed >= excess then
        retry = math.max(ats[i] + w - now, 0)
        break
      end
    end
    return false, 0, reset, retry, st
  end
  if cost == 0 then
    return true, lim.requests - after, reset_of(ats[n]), 0, st
  end
  -- Keep the live entries, then append (or merge into the newest) an entry stamped now, or the
  -- newest timestamp if the clock stepped back, so the log stays sorted.
  local nat, nc = {}, {}
  local m = 0
  for i = first, n do
    m = m + 1
    nat[m], nc[m] = ats[i], cs[i]
  end
  local stamp = now
  if m > 0 and nat[m] > now then
    stamp = nat[m]
  end
  if m > 0 and nat[m] == stamp then
    nc[m] = nc[m] + cost
  else
    m = m + 1
    nat[m], nc[m] = stamp, cost
  end
  return true, lim.requests - after, reset_of(nat[m]), 0, { at = nat, c = nc }
end

local function sliding_log_refund(lim, st, now, amount)
  local next_state = st
  if st and amount > 0 then
    local ats, cs = st.at, st.c
    local first = sliding_log_first(ats, lim.w, now)
    if first <= #ats then
      local nat, nc, m = {}, {}, 0
      for i = first, #ats do
        m = m + 1
        nat[m], nc[m] = ats[i], cs[i]
      end
      local owed = amount
      while owed > 0 and m > 0 do
        if nc[m] > owed then
          nc[m] = nc[m] - owed
          owed = 0
        else
          owed = owed - nc[m]
          nat[m], nc[m] = nil, nil
          m = m - 1
        end
      end
      next_state = { at = nat, c = nc }
    end
  end
  local _, left, reset = sliding_log_decide(lim, next_state, now, 0)
  return true, left, reset, 0, next_state
end

-- Expiry of the newest entry; an empty log is already expired.
local function sliding_log_expires(lim, st)
  local n = #st.at
  if n == 0 then
    return 0
  end
  return st.at[n] + lim.w
end

-- Entries packed or unpacked by one struct call: a C call per entry cost more than the rest of a
-- decision, while one call per chunk keeps the values it pushes (2 per entry) well within Lua's C
-- stack (8,000).
local LOG_CHUNK = 1000
-- '<' followed by k times 'dd', by k (made on first use: a library may not call string functions
-- while it loads).
local log_formats = {}
-- Scratch for encode: the entries of one chunk, interleaved (time, cost, time, cost, ...).
local log_flat = {}

local function log_format(k)
  local format = log_formats[k]
  if not format then
    format = '<' .. string.rep('dd', k)
    log_formats[k] = format
  end
  return format
end

local function sliding_log_encode(lim, st)
  local ats, cs = st.at, st.c
  local n = #ats
  local parts, m = { struct.pack('<Bd', 2, lim.window_us) }, 1
  for from = 1, n, LOG_CHUNK do
    local k = math.min(LOG_CHUNK, n - from + 1)
    for j = 1, k do
      log_flat[2 * j - 1], log_flat[2 * j] = ats[from + j - 1], cs[from + j - 1]
    end
    m = m + 1
    parts[m] = struct.pack(log_format(k), unpack(log_flat, 1, 2 * k))
  end
  return table.concat(parts)
end

-- `value` is a stored value whose algorithm byte batch.lua checked; nil when malformed or of
-- another window.
local function sliding_log_decode(lim, value)
  local len = #value
  if len < 25 or math.fmod(len - 9, 16) ~= 0 or struct.unpack('<d', value, 2) ~= lim.window_us then
    return nil
  end
  local n = (len - 9) / 16
  local ats, cs, pos = {}, {}, 10
  for from = 1, n, LOG_CHUNK do
    local k = math.min(LOG_CHUNK, n - from + 1)
    -- 2k values, then the position after them.
    local values = { struct.unpack(log_format(k), value, pos) }
    for j = 1, k do
      ats[from + j - 1], cs[from + j - 1] = values[2 * j - 1], values[2 * j]
    end
    pos = values[2 * k + 1]
  end
  return { at = ats, c = cs }
end
