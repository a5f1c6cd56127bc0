-- sliding_window.lua: the two-window weighted counter, decided in Redis. Mirrors
-- src/algorithm/sliding_window.rs field for field (same module docs for remaining/reset/retry).
--
-- Part of Tollgate's batch script (exact.lua + the five algorithm files + batch.lua, concatenated
-- into one chunk; batch.lua reads KEYS/ARGV and performs every Redis call). This file defines
-- `sliding_window_decide` and `sliding_window_refund` (each handles one item and writes
-- nothing), `sliding_window_expires`, `sliding_window_encode` and `sliding_window_decode`.
--
-- Representation: 33 bytes, struct.pack('<Bddd', 1, window_us, window_start_us, current,
-- previous) (batch.lua checks the algorithm byte, the decode below the window), set with PXAT = the state's
-- expiry (end of the next window), so every key has a TTL.
--
-- Arguments: `lim` = { requests, window_us, w = max(window_us, 1), burst }; `st` = { start, cur,
-- prev } or nil; `now` = Redis TIME in µs; `cost` (or a refund's `amount`) >= 0.
-- Returns: allowed, remaining, reset_after_us, retry_after_us, next state (`st` itself when
-- unchanged: denials, peeks, and refunds with nothing to take off).
--
-- Refunds (sliding_window::refund): from the view decide uses (the window holding max(now, the
-- state's window)), `amount` comes off the current count, the rest off the previous one, each
-- saturating at 0; reported as a peek of the new state sees it, allowed, no retry.
--
-- Atomicity: see batch.lua. Time: batch.lua's single TIME read.
--
-- Exactness: the Rust `previous * (window - elapsed) vs (requests - current - cost) * window`
-- comparison is evaluated as ceil(previous * (window - elapsed) / window) via muldiv, never
-- forming the product, so every field is exact when requests, counts, costs and window_us are
-- < 2^52 and instants < 2^53 (any window up to 142 years, any requests up to 4.5 * 10^15).

-- µs from the view's instant until the estimate reaches 0.
local function sliding_window_reset(w, cur, prev, elapsed)
  if cur == 0 and prev == 0 then
    return 0
  end
  if cur == 0 then
    return w - elapsed
  end
  return 2 * w - elapsed
end

-- Smallest elapsed e in [0, w] with weight * (w - e) <= room * w.
local function sliding_window_earliest(weight, room, w)
  if weight == 0 or room >= weight then
    return 0
  end
  local q = muldiv(room, w, weight)
  return w - q
end

-- The state seen from the window holding `at` = max(now, the state's window start): that
-- window's start, the current and previous counts there, and lag = at - now.
local function sliding_window_view(w, st, now)
  -- A clock that stepped back into an earlier window must not forget the counts.
  local at = now
  if st and st.start > now then
    at = st.start
  end
  local start = at - math.fmod(at, w)
  local cur, prev = 0, 0
  if st then
    if st.start == start then
      cur, prev = st.cur, st.prev
    elseif st.start + w == start then
      prev = st.cur
    end
  end
  return at, start, cur, prev, at - now
end

local function sliding_window_decide(lim, st, now, cost)
  local w = lim.w
  local at, start, cur, prev, lag = sliding_window_view(w, st, now)
  local elapsed = at - start
  -- usage <= budget  <=>  prev * (w - elapsed) <= room * w  <=>  ceil(prev * (w - elapsed) / w) <= room
  local dq, dr = muldiv(prev, w - elapsed, w)
  local decayed = ceil_qr(dq, dr)
  local room = lim.requests - cur - cost
  if room < 0 or decayed > room then
    local reset = lag + sliding_window_reset(w, cur, prev, elapsed)
    local retry
    local room_later = lim.requests - cost
    if room_later < 0 then
      retry = reset
    else
      -- Still in this window: wait for the previous window's weight to decay enough.
      if room_later >= cur then
        local e = sliding_window_earliest(prev, room_later - cur, w)
        if e < w then
          retry = lag + math.max(e - elapsed, 0)
        end
      end
      -- Else after the roll-over, where `current` is the decaying weight.
      if retry == nil then
        retry = lag + (w - elapsed) + sliding_window_earliest(cur, room_later, w)
      end
    end
    return false, 0, reset, retry, st
  end
  local next_state = st
  if cost > 0 then
    cur = cur + cost
    next_state = { start = start, cur = cur, prev = prev }
  end
  return true, room - decayed, lag + sliding_window_reset(w, cur, prev, elapsed), 0, next_state
end

local function sliding_window_refund(lim, st, now, amount)
  local next_state = st
  if st and amount > 0 then
    local _, start, cur, prev = sliding_window_view(lim.w, st, now)
    local from_cur = math.min(amount, cur)
    local from_prev = math.min(amount - from_cur, prev)
    if from_cur > 0 or from_prev > 0 then
      next_state = { start = start, cur = cur - from_cur, prev = prev - from_prev }
    end
  end
  local _, left, reset = sliding_window_decide(lim, next_state, now, 0)
  return true, left, reset, 0, next_state
end

-- The instant the estimate reaches 0; from then on the state decides like no state.
local function sliding_window_expires(lim, st)
  return st.start + sliding_window_reset(lim.w, st.cur, st.prev, 0)
end

local function sliding_window_encode(lim, st)
  return struct.pack('<Bdddd', 1, lim.window_us, st.start, st.cur, st.prev)
end

-- `value` is a stored value whose algorithm byte batch.lua checked; nil when malformed or of
-- another window, false when impossible (exact.lua): counts out of range, or a window starting
-- later than an hour ahead of `now`.
local function sliding_window_decode(lim, value, now)
  if #value ~= 33 then
    return nil
  end
  local window_us, start, cur, prev = struct.unpack('<dddd', value, 2)
  if window_us ~= lim.window_us then
    return nil
  end
  if not (start >= 0 and start <= now + AHEAD_US and cur >= 0 and cur <= MAX_EXACT and prev >= 0
      and prev <= MAX_EXACT) then
    return false
  end
  return { start = start, cur = cur, prev = prev }
end
