-- fixed_window.lua: envoyproxy/ratelimit's fixed window, decided in Redis. Mirrors
-- src/algorithm/fixed_window.rs field for field.
--
-- Part of Tollgate's batch script (exact.lua + the five algorithm files + batch.lua, concatenated
-- into one chunk; batch.lua reads KEYS/ARGV and performs every Redis call). This file only
-- defines `fixed_window_decide` and `fixed_window_refund`, which decide one item and write
-- nothing.
--
-- Representation (Go compatibility): KEYS[i] is the caller-named counter key of one window
-- (e.g. `domain_key_value_1700000000`, window start in seconds), holding a plain integer. The
-- caller passes the window start (µs) in ARGV; the key ends up as `INCRBY key settled_cost`
-- then `EXPIRE key ttl_secs` would leave it, as the Go service writes it (batch.lua). Denied
-- requests are counted too (Go compatibility); peeks (cost 0) never write. A refund lowers an
-- existing counter in place, keeping its TTL, and never creates one (batch.lua).
--
-- Arguments: `lim` = { requests, window_us, w = max(window_us, 1), burst }; `count` = the
-- counter as read (0 when absent); `now` = Redis TIME in µs; `window_start` = the caller's
-- window start in µs (the caller derives it from its clock corrected by the Redis clock offset);
-- `cost` / `amount` >= 0.
-- Returns: allowed, remaining (denied: what the window had room for before this item, less than its
-- cost), reset_after_us, retry_after_us, and the counter after this item.
--
-- Refunds (fixed_window::refund): the key names this window, so a charge made in a window that
-- has since rolled over is refunded from this window's counter (absent for a fresh window: 0,
-- nothing refunded), as in Rust.
--
-- Atomicity: see batch.lua (one script, no interleaving). Time: batch.lua's single TIME read.
--
-- Exactness: counters, requests and costs are exact below 2^53; beyond that comparisons still
-- err towards denying (rounding is monotone). reset_after = window_start + window - now, clamped
-- to [0, window] (equal to the Rust value whenever the caller's window is the one holding now).

local function fixed_window_decide(lim, count, now, cost, window_start)
  local until_end = window_start + lim.w - now
  if until_end < 0 then
    until_end = 0
  elseif until_end > lim.w then
    until_end = lim.w
  end
  -- A peek judges the counter as it stands; a costed request counts even when denied.
  local after = count + cost
  if after <= lim.requests then
    return true, lim.requests - after, until_end, 0, after
  end
  -- Denied, and counted anyway: `remaining` is the part of the cost the window had room for.
  return false, math.max(lim.requests - count, 0), until_end, until_end, after
end

-- Gives `amount` back to this window's counter, saturating at 0, and reports what a peek of the
-- new counter sees, allowed with no retry even while the counter is still above the limit.
local function fixed_window_refund(lim, count, now, amount, window_start)
  local after = math.max(count - amount, 0)
  local _, left, until_end = fixed_window_decide(lim, after, now, 0, window_start)
  return true, left, until_end, 0, after
end
