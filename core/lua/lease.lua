-- lease.lua: Tollgate's concurrency leases (src/store/lease.rs), one call per Acquire or Release.
--
-- Each key is a sorted set: member = lease id, score = the lease's expiry in µs since the epoch (Redis
-- clock). A member whose score is <= now has expired; every call first drops those of its keys
-- (ZREMRANGEBYSCORE), so an expired lease never counts, whether or not anybody released it.
--
-- KEYS: the sorted sets, in request order. In Redis Cluster they share a hash slot (the caller tags
--   them with the domain).
-- ARGV: [1] 'acquire', 'renew' or 'release'; [2] the lease id; for 'acquire' and 'renew' also [3] the
--   TTL in µs (> 0) and [4..] max_in_flight per key, in KEYS order (decimal, >= 0).
-- Returns: 'acquire'/'renew' -> { now_us, impossible, then per key: available (1/0), in_flight,
--   retry_after_us }; 'release' -> { now_us, impossible, then per key: released (1/0), in_flight }.
--   `impossible`: keys found holding something other than a sorted set, which no Tollgate writes
--   (core/src/store/redis/impossible_state.rs): each is deleted, and then serves leases as an empty set would.
--
-- Acquire and renew are all or none. A new lease ('acquire') may take a key's slot when the key holds
-- fewer than max_in_flight live leases and none under this id (so no two callers share a slot); a
-- renewal may extend a key's slot only where this id holds a live one, and takes nothing new. Only if
-- every key allows it is the lease written to every key (ZADD), with the key's expiry set to its
-- latest lease's (PEXPIREAT), so every key has a TTL and a set nobody touches again disappears with its
-- last lease. A refused call writes nothing but the purge of expired members.
-- Atomic: Redis runs the script without interleaving other commands, so the checks and the writes are
-- one step. Time: one TIME read; scores are below 2^53, exact as doubles.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op, id = ARGV[1], ARGV[2]

local reply = { now, 0 }

local function purge(key)
  local purged = redis.pcall('ZREMRANGEBYSCORE', key, '-inf', now)
  if type(purged) == 'table' and purged.err then
    -- Not a sorted set (WRONGTYPE): left as it is, every call on the key would fail.
    redis.call('DEL', key)
    reply[2] = reply[2] + 1
  end
end

local function expire_with_last_lease(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', key, math.ceil(tonumber(last[2]) / 1000))
  end
end

if op == 'acquire' or op == 'renew' then
  local ttl = tonumber(ARGV[3])
  if not ttl or ttl <= 0 then
    return redis.error_reply('ERR tollgate: lease ttl must be a positive number of µs')
  end
  local all = true
  for i, key in ipairs(KEYS) do
    local max = tonumber(ARGV[3 + i])
    if not max then
      return redis.error_reply('ERR tollgate: missing max_in_flight for key ' .. i)
    end
    purge(key)
    local in_flight = redis.call('ZCARD', key)
    local held = redis.call('ZSCORE', key, id)
    local retry = 0
    local available
    if op == 'renew' then
      available = held ~= false
    else
      available = not held and in_flight < max
    end
    if not available then
      all = false
      -- A full key frees a slot when its oldest lease expires; a renewal that finds no lease has
      -- nothing to wait for.
      local oldest = op == 'acquire' and redis.call('ZRANGE', key, 0, 0, 'WITHSCORES') or {}
      if oldest[2] then
        retry = math.max(tonumber(oldest[2]) - now, 0)
      end
    end
    reply[#reply + 1] = available and 1 or 0
    reply[#reply + 1] = in_flight
    reply[#reply + 1] = retry
  end
  if all then
    for i, key in ipairs(KEYS) do
      redis.call('ZADD', key, now + ttl, id)
      expire_with_last_lease(key)
      reply[2 + (i - 1) * 3 + 2] = redis.call('ZCARD', key)
    end
  end
  return reply
elseif op == 'release' then
  for _, key in ipairs(KEYS) do
    purge(key)
    local removed = redis.call('ZREM', key, id)
    reply[#reply + 1] = removed
    reply[#reply + 1] = redis.call('ZCARD', key)
  end
  return reply
end
return redis.error_reply('ERR tollgate: unknown lease operation')
