-- fixed_window.lua: envoyproxy/ratelimit's fixed window, decided in Redis. Mirrors
-- src/algorithm/fixed_window.rs field for field.
--
-- Part of Tollgate's batch script (exact.lua + the five algorithm files + batch.lua, concatenated
-- into one chunk; batch.lua reads KEYS/ARGV and performs every Redis call). This file only
-- defines `fixed_window_decide`, which decides one item and writes nothing.
--
-- Representation (Go compatibility): KEYS[i] is the caller-named counter key of one window
-- (e.g. `domain_key_value_1700000000`, window start in seconds), holding a plain integer. The
-- caller passes the window start (µs) in ARGV; the key is written with `INCRBY key settled_cost`
-- then `EXPIRE key ttl_secs`, exactly as the Go service does (batch.lua). Denied requests are
-- counted too (Go compatibility); peeks (cost 0) never write.
--
-- Arguments: `lim` = { requests, window_us, w = max(window_us, 1), burst }; `count` = the
-- counter as read (0 when absent); `now` = Redis TIME in µs; `window_start` = the caller's
-- window start in µs (the caller derives it from its clock corrected by the Redis clock offset).
-- Returns: allowed, remaining, reset_after_us, retry_after_us, and the counter after this item.
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
  return false, 0, until_end, until_end, after
end
