"""The Lua scripts of the Redis stores: each one atomic, on one session's keys.

Every script touches only keys with the session's ``{session_id}`` hash tag, all
passed in ``KEYS``, so a session's scripts run on one slot of a cluster. Keys (see
:mod:`.sessions`): ``h`` the head hash, ``m`` the message list, ``r`` the
redactions hash, ``t`` the tombstone, ``l`` the writer lease, ``cm``/``cb`` the
checkpoints' metas and bodies.

A session whose message list or redactions are there without its head lost the
head behind the store's back (evicted under an ``allkeys-*`` or ``volatile-*``
``maxmemory-policy``, deleted by hand): the scripts answer that as damage naming
the key that is left (``{3, key}``, ``{'orphan', key}``), never as no session, and
no script but ``DELETE`` deletes a key it finds. The one exception is what an
expiry leaves: Redis drops a session's keys one by one, so for a moment a key can
outlive the head it expires with. Such a key is told apart by the tombstone (which
an expiry leaves and nothing else does) and by its own deadline, which is the
head's (every renewal sets them together): due within ``LEFTOVER_MS``. ``CREATE``
deletes only those; checkpoints kept under an id with no session (a checkpoint
store used on its own) are kept, and the new session lists them.
"""

from __future__ import annotations

_HEAD_FIELDS = "'count', 'head', 'writes', 'tail', 'state', 'state_hash', 'created', 'updated'"

LEFTOVER_MS = 1000
"""How soon a key found without its head must expire to count as the rest of an
expired session (its deadline is the head's; clocks inside one script agree)."""

_ORPHAN = f"""
-- true: key i is the rest of an expired session (see the module docstring)
local function leftover(i)
  if redis.call('EXISTS', KEYS[4]) == 0 then return false end
  local left = redis.call('PTTL', KEYS[i])
  return left >= 0 and left <= {LEFTOVER_MS}
end
-- the first of m, r (KEYS[2], KEYS[3]) there without the head and no leftover
local function orphan()
  for i = 2, 3 do
    if redis.call('EXISTS', KEYS[i]) == 1 and not leftover(i) then return KEYS[i] end
  end
  return false
end
"""

_RENEW_TTL = """
-- cp: the index in KEYS of the checkpoints' keys (cm, then cb): they expire together
-- with the session (SPEC §9)
local function renew(ttl, tomb, cp)
  if tonumber(ttl) > 0 then
    for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
    redis.call('PEXPIRE', KEYS[cp], ttl)
    redis.call('PEXPIRE', KEYS[cp + 1], ttl)
    redis.call('SET', KEYS[4], '1', 'PX', tomb)
  end
end
"""

READ = (
    _RENEW_TTL
    + _ORPHAN
    + f"""
-- KEYS: h m r t cm cb; ARGV: offset, limit (-1: to the end), back, ttl_ms, tomb_ms
local h = redis.call('HMGET', KEYS[1], {_HEAD_FIELDS})
if not h[4] then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {{2}} end
  local lost = orphan()
  if lost then return {{3, lost}} end
  return {{0, redis.call('EXISTS', KEYS[4])}}
end
local count = tonumber(h[1])
if not count then return {{2}} end
local offset = tonumber(ARGV[1])
local start = math.min(offset, count) - tonumber(ARGV[3])
if start < 0 then start = 0 end
local stop = -1
if tonumber(ARGV[2]) >= 0 then stop = offset + tonumber(ARGV[2]) end
local rows = {{}}
if stop == -1 or stop >= start then rows = redis.call('LRANGE', KEYS[2], start, stop) end
local red = {{}}
if redis.call('HLEN', KEYS[3]) > 0 then red = redis.call('HGETALL', KEYS[3]) end
renew(ARGV[4], ARGV[5], 5)
return {{1, h, start, rows, red}}
"""
)

HEAD = (
    _ORPHAN
    + f"""
-- KEYS: h m r t l
local h = redis.call('HMGET', KEYS[1], {_HEAD_FIELDS})
local lease = redis.call('GET', KEYS[5])
if not h[4] then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {{2}} end
  local lost = orphan()
  if lost then return {{3, lost}} end
  return {{0, redis.call('EXISTS', KEYS[4]), lease}}
end
local count = tonumber(h[1])
if not count then return {{2}} end
local last, lastr = false, false
if count > 0 then
  last = redis.call('LINDEX', KEYS[2], count - 1)
  lastr = redis.call('HGET', KEYS[3], tostring(count - 1))
end
return {{1, h, last, lastr, lease, redis.call('LLEN', KEYS[2])}}
"""
)

COMMIT = (
    _RENEW_TTL
    + _ORPHAN
    + """
-- KEYS: h m r t l cm cb
-- ARGV: 1 planned tail, 2 lease token ('' none), 3 rewrite, 4 count, 5 head,
--   6 writes, 7 tail, 8 updated, 9 has state, 10 state, 11 state hash, 12 ttl_ms,
--   13 tomb_ms, 14 planned start, 15 n rows; then the rows, then redaction pairs
local cur = redis.call('HGET', KEYS[1], 'tail')
if not cur then
  local lost = orphan()
  if lost then return {'orphan', lost} end
  return {'missing', redis.call('EXISTS', KEYS[4])}
end
local lease = redis.call('GET', KEYS[5])
if ARGV[2] ~= '' then
  if lease ~= ARGV[2] then return {'lease_lost'} end
elseif lease then
  return {'leased', lease}
end
if cur ~= ARGV[1] then return {'moved', cur} end
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[2], KEYS[3])
else
  local length = redis.call('LLEN', KEYS[2])
  if length ~= tonumber(ARGV[14]) then return {'bad_length', length} end
end
local n = tonumber(ARGV[15])
local i = 16
while n > 0 do
  local k = math.min(n, 4000)
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, i + k - 1))
  i = i + k
  n = n - k
end
while i < #ARGV do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('HSET', KEYS[1], 'count', ARGV[4], 'head', ARGV[5], 'writes', ARGV[6],
  'tail', ARGV[7], 'updated', ARGV[8])
if ARGV[9] == '1' then
  redis.call('HSET', KEYS[1], 'state', ARGV[10], 'state_hash', ARGV[11])
end
renew(ARGV[12], ARGV[13], 6)
return {'ok'}
"""
)

CREATE = (
    _RENEW_TTL
    + _ORPHAN
    + """
-- KEYS: h m r t cm cb; ARGV: created, tail, zero hash, ttl_ms, tomb_ms
local h = redis.call('HMGET', KEYS[1], 'created', 'updated', 'count', 'tail')
if h[4] then return {0, h[1], h[2], h[3], h[4]} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {2} end
local lost = orphan()
if lost then return {3, lost} end
-- Only the rest of an expired session goes, Redis was dropping it; checkpoints
-- kept under this id otherwise stay, and the new session lists them.
for _, i in ipairs({2, 3, 5, 6}) do
  if leftover(i) then redis.call('DEL', KEYS[i]) end
end
redis.call('HSET', KEYS[1], 'created', ARGV[1], 'updated', ARGV[1], 'count', '0',
  'head', ARGV[3], 'writes', '0', 'tail', ARGV[2])
renew(ARGV[4], ARGV[5], 5)
return {1}
"""
)

PROBE = (
    _ORPHAN
    + """
-- KEYS: h m r t. 1: the head is there; {3, key}: key is there without it; 0: neither
if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
local lost = orphan()
if lost then return {3, lost} end
return 0
"""
)

DELETE = """
-- KEYS: h m r t cm cb l; ARGV: this writer's lease token ('' none).
-- 1: deleted; {0, lease}: refused, another writer's lease is there.
local lease = redis.call('GET', KEYS[7])
if lease and lease ~= ARGV[1] then return {0, lease} end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
return 1
"""

ACQUIRE = """
-- KEYS: l; ARGV: token, ms, then the tokens of this store's own leases it could not
-- release (the connection was lost). Takes the lease when it is free, already this
-- token's (a sending whose answer was lost) or one of those: this store's own, held
-- by no block any more. Anyone else's live lease stays: 0.
local lease = redis.call('GET', KEYS[1])
local mine = not lease or lease == ARGV[1]
for i = 3, #ARGV do
  if lease == ARGV[i] then mine = true end
end
if not mine then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

RENEW = """
-- KEYS: l; ARGV: token, ms
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

RELEASE = """
-- KEYS: l; ARGV: tokens: the lease goes when it is one of them (this writer's own)
local lease = redis.call('GET', KEYS[1])
for i = 1, #ARGV do
  if lease == ARGV[i] then
    redis.call('DEL', KEYS[1])
    return 1
  end
end
return 0
"""

PUT_CHECKPOINT = """
-- KEYS: cm cb h; ARGV: checkpoint id, meta, body, max (0: keep all), cutoff ('': no age)
-- The rule of perdure.session.rules.evicted_checkpoints: ULIDs sorting before the
-- cutoff are too old; of the rest, the oldest past max.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local left = redis.call('PTTL', KEYS[3])
if left > 0 then  -- a session with a ttl: its checkpoints expire with it
  redis.call('PEXPIRE', KEYS[1], left)
  redis.call('PEXPIRE', KEYS[2], left)
end
local max = tonumber(ARGV[4])
local cutoff = ARGV[5]
if max > 0 or cutoff ~= '' then
  local ids = redis.call('HKEYS', KEYS[1])
  table.sort(ids)  -- ULIDs: sorted is oldest first
  local kept = {}
  for i = 1, #ids do
    local id = ids[i]
    if cutoff ~= '' and #id == 26 and id < cutoff and not string.find(id, '[^0-9A-Z]') then
      redis.call('HDEL', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
    else
      kept[#kept + 1] = id
    end
  end
  if max > 0 then
    for i = 1, #kept - max do
      redis.call('HDEL', KEYS[1], kept[i])
      redis.call('HDEL', KEYS[2], kept[i])
    end
  end
end
return 1
"""
