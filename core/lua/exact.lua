-- exact.lua: exact integer arithmetic on Lua numbers, shared by the algorithm files.
--
-- Part of Tollgate's batch script: the algorithm files and batch.lua are concatenated after this
-- file into one chunk (src/store/redis/script.rs), so these locals are visible to all of them.
-- KEYS / ARGV / return: none of its own (see batch.lua).
-- Atomicity and time: not applicable (pure functions, no Redis calls).
--
-- Why: Redis runs Lua 5.1, whose only number type is an IEEE double. Integers up to 2^53 are
-- exact, but the algorithms form products such as `burst * window_us` (up to 10^6 * 3.2 * 10^13
-- for a yearly window) that do not fit. Rather than scale limits down, the algorithms keep every
-- stored quantity below 2^53 (token counts split into whole tokens + a remainder, GCRA debt
-- split the same way) and route every product that could overflow through `muldiv`, which
-- computes floor(a * b / c) and (a * b) mod c exactly without ever forming a * b.
--
-- Contract of every helper: arguments are non-negative integers < 2^53 (c >= 1). Results are
-- exact whenever the true results are < 2^53; beyond that they are finite, merely rounded.

local TWO53 = 9007199254740992

-- floor(p / c) and p mod c. math.fmod is exact for doubles (C fmod never rounds), and
-- p - r is then an exact multiple of c, so the division is exact too. (Lua's `%` operator is
-- a - floor(a / b) * b, which rounds for large operands; it is never used on large values.)
local function divmod(p, c)
  local r = math.fmod(p, c)
  return (p - r) / c, r
end

-- floor(a * b / c) and (a * b) mod c, exact for a, b < 2^53, 1 <= c < 2^53 whenever the
-- quotient is < 2^53 (no 106-bit product is ever formed).
local function muldiv(a, b, c)
  local p = a * b
  -- A rounded product below 2^53 means the true one is below 2^53 too (rounding is monotone
  -- and 2^53 is representable), so it is exact.
  if p < TWO53 then
    return divmod(p, c)
  end
  -- a * b = a * bq * c + a * br: the first term's quotient is a * bq exactly; the second is
  -- accumulated bit by bit (Horner over a's bits), keeping (q, r) with prefix * br = q * c + r
  -- and r < c, so no intermediate exceeds 2^53.
  local bq, br = divmod(b, c)
  local bits, n = {}, 0
  local x = a
  while x > 0 do
    local bit = math.fmod(x, 2)
    n = n + 1
    bits[n] = bit
    x = (x - bit) / 2
  end
  local q, r = 0, 0
  for i = n, 1, -1 do
    -- Double: 2r >= c  <=>  r >= c - r; then 2r - c = r - (c - r), both exact.
    q = q * 2
    if r >= c - r then
      r = r - (c - r)
      q = q + 1
    else
      r = r + r
    end
    if bits[i] == 1 then
      if r >= c - br then
        r = r - (c - br)
        q = q + 1
      else
        r = r + br
      end
    end
  end
  return a * bq + q, r
end

-- ceil(x * w / d) given muldiv's quotient and remainder.
local function ceil_qr(q, r)
  if r > 0 then
    return q + 1
  end
  return q
end

-- floor((x * w + e) / d) and its remainder, for 0 <= e < w (and w, d < 2^52 so rem + e < 2^53).
local function muldiv_add(x, w, e, d)
  local q, rem = muldiv(x, w, d)
  local q2, m = divmod(rem + e, d)
  return q + q2, m
end

-- ceil((x * w - f) / d) for x >= 0, 0 <= f < w, x * w >= f (so x == 0 implies f == 0).
local function ceil_sub(x, w, f, d)
  if x <= 0 then
    return 0
  end
  local q, rem = muldiv(x, w, d)
  if rem >= f then
    return ceil_qr(q, rem - f)
  end
  -- x * w - f = q * d - (f - rem) = (q - dq) * d - dr with 0 <= dr < d: the ceiling is q - dq.
  local dq = divmod(f - rem, d)
  return q - dq
end

-- A decimal integer string for a Redis command or a stored value. tostring() would print
-- 1.7e+15 for large numbers (Lua 5.1 uses %.14g); %.0f prints every digit of an integer double,
-- and %d (a C long: 64 bits on the platforms Redis runs on) prints the same digits for integers
-- below 2^53 three times faster, so it is used there.
local function int_str(x)
  if x >= 0 and x < TWO53 then
    return string.format('%d', x)
  end
  return string.format('%.0f', x)
end

-- Stored states are validated when read (batch.lua's stored_state): a value of the right algorithm
-- and window whose fields no Tollgate could have written (NaN, an infinity, a negative count or one
-- beyond 2^53, an instant far ahead of Redis's clock) is *impossible*: the decode returns false,
-- batch.lua decides as from no state, removes or overwrites the value (it may have no TTL, and would
-- never heal), and flags the item in its reply so that Tollgate logs and counts it. Each field is
-- checked against a range (a comparison with NaN is false), inline: a helper function's call cost
-- Redis 6-11 % of a decision. A fraction in a count is not checked; it changes a decision by less
-- than one request.
--
-- The largest integer a double holds exactly (2^53 - 1).
local MAX_EXACT = TWO53 - 1
-- How far past Redis's clock a stored instant may lie: a clock that stepped back (a failover to a
-- node whose clock is behind) leaves states written ahead of it. An hour covers any such step.
local AHEAD_US = 3600000000

-- The decision of a limit with requests == 0 (nothing ever refills), as algorithm::never_refills:
-- a peek passes with nothing left; any costed request is denied with a retry hint of one window.
-- Returns allowed, remaining, reset_after_us, retry_after_us, state (unchanged).
local function never_refills(window_us, cost, st)
  if cost == 0 then
    return true, 0, 0, 0, st
  end
  return false, 0, window_us, window_us, st
end
