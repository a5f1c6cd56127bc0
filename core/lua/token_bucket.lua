-- token_bucket.lua: the continuously refilling token bucket, decided in Redis. Mirrors
-- src/algorithm/token_bucket.rs field for field (same module docs for remaining/reset/retry).
--
-- Part of Tollgate's batch script (exact.lua + the five algorithm files + batch.lua, concatenated
-- into one chunk; batch.lua reads KEYS/ARGV and performs every Redis call). This file defines
-- `token_bucket_decide` and `token_bucket_refund` (each handles one item and writes nothing),
-- `token_bucket_expires`, `token_bucket_encode` and `token_bucket_decode` (the stored value, see
-- Representation).
--
-- Representation: Rust keeps `credits = tokens * window_us` (refill: `requests` credits per µs),
-- which reaches burst * window_us (3.2 * 10^19 for 10^6 tokens a year) and does not fit a
-- double. Here the same credits are split as `t * window_us + f` with 0 <= f < window_us: whole
-- tokens t and the fraction f, each small. Stored as 49 bytes, struct.pack('<Bdddddd', 3,
-- window_us, requests, burst, t, f, updated_us) (batch.lua checks the algorithm byte, the
-- decode below the window; requests and burst are recorded only so that a reconfigured limit changes the stored
-- value and batch.lua rewrites the TTL), set with PXAT = the instant the bucket is full again, so
-- every key has a TTL. Doubles hold these integers (all < 2^53) exactly.
--
-- Arguments: `lim` = { requests, window_us, w = max(window_us, 1), burst }; `st` = { t, f, at }
-- or nil (a full bucket); `now` = Redis TIME in µs; `cost` (or a refund's `amount`) >= 0.
-- Returns: allowed, remaining, reset_after_us, retry_after_us, next state (`st` itself when
-- unchanged: denials, peeks, requests == 0, and refunds of nothing or to no state); a decision
-- that made a new state also returns its expiry (token_bucket_expires of it), which it computed
-- on the way, so that batch.lua need not compute it again.
--
-- Refunds (token_bucket::refund): refill as a decision does, then `amount` whole tokens back,
-- capped at `burst` (the fraction f is kept: t + amount < burst leaves credits below capacity,
-- since f < window_us); reported as a peek of the new state sees it, allowed, no retry.
--
-- An expired state decides as no state (batch.lua's decides_expired_as_none): expired means
-- st.at <= expiry <= now with the bucket refilled to burst by now, so token_bucket_level returns
-- (burst, 0, now, 0), exactly what it returns for no state; a denial returns `st`, which batch.lua
-- then finds expired and stores as none, as it would store nil.
--
-- Atomicity: see batch.lua. Time: batch.lua's single TIME read.
--
-- Exactness: every product (elapsed * requests, tokens * window_us) goes through muldiv, so all
-- fields are exact when requests, burst, costs and window_us are < 2^52, instants < 2^53, and the
-- true results (reset/retry in µs: at most burst * window_us / requests) are < 2^53 (285 years).
-- Example: 10^6 per day, or per 365 days, with a burst of 10^6: exact. 1 per 365 days with a burst
-- of 10^6: allowed/remaining and the stored state stay exact, durations beyond 285 years come back
-- rounded (never NaN/inf, never negative).

-- The bucket as of max(now, last update) (requests > 0): whole tokens t, fraction f, that
-- instant, and how far it lies after now.
local function token_bucket_level(lim, st, now)
  local w, r, burst = lim.w, lim.requests, lim.burst
  local t, f, updated = burst, 0, now
  if st then
    t, f, updated = st.t, st.f, st.at
  end
  -- A clock that stepped back mints no tokens; decide as of the last update.
  local at = math.max(now, updated)
  if t >= burst then
    -- At (or, after a burst reduction, above) capacity: capped.
    t, f = burst, 0
  elseif at > updated then
    -- Refill (at - updated) * requests credits = q whole tokens + m credits.
    local q, m = muldiv(at - updated, r, w)
    if f >= w - m then
      f = f - (w - m)
      q = q + 1
    else
      f = f + m
    end
    t = t + q
    if t >= burst then
      t, f = burst, 0
    end
  end
  return t, f, at, at - now
end

local function token_bucket_decide(lim, st, now, cost)
  local w, r, burst = lim.w, lim.requests, lim.burst
  if r == 0 then
    -- Nothing ever refills: every costed request is denied, even on a full bucket.
    return never_refills(w, cost, st)
  end
  local t, f, at, lag = token_bucket_level(lim, st, now)
  -- credits >= cost * window  <=>  t >= cost, since 0 <= f < window.
  if t < cost then
    local reset = lag + ceil_sub(burst - t, w, f, r)
    local retry = reset
    -- A cost above the capacity never fits; the hint is then the full reset.
    if cost <= burst then
      retry = lag + ceil_sub(cost - t, w, f, r)
    end
    return false, 0, reset, retry, st
  end
  local left = t - cost
  local reset = lag + ceil_sub(burst - left, w, f, r)
  local next_state, expiry = st, nil
  if cost > 0 then
    next_state = { t = left, f = f, at = at }
    -- token_bucket_expires(lim, next_state) is at + the same ceil_sub as `reset`: known already.
    expiry = now + reset
  end
  return true, left, reset, 0, next_state, expiry
end

local function token_bucket_refund(lim, st, now, amount)
  local next_state = st
  -- No state is a full bucket, and with requests == 0 the level never matters: nothing to do.
  if st and lim.requests > 0 and amount > 0 then
    local t, f, at = token_bucket_level(lim, st, now)
    if t + amount >= lim.burst then
      t, f = lim.burst, 0
    else
      t = t + amount
    end
    next_state = { t = t, f = f, at = at }
  end
  local _, left, reset = token_bucket_decide(lim, next_state, now, 0)
  return true, left, reset, 0, next_state
end

-- The instant the bucket is full again; with requests == 0 the state never matters.
local function token_bucket_expires(lim, st)
  if lim.requests == 0 then
    return st.at
  end
  return st.at + ceil_sub(lim.burst - st.t, lim.w, st.f, lim.requests)
end

local function token_bucket_encode(lim, st)
  return struct.pack('<Bdddddd', 3, lim.window_us, lim.requests, lim.burst, st.t, st.f, st.at)
end

-- `value` is a stored value whose algorithm byte batch.lua checked; nil when malformed or of
-- another window, false when impossible (exact.lua): t, f out of their ranges (f < window), or an
-- update later than an hour ahead of `now`.
local function token_bucket_decode(lim, value, now)
  if #value ~= 49 then
    return nil
  end
  local window_us, _, _, t, f, at = struct.unpack('<dddddd', value, 2)
  if window_us ~= lim.window_us then
    return nil
  end
  if not (t >= 0 and t <= MAX_EXACT and f >= 0 and f < lim.w and at >= 0 and at <= now + AHEAD_US) then
    return false
  end
  return { t = t, f = f, at = at }
end
