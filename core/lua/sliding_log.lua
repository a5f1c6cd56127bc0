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
-- timestamps; an admission needs live total + cost <= requests, so a log holds at most
-- `requests` live entries, and an admission cuts the expired ones once they are a quarter of the
-- log, so it holds at most about 4/3 of `requests` entries in all (memory bounded, as in Rust,
-- which cuts them at every admission; the decisions are the same). Set with PXAT = expiry of the
-- newest entry, so every key has a TTL.
--
-- Arguments: `lim` = { requests, window_us, w = max(window_us, 1), burst }; `st` = { v = the
-- stored value as above, n = its entry count } or nil; `now` = Redis TIME in µs; `cost` (or a
-- refund's `amount`) >= 0.
-- Returns: allowed, remaining, reset_after_us, retry_after_us, next state (`st` itself when
-- unchanged: denials, peeks, and refunds with no live entry to take from); an admission also
-- returns its new state's expiry, known on the way.
--
-- The state is the stored string itself, never unpacked into tables: a decision reads the
-- timestamps a binary search needs and the live entries' costs (one struct call per eight
-- entries), and builds the next log by appending one packed entry to the stored one (cutting its
-- expired entries once they are a quarter of it).
-- A log of 100 entries used to be unpacked into tables, copied and packed again on every
-- decision, which cost Redis more than twice as much.
--
-- Refunds (sliding_log::refund): the live entries are kept, then the newest of them removed
-- until `amount` is given back, the last one only in part if it holds more (its cost shrinks,
-- so every cost stays >= 1); an emptied log is no state (batch.lua deletes the key). Reported as
-- a peek of the new state sees it, allowed, no retry.
--
-- Atomicity: see batch.lua. Time: batch.lua's single TIME read.
--
-- Exactness: sums of costs are bounded by requests + cost and times by now + window: exact when
-- requests and costs are < 2^52 and instants + window_us < 2^53. Cost per decision: O(entries)
-- additions and bytes copied, in O(entries / 8) struct calls.

-- The byte where entry i (from 1) of a stored value starts: after the 9-byte header.
local function entry_pos(i)
  return 16 * i - 6
end

-- The timestamp of entry i of `v`.
local function entry_at(v, i)
  return (struct.unpack('<d', v, entry_pos(i)))
end

-- Eight entries at once: one struct call, its values passed straight to add8, so that summing a log
-- allocates no table (a table of a log's values cost more than the sum; so did a format skipping the
-- timestamps, which struct walks byte by byte).
local EIGHT_ENTRIES = '<dddddddddddddddd'

-- `used` plus the costs of eight unpacked entries (timestamp, cost pairs), and the position after them.
local function add8(used, _, c1, _, c2, _, c3, _, c4, _, c5, _, c6, _, c7, _, c8, pos)
  return used + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8, pos
end

-- The costs of entries from..to of `v`, summed (exact: the total a log holds is at most `requests`).
local function sum_costs(v, from, to)
  local used, pos, i = 0, entry_pos(from), from
  while i + 7 <= to do
    used, pos = add8(used, struct.unpack(EIGHT_ENTRIES, v, pos))
    i = i + 8
  end
  while i <= to do
    local _, cost
    _, cost, pos = struct.unpack('<dd', v, pos)
    used = used + cost
    i = i + 1
  end
  return used
end

-- The first entry from `from` on at which the running sum of the costs reaches `excess` (nil if none
-- up to `to`): eight entries at a time, then one by one within the eight that reach it.
local function reaching(v, from, to, excess)
  local freed, pos, i = 0, entry_pos(from), from
  while i + 7 <= to do
    local after, next_pos = add8(freed, struct.unpack(EIGHT_ENTRIES, v, pos))
    if after >= excess then
      break
    end
    freed, pos, i = after, next_pos, i + 8
  end
  while i <= to do
    local _, cost
    _, cost, pos = struct.unpack('<dd', v, pos)
    freed = freed + cost
    if freed >= excess then
      return i
    end
    i = i + 1
  end
  return nil
end

-- Index of the first live entry (at + w > now) of `st`, st.n + 1 when none: binary search, the
-- log is sorted.
local function sliding_log_first(st, w, now)
  local v, lo, hi = st.v, 1, st.n + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if entry_at(v, mid) + w <= now then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end

-- A log holding entries first..last of `st` (none when last < first), then `tail` (packed entries,
-- or '').
local function sliding_log_keep(lim, st, first, last, tail)
  local head
  if st and first == 1 and last == st.n then
    head = st.v
  elseif st then
    head = string.sub(st.v, 1, 9) .. string.sub(st.v, entry_pos(first), entry_pos(last + 1) - 1)
  else
    head = struct.pack('<Bd', 2, lim.window_us)
  end
  return { v = head .. tail, n = math.max(last - first + 1, 0) + #tail / 16 }
end

local function sliding_log_decide(lim, st, now, cost)
  local w = lim.w
  local n, first = 0, 1
  if st then
    n = st.n
    first = sliding_log_first(st, w, now)
  end
  local used = 0
  if first <= n then
    used = sum_costs(st.v, first, n)
  end
  local newest = n > 0 and entry_at(st.v, n)
  -- Costs are at least 1 and timestamps are Redis's clock: a live total out of range (NaN, an
  -- infinity, negative, beyond any limit) or a newest entry far ahead is impossible (exact.lua).
  -- Decided as no log, and flagged for batch.lua to repair.
  if newest and not (used >= 0 and used <= MAX_EXACT and newest >= 0 and newest <= now + AHEAD_US) then
    local ok, left, rst, rty, next_state, expiry = sliding_log_decide(lim, nil, now, cost)
    return ok, left, rst, rty, next_state, expiry, true
  end
  local after = used + cost
  -- Time until the newest entry expires (0 when empty or already expired).
  local reset = 0
  if newest then
    reset = math.max(newest + w - now, 0)
  end
  if after > lim.requests then
    -- A cost above `requests` needs more freed than the log holds: full reset then.
    local retry = reset
    if first <= n then
      local reached = reaching(st.v, first, n, after - lim.requests)
      if reached then
        retry = math.max(entry_at(st.v, reached) + w - now, 0)
      end
    end
    return false, 0, reset, retry, st
  end
  if cost == 0 then
    return true, lim.requests - after, reset, 0, st
  end
  -- Keep the live entries, then append (or merge into the newest) an entry stamped now, or the
  -- newest timestamp if the clock stepped back, so the log stays sorted. Expired entries are cut
  -- once they are a quarter of the log: cutting copies the log once more, and a log at its limit
  -- sees about one entry expire per admission, so most admissions append to the log as stored.
  local next_state
  local stamp = now
  if first <= n and newest > now then
    stamp = newest
  end
  local from = first
  if (first - 1) * 4 < n then
    from = 1
  end
  if first <= n and newest == stamp then
    local _, newest_cost = struct.unpack('<dd', st.v, entry_pos(n))
    next_state = sliding_log_keep(lim, st, from, n - 1, struct.pack('<dd', stamp, newest_cost + cost))
  else
    next_state = sliding_log_keep(lim, st, from, n, struct.pack('<dd', stamp, cost))
  end
  return true, lim.requests - after, stamp + w - now, 0, next_state, stamp + w
end

local function sliding_log_refund(lim, st, now, amount)
  local next_state = st
  if st and amount > 0 then
    local first = sliding_log_first(st, lim.w, now)
    if first <= st.n then
      -- Drop the newest entries until `amount` is given back; the last one reached may only shrink.
      local owed, last, tail = amount, st.n, ''
      while owed > 0 and last >= first do
        local at, c = struct.unpack('<dd', st.v, entry_pos(last))
        last = last - 1
        if c > owed then
          tail = struct.pack('<dd', at, c - owed)
          owed = 0
        else
          owed = owed - c
        end
      end
      next_state = sliding_log_keep(lim, st, first, last, tail)
    end
  end
  local _, left, reset = sliding_log_decide(lim, next_state, now, 0)
  return true, left, reset, 0, next_state
end

-- Expiry of the newest entry; an empty log is already expired.
local function sliding_log_expires(lim, st)
  if st.n == 0 then
    return 0
  end
  return entry_at(st.v, st.n) + lim.w
end

-- The state is kept as stored (its header names the window of the limit it was made under, which
-- batch.lua matched against the writer's).
local function sliding_log_encode(_, st)
  return st.v
end

-- `value` is a stored value whose algorithm byte batch.lua checked; nil when malformed or of
-- another window. An impossible log (exact.lua) is found by sliding_log_decide, from the newest
-- timestamp and the live total it reads anyway, rather than here by reading the log once more.
local function sliding_log_decode(lim, value)
  local len = #value
  if len < 25 or math.fmod(len - 9, 16) ~= 0 or struct.unpack('<d', value, 2) ~= lim.window_us then
    return nil
  end
  return { v = value, n = (len - 9) / 16 }
end
