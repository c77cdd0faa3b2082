-- wq.lua - the server side of libwq's Redis engine: every operation of a
-- queue is one run of this script (EVALSHA, so it is atomic and the state
-- machine lives in one place, like src/shm/entry.c for shared memory).
--
-- Call: EVALSHA sha 1 <prefix> op holder slot reqid args...
--   prefix  "wq:{NAME}": every key of the queue is prefix..":x" and shares
--           the hash tag {NAME}, so a Redis Cluster keeps a queue in one
--           slot. Only the prefix is declared: the keys derived from it hash
--           to the same slot, which is what a cluster checks.
--   holder  the calling handle's lease id ("" for calls that hold nothing)
--   slot    the handle's connection number; reqid the request number on
--           it: a mutating call whose reply was lost (dropped connection)
--           is sent again with the same reqid and gets the first reply
--           back from the receipt, instead of running twice.
-- Replies: an array whose first element is 0 or a positive count on
-- success, or a negative errno (Linux numbering, checked by redis.c).
--
-- Keys of one queue (prefix P):
--   P:m   hash    settings ("cfg", packed, immutable) and counters
--   P:k   hash    key -> entry record (state bits, failures, times, fair tags)
--   P:q   list    queued keys in client-go order (default mode)
--   P:fp  zset    fair mode: queued keys by (priority, start tag, seq), all
--                 scores 0, members ordered by an encoded prefix + key
--   P:fa  zset    fair mode: queued keys by seq (the oldest-key share)
--   P:ft  hash    fair mode: hashed tenant|priority -> last start tag
--   P:fv  hash    fair mode: priority -> virtual time
--   P:d   zset    waiting keys by ready time (µs, server clock)
--   P:p   hash    processing key -> "holder epoch"
--   P:l   zset    holder -> lease deadline (µs)
--   P:h   hash    holder -> "host pid name client-id@run-id"
--   P:i   zset    idle keys (kept for a failure count or a result) by the
--                 time they became idle: the eviction order
--   P:r   hash    key -> result (code, wall time, message)
--   P:ra  zset    key -> result update time: the eviction order of results
--   P:b   list    doorbell: a blocked wq_get waits on it with BLPOP
--   P:db  list    drain bell: wq_shutdown_drain waits on it
--   P:x   hash    histogram buckets
--   P:z   hash    receipts: holder:slot -> reqid and the last reply
--
-- An entry's state bits: DIRTY (added, not yet handed out), QUEUED (in
-- P:q or the fair zsets), PROC (handed out), WAIT (in P:d), IDLE (kept
-- only for a failure count or a result). Legal combinations: DIRTY|QUEUED,
-- PROC, PROC|DIRTY, PROC|WAIT, WAIT, IDLE. A key with none is deleted.

local P = KEYS[1]
local M, K, Q, FP, FA, FT, FV = P..':m', P..':k', P..':q', P..':fp', P..':fa', P..':ft', P..':fv'
local D, PR, L, H, I = P..':d', P..':p', P..':l', P..':h', P..':i'
local R, RA, B, DB, X, Z = P..':r', P..':ra', P..':b', P..':db', P..':x', P..':z'
local op, holder, slot, reqid = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

-- Linux errno values (redis.c asserts they match <errno.h>).
local ENOENT, EAGAIN, EBUSY, EEXIST, EINVAL = 2, 11, 16, 17, 22
local ENOSPC, EIDRM, EBADMSG, ESHUTDOWN, ESTALE = 28, 43, 74, 108, 116

local DIRTY, QUEUED, PROC, WAIT, IDLE = 1, 2, 4, 8, 16
local HIST = 10                 -- finite buckets: 1e-8 s .. 10 s
local REC = '<BIddddi'          -- state fail tb ts seq tag prio

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])   -- µs

local function band(a, b) return bit.band(a, b) ~= 0 end

------------------------------------------------------------------------
-- Settings: packed once at creation, read by every call.
------------------------------------------------------------------------
local CFG = '<IIIiIIIdIddIIIdd'
local C
local function cfg()
  local s = redis.call('HGET', M, 'cfg')
  if not s then return nil end
  local c = {}
  c.cap, c.klen, c.flags, c.tsep, c.fshare, c.rcap, c.rlim, c.rlq, c.rlburst,
    c.rlb, c.rlm, c.rlmf, c.dur, c.lease, c.rlf, c.rls = struct.unpack(CFG, s)
  c.fair = bit.band(c.flags, 4) ~= 0
  c.metrics = bit.band(c.flags, 8) == 0
  C = c
  return c
end

------------------------------------------------------------------------
-- Entries
------------------------------------------------------------------------
local function eget(key)
  local r = redis.call('HGET', K, key)
  if not r then return nil end
  local e = {}
  e.st, e.fail, e.tb, e.ts, e.seq, e.tag, e.prio = struct.unpack(REC, r)
  return e
end

local function eput(key, e)
  redis.call('HSET', K, key, struct.pack(REC, e.st, e.fail, e.tb, e.ts, e.seq, e.tag, e.prio))
end

local function incr(f, n) return redis.call('HINCRBY', M, f, n) end
local function mget(f) return tonumber(redis.call('HGET', M, f) or '0') end
local function nextseq() return incr('sq', 1) end

-- client-go's histogram buckets, non-cumulative here (read cumulates).
local function observe(h, us)
  if not C.metrics then return end
  local bound, b = 0.01, 0        -- µs: 1e-8 s
  while b < HIST and us > bound do bound = bound * 10; b = b + 1 end
  redis.call('HINCRBY', X, h..b, 1)
  redis.call('HINCRBYFLOAT', X, h..'s', us / 1e6)
end

------------------------------------------------------------------------
-- Fair mode order (start-time fair queueing, as src/shm/fair.c)
------------------------------------------------------------------------
local function tenant(key)
  if C.tsep < 0 then return '' end
  local p = string.find(key, string.char(C.tsep), 1, true)
  return p and string.sub(key, 1, p - 1) or key
end

local function fmember(key, e)
  return string.format('%08x%014x%014x', 2147483647 - e.prio, e.tag, e.seq)..key
end

-- The key just became dirty: its add order and start tag.
local function fair_dirty(key, e)
  e.seq = nextseq()
  if not C.fair then return end
  local slots = C.cap * 4
  if slots > 65536 then slots = 65536 end
  local hx = tonumber(string.sub(redis.sha1hex(tenant(key)), 1, 8), 16) % slots
  local f = e.prio..'|'..hx
  local last = tonumber(redis.call('HGET', FT, f) or '0')
  local v = tonumber(redis.call('HGET', FV, e.prio) or '0')
  e.tag = (last > v and last or v) + 1
  redis.call('HSET', FT, f, e.tag)
end

local function enqueue(key, e)
  if C.fair then
    redis.call('ZADD', FP, 0, fmember(key, e))
    redis.call('ZADD', FA, e.seq, key)
  else
    redis.call('RPUSH', Q, key)
  end
end

local function dequeue(key, e)   -- a queued key leaves (wq_remove)
  if C.fair then
    redis.call('ZREM', FP, fmember(key, e))
    redis.call('ZREM', FA, key)
  else
    redis.call('LREM', Q, 1, key)
  end
end

local function queued_count()
  if C.fair then return redis.call('ZCARD', FA) end
  return redis.call('LLEN', Q)
end

-- The key the next hand-out takes, or nil.
local function front()
  if C.fair then
    local ticks = mget('ft')
    if (ticks + 1) % C.fshare == 0 then
      local r = redis.call('ZRANGE', FA, 0, 0)
      if r[1] then return r[1], false end
    end
    local r = redis.call('ZRANGE', FP, 0, 0)
    if not r[1] then return nil end
    return string.sub(r[1], 37), true
  end
  return redis.call('LPOP', Q), true
end

local function fair_pop(key, e, by_priority)
  incr('ft', 1)
  if by_priority then
    local v = tonumber(redis.call('HGET', FV, e.prio) or '0')
    if e.tag > v then redis.call('HSET', FV, e.prio, e.tag) end
  end
  redis.call('ZREM', FP, fmember(key, e))
  redis.call('ZREM', FA, key)
end

------------------------------------------------------------------------
-- Rate limiter (client-go's, as src/shm/limiter.c); delays in µs.
------------------------------------------------------------------------
local function when(e)
  local f, d = e.fail, 0
  -- Only the per-key limiters (exponential 1, fast-slow 4) count
  -- failures: client-go's bucket has no per-key state.
  if band(C.rlim, 5) then e.fail = f + 1 end
  if band(C.rlim, 1) then
    d = C.rlb * 2 ^ f
    if d > C.rlm or d ~= d then d = C.rlm end
  end
  if band(C.rlim, 4) then
    local x = (f + 1 <= C.rlmf) and C.rlf or C.rls
    if x > d then d = x end
  end
  if band(C.rlim, 2) then
    local tokens, last = tonumber(redis.call('HGET', M, 'bt') or C.rlburst), mget('bl')
    if last > now then last = now end
    tokens = tokens + (now - last) / 1e6 * C.rlq
    if not (tokens <= C.rlburst) then tokens = C.rlburst end
    tokens = tokens - 1
    redis.call('HSET', M, 'bt', string.format('%.17g', tokens), 'bl', now)
    if tokens < 0 then
      local x = -tokens / C.rlq * 1e6
      if x > d then d = x end
    end
  end
  d = math.floor(d)
  observe('r', d)
  return d
end

------------------------------------------------------------------------
-- Live keys, idle keys, results
------------------------------------------------------------------------
local function result_drop(key)
  if redis.call('HDEL', R, key) == 1 then redis.call('ZREM', RA, key) end
end

local function has_result(key) return redis.call('HEXISTS', R, key) == 1 end

-- The key leaves the queue for good, with its result.
local function release(key)
  result_drop(key)
  redis.call('HDEL', K, key)
  redis.call('ZREM', I, key)
end

-- Not processing, not dirty, not waiting any more: idle or gone.
local function settle(key, e)
  if e.fail > 0 or has_result(key) then
    e.st = IDLE
    eput(key, e)
    redis.call('ZADD', I, now, key)
    if e.fail > 0 then incr('fl', 1) end
    incr('live', -1)
  else
    release(key)
    incr('live', -1)
  end
end

-- An idle entry becomes live again.
local function unidle(key, e)
  redis.call('ZREM', I, key)
  if e.fail > 0 then incr('fl', -1) end
  incr('live', 1)
end

-- Room for `want` new entries: capacity bounds entries, and idle ones
-- (kept for a count or a result) give way, oldest first, as in shared
-- memory. false when the live keys alone fill the queue.
local function make_room(want)
  local live = mget('live')
  if live + want > C.cap then return false end
  local over = redis.call('HLEN', K) + want - C.cap
  while over > 0 do
    local old = redis.call('ZRANGE', I, 0, 0)
    if not old[1] then return false end
    local e = eget(old[1])
    if e and e.fail > 0 then incr('fl', -1) end
    release(old[1])
    over = over - 1
  end
  return true
end

------------------------------------------------------------------------
-- Moving keys: delays over, dead holders
------------------------------------------------------------------------
local function ring(bell, n)
  local have = redis.call('LLEN', bell)
  if have < n then
    for _ = have + 1, n do redis.call('RPUSH', bell, '1') end
  end
end

-- A key (not dirty) becomes dirty now: queued, or marked while processing.
local function mark_dirty(key, e, at)
  if band(e.st, WAIT) then redis.call('ZREM', D, key) end
  if band(e.st, PROC) then
    e.st = PROC + DIRTY
    if C.fair then fair_dirty(key, e) end
  else
    if e.st == IDLE then unidle(key, e) end
    e.st = DIRTY + QUEUED
    fair_dirty(key, e)
    enqueue(key, e)
  end
  e.tb = at
  eput(key, e)
  incr('dp', 1)
  incr('adds', 1)
end

-- Waiting keys whose time has come go to the queue (client-go's waiting
-- loop). Returns how many were queued.
local function promote()
  if mget('sd') == 1 then return 0 end
  local ready = redis.call('ZRANGEBYSCORE', D, '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1000)
  local n = 0
  for i = 1, #ready, 2 do
    local key, at = ready[i], tonumber(ready[i + 1])
    local e = eget(key)
    if e then
      mark_dirty(key, e, at)
      if not band(e.st, PROC) then n = n + 1 end
    else
      redis.call('ZREM', D, key)
    end
  end
  return n
end

-- A processing key whose holder is gone goes back: through the rate
-- limiter after a crash (a lease that expired), at once after a close or
-- when it was re-added meanwhile or the queue is shutting down.
local function requeue(key, crash)
  local e = eget(key)
  redis.call('HDEL', PR, key)
  incr('proc', -1)
  if not e then return end
  incr('ss', -e.ts)
  local delay = 0
  if crash then
    delay = when(e)
    incr('cr', 1)
    incr('retr', 1)
  end
  if band(e.st, DIRTY) or mget('sd') == 1 then delay = 0 end
  if delay > 0 then
    local ready = now + delay
    if band(e.st, WAIT) then
      local old = tonumber(redis.call('ZSCORE', D, key))
      if old and old < ready then ready = old end
    else
      e.seq = nextseq()
    end
    e.st = WAIT
    e.tb = ready
    eput(key, e)
    redis.call('ZADD', D, ready, key)
  else
    local was_dirty = band(e.st, DIRTY)
    if band(e.st, WAIT) then redis.call('ZREM', D, key) end
    e.st = DIRTY + QUEUED
    e.tb = now
    if was_dirty then
      if not C.fair then e.seq = nextseq() end
    else
      fair_dirty(key, e)
      incr('dp', 1)
    end
    eput(key, e)
    enqueue(key, e)
    ring(B, 1)
  end
end

local function keys_of(h)
  local out, all = {}, redis.call('HGETALL', PR)
  for i = 1, #all, 2 do
    local sp = string.find(all[i + 1], ' ', 1, true)
    if string.sub(all[i + 1], 1, sp - 1) == h then out[#out + 1] = all[i] end
  end
  return out
end

local function drop_holder(h, crash)
  local n = 0
  for _, key in ipairs(keys_of(h)) do requeue(key, crash); n = n + 1 end
  redis.call('ZREM', L, h)
  redis.call('HDEL', H, h)
  local z = redis.call('HKEYS', Z)
  for _, f in ipairs(z) do
    if string.sub(f, 1, #h + 1) == h..':' then redis.call('HDEL', Z, f) end
  end
  if n > 0 and mget('proc') == 0 then ring(DB, 1) end
  return n
end

-- Holders whose lease ran out lose their keys (crash requeues).
local function reap()
  local dead = redis.call('ZRANGEBYSCORE', L, '-inf', '('..now, 'LIMIT', 0, 100)
  local n = 0
  for _, h in ipairs(dead) do n = n + drop_holder(h, true) end
  return n
end

local function lease_renew()
  if holder ~= '' then redis.call('ZADD', L, now + C.lease * 1000, holder) end
end

------------------------------------------------------------------------
-- Receipts: a retried call gets the reply of the first run.
------------------------------------------------------------------------
local RF = holder..':'..slot
local function receipt()
  if reqid == '' then return nil end
  local r = redis.call('HGET', Z, RF)
  if not r then return nil end
  local sp = string.find(r, ' ', 1, true)
  if sp and string.sub(r, 1, sp - 1) == reqid then
    return cmsgpack.unpack(string.sub(r, sp + 1))
  end
  return nil
end

local function reply(r)
  if reqid ~= '' then redis.call('HSET', Z, RF, reqid..' '..cmsgpack.pack(r)) end
  return r
end

------------------------------------------------------------------------
-- Operations
------------------------------------------------------------------------
local ops = {}

-- open create excl cfg: create the queue with the packed settings, or
-- return the existing ones (the client compares them).
function ops.open()
  local create, excl, packed = ARGV[5], ARGV[6], ARGV[7]
  local s = redis.call('HGET', M, 'cfg')
  if s then
    if excl == '1' then return { -EEXIST } end
    return { 0, s, 0 }
  end
  if create ~= '1' then return { -ENOENT } end
  redis.call('HSET', M, 'cfg', packed, 'ver', 1, 'created', now, 'live', 0, 'proc', 0)
  return { 0, packed, 1 }
end

-- reg info: register (or renew) this holder.
function ops.reg()
  reap()
  redis.call('ZADD', L, now + C.lease * 1000, holder)
  redis.call('HSET', H, holder, ARGV[5])
  return { 0, now }
end

-- renew: the lease thread. Reaps first, so a lease that ran out is lost
-- for good even if its holder comes back before anyone else looked.
-- Reply: 0, and 1 when this holder had lost its lease.
function ops.renew()
  local lost = redis.call('ZSCORE', L, holder) == false
  reap()
  if redis.call('ZSCORE', L, holder) == false then lost = true end
  if lost and ARGV[5] then redis.call('HSET', H, holder, ARGV[5]) end
  redis.call('ZADD', L, now + C.lease * 1000, holder)
  return { 0, lost and 1 or 0, mget('proc') }
end

-- expire h...: holders whose connection is gone (found by the client).
function ops.expire()
  local n = 0
  for i = 5, #ARGV do
    if redis.call('ZSCORE', L, ARGV[i]) then n = n + drop_holder(ARGV[i], true) end
  end
  return { n }
end

-- close: this holder goes; its keys go back at once (not a crash).
function ops.close()
  return { drop_holder(holder, false) }
end

-- release host pid: give back at once the keys of holders on host with
-- pid (a supervisor's own killed worker: it waited for it).
function ops.release()
  local want = ARGV[5]..' '..ARGV[6]..' '
  local all, n = redis.call('HGETALL', H), 0
  for i = 1, #all, 2 do
    if string.sub(all[i + 1], 1, #want) == want then n = n + drop_holder(all[i], false) end
  end
  return { n }
end

-- add flags n (key prio after_us rl delayed)*n. All or none: the keys
-- that need a new entry must all fit. Reply: rc, then one result per key
-- (0 new or marked, 1 coalesced).
function ops.add()
  local r = receipt()
  if r then return r end
  if mget('sd') == 1 then return reply({ -ESHUTDOWN }) end
  local n = tonumber(ARGV[5])
  local fresh, seen = 0, {}
  for i = 0, n - 1 do
    local key = ARGV[6 + i * 5]
    if not seen[key] and redis.call('HEXISTS', K, key) == 0 then fresh = fresh + 1 end
    seen[key] = true
  end
  if fresh > 0 and not make_room(fresh) then return reply({ -ENOSPC }) end
  local out, queued = { 0 }, 0
  for i = 0, n - 1 do
    local b = 6 + i * 5
    local key, prio, after, rl, delayed = ARGV[b], tonumber(ARGV[b + 1]),
      tonumber(ARGV[b + 2]), ARGV[b + 3] == '1', ARGV[b + 4] == '1'
    local e = eget(key)
    local fresh1 = e == nil
    if fresh1 then
      e = { st = 0, fail = 0, tb = 0, ts = 0, seq = 0, tag = 0, prio = prio }
    end
    local res
    if not fresh1 and not delayed and band(e.st, DIRTY) then
      incr('coal', 1)
      if C.fair and prio > e.prio then
        if band(e.st, QUEUED) then
          redis.call('ZREM', FP, fmember(key, e))
          e.prio = prio
          redis.call('ZADD', FP, 0, fmember(key, e))
        else
          e.prio = prio
        end
        eput(key, e)
      end
      res = 1
    else
      local delay = after
      if delayed then
        if rl then
          local d = when(e)
          if delay == 0 or d < delay then delay = d end
          if e.fail > 0 and e.st == IDLE and e.fail == 1 then incr('fl', 1) end
        end
        incr('retr', 1)
      end
      if C.fair then
        if fresh1 or e.st == IDLE or e.st == PROC then
          e.prio = prio
        elseif prio > e.prio then
          if band(e.st, QUEUED) then redis.call('ZREM', FP, fmember(key, e)) end
          e.prio = prio
          if band(e.st, QUEUED) then redis.call('ZADD', FP, 0, fmember(key, e)) end
        end
      end
      if band(e.st, DIRTY) then
        incr('coal', 1)
        eput(key, e)
        res = 1
      elseif delay == 0 then
        if fresh1 then incr('live', 1) end
        mark_dirty(key, e, now)
        if not band(e.st, PROC) then queued = queued + 1 end
        res = 0
      else
        local ready = now + delay
        local f = redis.call('ZRANGE', D, 0, 0, 'WITHSCORES')
        if not f[2] or ready < tonumber(f[2]) then ring(B, 1) end   -- sleepers recompute
        if band(e.st, WAIT) then
          local old = tonumber(redis.call('ZSCORE', D, key))
          if old and ready < old then
            redis.call('ZADD', D, ready, key)
            e.tb = ready
          end
          eput(key, e)
          incr('coal', 1)
          res = 1
        else
          if fresh1 then incr('live', 1) end
          if e.st == IDLE then unidle(key, e) end
          e.st = (e.st == PROC) and (PROC + WAIT) or WAIT
          e.tb = ready
          e.seq = nextseq()
          eput(key, e)
          redis.call('ZADD', D, ready, key)
          res = 0
        end
      end
    end
    out[#out + 1] = res
  end
  if queued > 0 then ring(B, queued < 8 and queued or 8) end
  return reply(out)
end

-- The hand-out: the front key becomes this holder's, with a new epoch.
-- Reply: 0 key epoch | -EAGAIN next_ready_us now | -ESHUTDOWN.
local function get1()
  promote()
  local key, by_priority = front()
  if not key then
    if mget('sd') == 1 then ring(B, 1); return { -ESHUTDOWN } end
    local f = redis.call('ZRANGE', D, 0, 0, 'WITHSCORES')
    return { -EAGAIN, f[2] and tonumber(f[2]) or 0, now }
  end
  local e = eget(key)
  if not e then return { -EBADMSG, key } end
  if C.fair then fair_pop(key, e, by_priority) end
  local ep = incr('ep', 1)
  e.st = PROC
  observe('q', now > e.tb and now - e.tb or 0)
  e.ts = now
  eput(key, e)
  redis.call('HSET', PR, key, holder..' '..ep)
  incr('proc', 1)
  incr('dp', -1)
  incr('ss', now)
  if queued_count() > 0 then ring(B, 1) end
  return { 0, key, ep }
end

function ops.get()
  local r = receipt()
  if r then return r end
  reap()
  lease_renew()
  return reply(get1())
end

-- The holder is done: epoch "" when this handle does not know it (a done
-- for a key another process got, as shared memory allows).
local function done1(key, epoch, record, code, msg)
  local p = redis.call('HGET', PR, key)
  if not p then return epoch == '' and -ENOENT or -ESTALE end
  local sp = string.find(p, ' ', 1, true)
  if epoch ~= '' and (string.sub(p, 1, sp - 1) ~= holder or string.sub(p, sp + 1) ~= epoch) then
    return -ESTALE
  end
  local e = eget(key)
  if not e then return -EBADMSG end
  if record then
    redis.call('HSET', R, key, struct.pack('<id', code, now) .. msg)
    redis.call('ZADD', RA, now, key)
    if redis.call('ZCARD', RA) > C.rcap then
      local old = redis.call('ZRANGE', RA, 0, 0)[1]
      result_drop(old)
      local oe = eget(old)
      if oe and oe.st == IDLE and oe.fail == 0 then release(old) end
    end
  end
  redis.call('HDEL', PR, key)
  observe('w', now - e.ts)
  incr('ss', -e.ts)
  incr('proc', -1)
  if band(e.st, DIRTY) then
    e.st = DIRTY + QUEUED
    if not C.fair then e.seq = nextseq() end
    eput(key, e)
    enqueue(key, e)
    ring(B, 1)
  elseif band(e.st, WAIT) then
    e.st = WAIT
    eput(key, e)
  else
    settle(key, e)
  end
  if mget('proc') == 0 then ring(DB, 1) end
  return 0
end

-- done key epoch record code msg get: wq_done, wq_finish, and
-- with get = 1 wq_done_get (the get's reply follows a successful done).
function ops.done()
  local r = receipt()
  if r then return r end
  local rc = done1(ARGV[5], ARGV[6], ARGV[7] == '1', tonumber(ARGV[8]), ARGV[9])
  if rc < 0 or ARGV[10] ~= '1' then return reply({ rc }) end
  reap()
  lease_renew()
  return reply(get1())
end

function ops.len()
  promote()
  return { queued_count() }
end

-- shutdown: reply 0 and the shutdown generation a drain starts from
-- (every shutdown and resume raises it: a drain that sees it move was
-- cancelled).
function ops.shutdown()
  redis.call('HSET', M, 'sd', 1)
  local g = incr('sg', 1)
  ring(B, 1)
  ring(DB, 1)
  return { 0, g }
end

function ops.resume()
  redis.call('HSET', M, 'sd', 0)
  incr('sg', 1)
  redis.call('DEL', B)
  ring(DB, 1)
  if queued_count() > 0 or redis.call('ZCARD', D) > 0 then ring(B, 1) end
  return { 0 }
end

-- drain: reply processing count, shutdown generation, shutdown flag.
function ops.drain()
  reap()
  local n = mget('proc')
  if n == 0 then ring(DB, 1) end
  return { n, mget('sg'), mget('sd') }
end

function ops.forget()
  local key = ARGV[5]
  local e = eget(key)
  if not e or e.fail == 0 then return { 0 } end
  if e.st == IDLE then incr('fl', -1) end
  e.fail = 0
  if e.st == IDLE and not has_result(key) then
    release(key)
  else
    eput(key, e)
  end
  return { 0 }
end

function ops.remove()
  local r = receipt()
  if r then return r end
  local key = ARGV[5]
  local e = eget(key)
  if not e then return reply({ -ENOENT }) end
  if band(e.st, PROC) then return reply({ -EBUSY }) end
  if band(e.st, WAIT) then redis.call('ZREM', D, key) end
  if band(e.st, QUEUED) then dequeue(key, e); incr('dp', -1) end
  if e.st == IDLE then
    if e.fail > 0 then incr('fl', -1) end
  else
    incr('live', -1)
  end
  release(key)
  return reply({ 0 })
end

function ops.nreq()
  local e = eget(ARGV[5])
  return { e and e.fail or 0 }
end

-- result key: state, code, wall time, message.
function ops.result()
  local key = ARGV[5]
  local e = eget(key)
  local r = redis.call('HGET', R, key)
  local code, wall, msg = 0, 0, ''
  if r then
    code, wall = struct.unpack('<id', r)
    msg = string.sub(r, 13)
  end
  local state = 0
  if e and band(e.st, PROC) then state = 2
  elseif e and e.st ~= IDLE then state = 1
  elseif r then state = code == 0 and 3 or 4 end
  return { 0, state, code, wall, msg }
end

local function counts()
  local live_holders = redis.call('ZCOUNT', L, now, '+inf')
  return {
    queued_count(), mget('proc'), redis.call('ZCARD', D), mget('live'),
    live_holders, mget('adds'), mget('coal'), mget('retr'), mget('cr'),
    mget('sd'), mget('fl'), redis.call('HLEN', R), redis.call('ZCARD', I),
    mget('dp'), mget('ss'), now,
  }
end

-- stats: the counters (after promoting ready keys), next ready time.
function ops.stats()
  reap()
  promote()
  local c = counts()
  local f = redis.call('ZRANGE', D, 0, 0, 'WITHSCORES')
  c[#c + 1] = f[2] and tonumber(f[2]) or 0
  table.insert(c, 1, 0)
  return c
end

-- metrics: the counters, the histograms, the oldest processing start.
function ops.metrics()
  reap()
  promote()
  local c = counts()
  local oldest = now
  for _, key in ipairs(redis.call('HKEYS', PR)) do
    local e = eget(key)
    if e and e.ts < oldest then oldest = e.ts end
  end
  c[#c + 1] = oldest
  local hist = {}
  for _, h in ipairs({ 'q', 'w', 'r' }) do
    for b = 0, HIST do hist[#hist + 1] = tonumber(redis.call('HGET', X, h..b) or '0') end
    hist[#hist + 1] = redis.call('HGET', X, h..'s') or '0'
  end
  table.insert(c, 1, 0)
  c[#c + 1] = hist
  return c
end

-- dump phase cursor count: a page of keys with their records. Phase 0
-- walks the queued keys in hand-out order, phase 1 the others (HSCAN).
-- Reply: 0 next_phase next_cursor now, then per key: key record holder
-- result ready_time.
function ops.dump()
  if ARGV[5] == '0' and ARGV[6] == '0' then promote() end
  local phase, cur, cnt = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local out, keys = { 0, 0, '0', now }, {}
  if phase == 0 then
    if C.fair then
      for _, m in ipairs(redis.call('ZRANGE', FP, cur, cur + cnt - 1)) do
        keys[#keys + 1] = string.sub(m, 37)
      end
    else
      keys = redis.call('LRANGE', Q, cur, cur + cnt - 1)
    end
    if #keys < cnt then out[2], out[3] = 1, '0' else out[2], out[3] = 0, tostring(cur + #keys) end
  else
    local r = redis.call('HSCAN', K, ARGV[6], 'COUNT', cnt)
    out[2] = r[1] == '0' and 2 or 1
    out[3] = r[1]
    for i = 1, #r[2], 2 do
      local e = eget(r[2][i])
      if e and not band(e.st, QUEUED) then keys[#keys + 1] = r[2][i] end
    end
  end
  for _, key in ipairs(keys) do
    out[#out + 1] = key
    out[#out + 1] = redis.call('HGET', K, key) or ''
    local p = redis.call('HGET', PR, key)
    local info = ''
    if p then
      local h = string.sub(p, 1, string.find(p, ' ', 1, true) - 1)
      local alive = redis.call('ZSCORE', L, h)
      info = (redis.call('HGET', H, h) or '')..'\n'..((alive and tonumber(alive) >= now) and '1' or '0')
    end
    out[#out + 1] = info
    out[#out + 1] = redis.call('HGET', R, key) or ''
    out[#out + 1] = tonumber(redis.call('ZSCORE', D, key) or '0')
  end
  return out
end

-- check repair: every invariant between the entries and the structures.
-- Reply: number of violations, then their descriptions.
function ops.check()
  local repair = ARGV[5] == '1'
  local v = { 0 }
  local function bad(what) v[#v + 1] = what end
  local all = redis.call('HGETALL', K)
  local live, dirty, idle_fail, procn = 0, 0, 0, 0
  local inq = {}
  if not C.fair then
    for i, key in ipairs(redis.call('LRANGE', Q, 0, -1)) do
      if inq[key] then bad('key "'..key..'" is in the FIFO twice') end
      inq[key] = i
    end
  else
    for _, key in ipairs(redis.call('ZRANGE', FA, 0, -1)) do inq[key] = 1 end
  end
  local states = {}
  for i = 1, #all, 2 do
    local key = all[i]
    local ok, st, fail = pcall(struct.unpack, REC, all[i + 1])
    if not ok then
      bad('key "'..key..'": record unreadable')
    else
      states[key] = st
      local legal = st == DIRTY + QUEUED or st == PROC or st == PROC + DIRTY or
        st == PROC + WAIT or st == WAIT or st == IDLE
      if not legal then bad('key "'..key..'": illegal state '..st) end
      if st ~= IDLE then live = live + 1 elseif fail > 0 then idle_fail = idle_fail + 1 end
      if band(st, DIRTY) then dirty = dirty + 1 end
      if band(st, PROC) then
        procn = procn + 1
        if not redis.call('HGET', PR, key) then bad('key "'..key..'" is processing without a holder') end
      end
      if band(st, QUEUED) and not inq[key] then bad('key "'..key..'" is queued but not in the FIFO') end
      if not band(st, QUEUED) and inq[key] then bad('key "'..key..'" is in the FIFO but not queued') end
      if band(st, WAIT) ~= (redis.call('ZSCORE', D, key) ~= false) then
        bad('key "'..key..'": waiting state and delay set disagree')
      end
    end
  end
  for key in pairs(inq) do
    if not states[key] then bad('key "'..key..'" is in the FIFO without an entry') end
  end
  for _, key in ipairs(redis.call('HKEYS', PR)) do
    if not states[key] or not band(states[key], PROC) then
      bad('key "'..key..'" has a holder but is not processing')
    end
  end
  local function counter(name, field, want)
    if mget(field) ~= want then
      bad(name..' counter is '..mget(field)..', not '..want)
      if repair then redis.call('HSET', M, field, want) end
    end
  end
  counter('live', 'live', live)
  counter('processing', 'proc', procn)
  counter('dirty', 'dp', dirty)
  counter('failing', 'fl', idle_fail)
  if repair and #v > 1 then
    -- Rebuild the containers from the entries, which are the truth.
    if not C.fair then
      local order = {}
      for key in pairs(states) do
        if band(states[key], QUEUED) then
          order[#order + 1] = { key, inq[key] or math.huge }
        end
      end
      table.sort(order, function(a, b) return a[2] < b[2] end)
      redis.call('DEL', Q)
      for _, o in ipairs(order) do redis.call('RPUSH', Q, o[1]) end
    end
    for _, key in ipairs(redis.call('HKEYS', PR)) do
      if not states[key] or not band(states[key], PROC) then redis.call('HDEL', PR, key) end
    end
    for key, st in pairs(states) do
      if band(st, PROC) and not redis.call('HGET', PR, key) then
        redis.call('HSET', PR, key, 'repaired 0')
        redis.call('ZADD', L, 0, 'repaired')
      end
    end
    reap()
  end
  v[1] = #v - 1
  return v
end

-- unlink: every key of the queue goes.
function ops.unlink()
  local n = redis.call('DEL', M, K, Q, FP, FA, FT, FV, D, PR, L, H, I, R, RA, X, Z)
  ring(B, 1)
  redis.call('EXPIRE', B, 5)
  ring(DB, 1)
  redis.call('EXPIRE', DB, 5)
  return { n > 0 and 0 or -ENOENT }
end

-- Every operation but open and unlink needs the queue.
local fn = ops[op]
if not fn then return { -EINVAL } end
if op ~= 'open' and op ~= 'unlink' and not cfg() then return { -EIDRM } end
return fn()
