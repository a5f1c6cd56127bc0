-- gcra.lua: the Generic Cell Rate Algorithm, decided in Redis. Mirrors src/algorithm/gcra.rs
-- field for field (same module docs for remaining/reset/retry).
--
-- Part of Tollgate's batch script (exact.lua + the five algorithm files + batch.lua, concatenated
-- into one chunk; batch.lua reads KEYS/ARGV and performs every Redis call). This file defines
-- `gcra_decide` and `gcra_refund` (each handles one item and writes nothing), `gcra_expires`,
-- `gcra_encode` and `gcra_decode`.
--
-- Representation: exactly Rust's state, the theoretical arrival time `tat_us + tat_frac /
-- requests` µs (tat_frac < requests), stored as 25 bytes, struct.pack('<Bddd', 4, window_us,
-- tat_us, tat_frac) (batch.lua checks the algorithm byte, the decode below the window), set with PXAT = TAT
-- rounded up, so every key has a TTL. Keeping Rust's representation means a changed `requests` reinterprets the state
-- exactly as Rust does (the fraction clamped to requests - 1).
--
-- Arithmetic: Rust counts debt in ticks of 1 / requests µs, up to burst * window_us ticks
-- (3.2 * 10^19 for a burst of 10^6 over a year): too big for a double. Here the debt is split as
-- `d * window_us + e` with 0 <= e < window_us, i.e. d whole emission intervals plus a remainder,
-- and every product goes through muldiv.
--
-- Arguments: `lim` = { requests, window_us, w = max(window_us, 1), burst }; `st` = { tat, frac }
-- or nil; `now` = Redis TIME in µs; `cost` (or a refund's `amount`) >= 0.
-- Returns: allowed, remaining, reset_after_us, retry_after_us, next state (`st` itself when
-- unchanged: denials, peeks, requests == 0, and refunds of nothing or to a key without debt).
--
-- Refunds (gcra::refund): the debt d * window + e loses amount * window ticks, never going
-- below 0 (a TAT at now): since e < window, amount > d leaves no debt, else the debt is
-- (d - amount) * window + e, turned back into a TAT exactly as decide does; reported as a peek
-- of the new state sees it, allowed, no retry.
--
-- An expired state decides as no state (batch.lua's decides_expired_as_none): expired means the
-- TAT, rounded up, is <= now, so either tat < now or tat == now with frac == 0, and gcra_debt is
-- (0, 0) in both cases, as for no state; a denial returns `st`, which batch.lua then finds expired
-- and stores as none, as it would store nil.
--
-- Atomicity: see batch.lua. Time: batch.lua's single TIME read.
--
-- Exactness: all fields and the stored TAT are exact when requests, burst, costs and window_us
-- are < 2^52 and now + burst * window_us / requests (the latest TAT; also the longest reported
-- duration) is < 2^53 µs, i.e. a full replenishment shorter than ~230 years. Example: 10^6 per
-- day, or per 365 days, with a burst of 10^6: exact. 1 per 365 days with a burst of 10^6 (10^6
-- years to replenish): TAT and durations rounded to the nearest representable µs (finite, never
-- negative).

-- The debt at `now` (requests > 0): ahead * requests + frac ticks = d * window + e, 0 <= e < window.
local function gcra_debt(lim, st, now)
  local w, r = lim.w, lim.requests
  if st and st.tat >= now then
    local frac = math.min(st.frac, r - 1)
    local q, rem = muldiv(st.tat - now, r, w)
    local q2, e = divmod(rem + frac, w)
    return q + q2, e
  end
  return 0, 0
end

local function gcra_decide(lim, st, now, cost)
  local w, r, burst = lim.w, lim.requests, lim.burst
  if r == 0 then
    -- An infinite emission interval: every costed request is denied, like the token bucket.
    return never_refills(w, cost, st)
  end
  local d, e = gcra_debt(lim, st, now)
  -- New debt = (d + cost) * window + e; tolerance = burst * window.
  local nd = d + cost
  if nd > burst or (nd == burst and e > 0) then
    local reset = ceil_qr(muldiv_add(d, w, e, r))
    -- A cost above the burst never fits; the hint is then the full reset.
    local retry = reset
    if cost <= burst then
      retry = ceil_qr(muldiv_add(nd - burst, w, e, r))
    end
    return false, 0, reset, retry, st
  end
  -- floor((burst * window - new debt) / window)
  local remaining = burst - nd
  if e > 0 then
    remaining = remaining - 1
  end
  local q, m = muldiv_add(nd, w, e, r)
  local next_state = st
  if cost > 0 then
    next_state = { tat = now + q, frac = m }
  end
  return true, remaining, ceil_qr(q, m), 0, next_state
end

local function gcra_refund(lim, st, now, amount)
  local next_state = st
  if lim.requests > 0 and amount > 0 then
    local d, e = gcra_debt(lim, st, now)
    if amount > d then
      -- amount * window >= (d + 1) * window > d * window + e: no debt left, a full bucket.
      if d > 0 or e > 0 then
        next_state = { tat = now, frac = 0 }
      end
    else
      local q, m = muldiv_add(d - amount, lim.w, e, lim.requests)
      next_state = { tat = now + q, frac = m }
    end
  end
  local _, left, reset = gcra_decide(lim, next_state, now, 0)
  return true, left, reset, 0, next_state
end

-- TAT rounded up to a whole µs: from then on there is no debt.
local function gcra_expires(lim, st)
  if st.frac > 0 then
    return st.tat + 1
  end
  return st.tat
end

local function gcra_encode(lim, st)
  return struct.pack('<Bddd', 4, lim.window_us, st.tat, st.frac)
end

-- `value` is a stored value whose algorithm byte batch.lua checked; nil when malformed or of
-- another window, false when impossible (exact.lua): a field out of range, or the TAT too far ahead.
local function gcra_decode(lim, value, now)
  if #value ~= 25 then
    return nil
  end
  local window_us, tat, frac = struct.unpack('<ddd', value, 2)
  if window_us ~= lim.window_us then
    return nil
  end
  -- The TAT lies at most the whole burst's debt ahead (burst * window / requests µs), plus the
  -- clock's slack; a state further ahead is one this limit cannot reach (hand-made, or left by a
  -- limit reconfigured from a far slower rate) and would deny for that long. The debt is computed only
  -- for a TAT beyond the slack alone.
  local ahead = now + AHEAD_US
  if not (tat >= 0 and frac >= 0 and frac <= MAX_EXACT)
      or tat > ahead and not (lim.requests > 0 and tat <= ahead + lim.burst * lim.w / lim.requests) then
    return false
  end
  return { tat = tat, frac = frac }
end
