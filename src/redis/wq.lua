#!lua name=@NAME@
-- wq.lua - the server side of libwq's Redis engine: a Redis function
-- library. Every operation on a queue is one call of the function @NAME@,
-- so it is atomic, and the state machine lives in this one file (as
-- src/shm/entry.c is the shared-memory one).
--
-- Why a function library rather than EVALSHA: an EVAL script rebuilds its
-- closures and tables on every call (20 us for this file, more than the
-- operation); a library is loaded once per server (FUNCTION LOAD; Redis
-- keeps it in RDB and AOF and sends it to replicas), its helpers live
-- across calls, and a call costs what it does. The name carries a hash of
-- this text (conn.c), so clients of different libwq versions never run
-- each other's code, and a server without it (restarted without
-- persistence, an old replica) gets it again on "Function not found".
--
-- Call: FCALL @NAME@ 1 <prefix> op holder slot reqid args...
--   prefix  "wq:{NAME}": every key of the queue is prefix..":x" and shares
--           the hash tag {NAME}, so a Redis Cluster keeps a queue in one
--           slot. Only the prefix is declared: the keys derived from it
--           hash to the same slot, which is what a cluster checks.
--   holder  the calling handle's lease id ("" for calls that hold nothing)
--   slot    the handle's connection number; reqid its request number. A
--           mutating call leaves a receipt (its reply) per holder:slot; a
--           call sent again after a dropped connection carries "r"..reqid
--           and gets the first reply back instead of running twice.
-- Replies: an array whose first element is 0 or a count on success, or a
-- negative errno (Linux numbering, checked by conn.c).
--
-- Keys of one queue (prefix P):
--   P:m   hash    "cfg": settings (packed, immutable); "st": counters
--                 (packed, rewritten by the call that changes them, in one
--                 HSET with its receipt "z:holder:slot"); "hq0".."hr10",
--                 "hqs", "hws", "hrs": histograms; "bt", "bl": the token
--                 bucket; "sd": the shutdown flag for readers
--   P:k   hash    key -> entry record (state, result flag, failures,
--                 times, fair tags)
--   P:q   list    queued keys in client-go order (default mode)
--   P:fp  zset    fair mode: queued keys by (priority, start tag, seq), all
--                 scores 0, members ordered by an encoded prefix + key
--   P:fa  zset    fair mode: queued keys by seq (the oldest-key share)
--   P:ft  hash    fair mode: hashed tenant|priority -> last start tag
--   P:fv  hash    fair mode: priority -> virtual time
--   P:d   zset    waiting keys by ready time (us, server clock)
--   P:p   hash    processing key -> "holder epoch slot reqid"
--   P:l   zset    holder -> lease deadline (us)
--   P:h   hash    holder -> "host pid name client-id@run-id"
--   P:i   zset    idle keys (kept for a failure count or a result) by the
--                 time they became idle: the eviction order
--   P:r   hash    key -> result (code, wall time, message)
--   P:ra  zset    key -> result update time: the eviction order of results
--   P:b   list    doorbell: a blocked wq_get waits on it with BLPOP
--   P:db  list    drain bell: wq_shutdown_drain waits on it
--
-- An entry's state bits: DIRTY (added, not yet handed out), QUEUED (in
-- P:q or the fair zsets), PROC (handed out), WAIT (in P:d), IDLE (kept
-- only for a failure count or a result). Legal combinations: DIRTY|QUEUED,
-- PROC, PROC|DIRTY, PROC|WAIT, WAIT, IDLE. A key with none is deleted.
-- The record is the truth; wq_check repairs the containers from it.

-- Linux errno values (conn.c asserts they match <errno.h>).
local ENOENT, EAGAIN, EBUSY, EEXIST, EINVAL = 2, 11, 16, 17, 22
local ENOSPC, EIDRM, EBADMSG, ESHUTDOWN, ESTALE = 28, 43, 74, 108, 116

local DIRTY, QUEUED, PROC, WAIT, IDLE = 1, 2, 4, 8, 16
local HIST = 10                 -- finite buckets: 1e-8 s .. 10 s
local REC = '<BBIddddi'         -- state res fail tb ts seq tag prio
local CFG = '<IIIiIIIdIddIIIdd'
-- "st" in P:m: the queue's counters in one packed string, read with one
-- HGET and written with one HSET by every call that changes them (and
-- cached across calls, see keys_for). One string rather than fields
-- because a field costs a server call to read or write. The histograms
-- are fields of P:m ("hq0".."hq10", "hqs", ...) raised with HINCRBY:
-- packing them too would cost more (struct.pack of 54 doubles: 6 us).
local ST_FMT = '<dddddddddddddddddd'   -- 18 doubles: CTR_NAMES

-- Bound at the first call: while a library loads, only
-- redis.register_function is there to see.
local band, call

-- Per-call state (a library's locals outlive calls; these are reset by
-- every call before use).
local P, M, K, Q, FP, FA, FT, FV, D, PR, L, H, I, R, RA, B, DB
local holder, slot, reqid, resend, now, C, S, S_dirty, SD, ARGV

-- Per prefix, kept across calls: the key names, and the settings and
-- state as last read or written with the packed "st" string. A call that
-- reads the same string (Lua interns strings: one compare) uses the
-- tables as they are instead of decoding; "st" holds the queue's
-- creation time, so a queue removed and made again never matches. A
-- call takes the cache out while it runs, so one that fails midway
-- leaves none behind.
local cache, ncache = {}, 0
local function keys_for(prefix)
  local n = cache[prefix]
  if not n then
    if ncache >= 1024 then cache, ncache = {}, 0 end
    n = { keys = {} }
    for _, s in ipairs({ 'm', 'k', 'q', 'fp', 'fa', 'ft', 'fv', 'd', 'p', 'l', 'h', 'i', 'r',
                         'ra', 'b', 'db' }) do
      n.keys[#n.keys + 1] = prefix..':'..s
    end
    cache[prefix] = n
    ncache = ncache + 1
  end
  P = prefix
  M, K, Q, FP, FA, FT, FV, D, PR, L, H, I, R, RA, B, DB = unpack(n.keys)
  return n
end

------------------------------------------------------------------------
-- Settings and counters
------------------------------------------------------------------------
local function cfg_of(s)
  local c = {}
  c.cap, c.klen, c.flags, c.tsep, c.fshare, c.rcap, c.rlim, c.rlq, c.rlburst,
    c.rlb, c.rlm, c.rlmf, c.dur, c.lease, c.rlf, c.rls = struct.unpack(CFG, s)
  c.fair = band(c.flags, 4) ~= 0
  c.metrics = band(c.flags, 8) == 0
  return c
end

-- live keys, processing, dirty, (unused: kept so the layout stays), adds,
-- coalesced, retries, crash requeues, failing (idle with a count), epoch,
-- seq, entries, queued, waiting, fair ticks, shutdown generation,
-- shutdown flag, creation time
local CTR_NAMES = { 'live', 'proc', 'dp', 'ss', 'adds', 'coal', 'retr', 'cr', 'fl', 'ep',
                    'sq', 'ne', 'nq', 'nw', 'ft', 'sg', 'sd', 'created' }

local function st_of(s)
  local v = { struct.unpack(ST_FMT, s) }
  local t = {}
  for i = 1, 18 do t[CTR_NAMES[i]] = v[i] end
  return t
end

local function st_pack(t)
  return struct.pack(ST_FMT, t.live, t.proc, t.dp, t.ss, t.adds, t.coal, t.retr, t.cr, t.fl,
                     t.ep, t.sq, t.ne, t.nq, t.nw, t.ft, t.sg, t.sd, t.created)
end

local function incr(f, n) S[f] = S[f] + n; S_dirty = true end

------------------------------------------------------------------------
-- Entries
------------------------------------------------------------------------
local function eget(key)
  local r = call('HGET', K, key)
  if not r then return nil end
  local e = {}
  e.st, e.res, e.fail, e.tb, e.ts, e.seq, e.tag, e.prio = struct.unpack(REC, r)
  return e
end

local function eput(key, e)
  call('HSET', K, key, struct.pack(REC, e.st, e.res, e.fail, e.tb, e.ts, e.seq, e.tag, e.prio))
end

local function edel(key)
  call('HDEL', K, key)
  incr('ne', -1)
end

local function nextseq() incr('sq', 1); return S.sq end

-- client-go's histogram buckets, non-cumulative here (a read cumulates).
local function observe(h, us)
  if not C.metrics then return end
  local bound, b = 0.01, 0        -- us: 1e-8 s
  while b < HIST and us > bound do bound = bound * 10; b = b + 1 end
  call('HINCRBY', M, 'h'..h..b, 1)
  call('HINCRBY', M, 'h'..h..'s', math.floor(us))
end

------------------------------------------------------------------------
-- The doorbells
------------------------------------------------------------------------
-- One token wakes one blocked getter; a getter that takes a key while
-- more are queued rings again (the wake passes on), so a bell never
-- needs more than one token.
local function ring(bell)
  if call('LLEN', bell) == 0 then call('RPUSH', bell, '1') end
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

-- The key just became dirty: its add order and (fair mode) start tag.
local function dirtied(key, e)
  e.seq = nextseq()
  if not C.fair then return end
  local slots = C.cap * 4
  if slots > 65536 then slots = 65536 end
  local hx = tonumber(string.sub(redis.sha1hex(tenant(key)), 1, 8), 16) % slots
  local f = e.prio..'|'..hx
  local last = tonumber(call('HGET', FT, f) or '0')
  local v = tonumber(call('HGET', FV, e.prio) or '0')
  e.tag = (last > v and last or v) + 1
  call('HSET', FT, f, e.tag)
end

local function enqueue(key, e)
  if C.fair then
    call('ZADD', FP, 0, fmember(key, e))
    call('ZADD', FA, e.seq, key)
  else
    call('RPUSH', Q, key)
  end
  incr('nq', 1)
  if S.nq == 1 then ring(B) end   -- empty before: a getter may sleep
end

local function dequeue(key, e)   -- a queued key leaves (wq_remove)
  if C.fair then
    call('ZREM', FP, fmember(key, e))
    call('ZREM', FA, key)
  else
    call('LREM', Q, 1, key)
  end
  incr('nq', -1)
end

-- Raise a queued or dirty key's priority (fair mode merges keep the higher).
local function raise(key, e, prio)
  if not C.fair or prio <= e.prio then return false end
  if band(e.st, QUEUED) ~= 0 then call('ZREM', FP, fmember(key, e)) end
  e.prio = prio
  if band(e.st, QUEUED) ~= 0 then call('ZADD', FP, 0, fmember(key, e)) end
  return true
end

-- Take the key the next hand-out gets, or nil.
local function take()
  if S.nq <= 0 then return nil end
  if C.fair then
    local top = call('ZRANGE', FP, 0, 0)[1]
    if not top then return nil end
    local r = string.sub(top, 37)
    if (S.ft + 1) % C.fshare == 0 then   -- the oldest key's share
      r = call('ZRANGE', FA, 0, 0)[1] or r
    end
    local by_priority = r == string.sub(top, 37)
    local e = eget(r)
    if not e then return r, nil end
    incr('ft', 1)
    if by_priority then
      local v = tonumber(call('HGET', FV, e.prio) or '0')
      if e.tag > v then call('HSET', FV, e.prio, e.tag) end
    end
    call('ZREM', FP, fmember(r, e))
    call('ZREM', FA, r)
    incr('nq', -1)
    return r, e
  end
  local key = call('LPOP', Q)
  if not key then return nil end
  incr('nq', -1)
  return key, eget(key)
end

------------------------------------------------------------------------
-- Rate limiter (client-go's, as src/shm/limiter.c); delays in us.
------------------------------------------------------------------------
local function when(e)
  local f, d = e.fail, 0
  -- Only the per-key limiters (exponential 1, fast-slow 4) count
  -- failures: client-go's bucket has no per-key state.
  if band(C.rlim, 5) ~= 0 then e.fail = f + 1 end
  if band(C.rlim, 1) ~= 0 then
    d = C.rlb * 2 ^ f
    if d > C.rlm or d ~= d then d = C.rlm end
  end
  if band(C.rlim, 4) ~= 0 then
    local x = (f + 1 <= C.rlmf) and C.rlf or C.rls
    if x > d then d = x end
  end
  if band(C.rlim, 2) ~= 0 then
    local b = call('HMGET', M, 'bt', 'bl')
    local tokens, last = tonumber(b[1] or C.rlburst), tonumber(b[2] or now)
    if last > now then last = now end
    tokens = tokens + (now - last) / 1e6 * C.rlq
    if not (tokens <= C.rlburst) then tokens = C.rlburst end
    tokens = tokens - 1
    call('HSET', M, 'bt', string.format('%.17g', tokens), 'bl', now)
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
local function result_drop(key, e)
  if e.res == 1 then
    call('HDEL', R, key)
    call('ZREM', RA, key)
    e.res = 0
  end
end

-- The key leaves the queue for good, with its result.
local function release(key, e)
  result_drop(key, e)
  if e.st == IDLE then
    call('ZREM', I, key)
    if e.fail > 0 then incr('fl', -1) end
  end
  edel(key)
end

-- Processing ended and the key is neither dirty nor waiting: idle (kept
-- for its failure count or result) or gone.
local function settle(key, e)
  incr('live', -1)
  if e.fail > 0 or e.res == 1 then
    e.st = IDLE
    eput(key, e)
    call('ZADD', I, now, key)
    if e.fail > 0 then incr('fl', 1) end
  else
    e.st = 0
    edel(key)
  end
end

-- An idle entry becomes live again.
local function unidle(key, e)
  call('ZREM', I, key)
  if e.fail > 0 then incr('fl', -1) end
  incr('live', 1)
end

-- Room for `want` new entries: capacity bounds entries, and idle ones
-- give way, oldest first, as in shared memory (but never one of `keep`,
-- the keys being added). false when the live keys alone fill the queue.
local function make_room(want, keep)
  if S.live + want > C.cap then return false end
  local over, at = S.ne + want - C.cap, 0
  while over > 0 do
    local old = call('ZRANGE', I, at, at)[1]
    if not old then return false end
    if keep[old] ~= nil then
      at = at + 1
    else
      local e = eget(old)
      if e then release(old, e) else call('ZREM', I, old) end
      over = over - 1
    end
  end
  return true
end

local function record_result(key, e, code, msg)
  call('HSET', R, key, struct.pack('<id', code, now)..msg)
  call('ZADD', RA, now, key)
  e.res = 1
  if call('ZCARD', RA) > C.rcap then
    local old = call('ZRANGE', RA, 0, 0)[1]
    local oe = eget(old)
    if oe then
      result_drop(old, oe)
      if oe.st == IDLE and oe.fail == 0 then release(old, oe) else eput(old, oe) end
    else
      call('HDEL', R, old)
      call('ZREM', RA, old)
    end
  end
end

------------------------------------------------------------------------
-- Moving keys: delays over, dead holders
------------------------------------------------------------------------
local function wait_add(key, ready)
  local f = call('ZRANGE', D, 0, 0, 'WITHSCORES')
  if not f[2] or ready < tonumber(f[2]) then ring(B) end   -- sleepers recompute
  incr('nw', call('ZADD', D, ready, key))
end

local function wait_remove(key)
  incr('nw', -call('ZREM', D, key))
end

-- A key that is not dirty becomes dirty: queued, or marked while it is
-- processing (queued at its done). at: when it counts as added.
local function mark_dirty(key, e, at)
  if band(e.st, WAIT) ~= 0 then wait_remove(key) end
  if band(e.st, PROC) ~= 0 then
    e.st = PROC + DIRTY
    if C.fair then dirtied(key, e) end
  else
    if e.st == IDLE then unidle(key, e) end
    e.st = DIRTY + QUEUED
    dirtied(key, e)
    enqueue(key, e)
  end
  e.tb = at
  eput(key, e)
  incr('dp', 1)
  incr('adds', 1)
end

-- Waiting keys whose time has come go to the queue (client-go's waiting
-- loop), at most 1000 a call.
local function promote()
  if S.nw <= 0 or SD then return end
  local ready = call('ZRANGEBYSCORE', D, '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1000)
  for i = 1, #ready, 2 do
    local key, at = ready[i], tonumber(ready[i + 1])
    local e = eget(key)
    if e then mark_dirty(key, e, at) else wait_remove(key) end
  end
end

-- A processing key whose holder is gone goes back: through the rate
-- limiter after a crash (its lease ran out), at once after a close, or
-- when it was re-added meanwhile, or the queue is shutting down.
local function requeue(key, crash)
  call('HDEL', PR, key)
  incr('proc', -1)
  local e = eget(key)
  if not e then return end
  local delay = 0
  if crash then
    delay = when(e)
    incr('cr', 1)
    incr('retr', 1)
  end
  if band(e.st, DIRTY) ~= 0 or SD then delay = 0 end
  if delay > 0 then
    local ready = now + delay
    if band(e.st, WAIT) ~= 0 then
      local old = tonumber(call('ZSCORE', D, key))
      if old and old < ready then ready = old end
    else
      e.seq = nextseq()
    end
    e.st = WAIT
    e.tb = ready
    eput(key, e)
    wait_add(key, ready)
  else
    local was_dirty = band(e.st, DIRTY) ~= 0
    if band(e.st, WAIT) ~= 0 then wait_remove(key) end
    e.st = DIRTY + QUEUED
    e.tb = now
    if was_dirty then
      if not C.fair then e.seq = nextseq() end
    else
      dirtied(key, e)
      incr('dp', 1)
    end
    eput(key, e)
    enqueue(key, e)
  end
end

local function keys_of(h)
  local out, all = {}, call('HGETALL', PR)
  for i = 1, #all, 2 do
    local sp = string.find(all[i + 1], ' ', 1, true)
    if sp and string.sub(all[i + 1], 1, sp - 1) == h then out[#out + 1] = all[i] end
  end
  return out
end

local function drop_holder(h, crash)
  local n = 0
  for _, key in ipairs(keys_of(h)) do requeue(key, crash); n = n + 1 end
  call('ZREM', L, h)
  call('HDEL', H, h)
  local rp = 'z:'..h..':'   -- its receipts
  for _, f in ipairs(call('HKEYS', M)) do
    if string.sub(f, 1, #rp) == rp then call('HDEL', M, f) end
  end
  if n > 0 and S.proc == 0 then ring(DB) end
  return n
end

-- Holders whose lease ran out lose their keys (crash requeues).
local function reap()
  local n = 0
  for _, h in ipairs(call('ZRANGEBYSCORE', L, '-inf', '('..now, 'LIMIT', 0, 100)) do
    n = n + drop_holder(h, true)
  end
  return n
end

------------------------------------------------------------------------
-- Operations. Each returns its reply; `mut` ops leave a receipt.
------------------------------------------------------------------------
local ops, mut = {}, {}

-- open create excl cfg: create the queue with the packed settings, or
-- return the existing ones (the client compares them).
function ops.open()
  local s = call('HGET', M, 'cfg')
  if s then
    if ARGV[6] == '1' then return { -EEXIST } end
    return { 0, s, 0 }
  end
  if ARGV[5] ~= '1' then return { -ENOENT } end
  local z = {}
  for i = 1, 17 do z[i] = 0 end
  z[18] = now   -- created
  call('HSET', M, 'cfg', ARGV[7], 'st', struct.pack(ST_FMT, unpack(z)), 'ver', 1)
  return { 0, ARGV[7], 1 }
end

-- reg info: register (or renew) this holder.
function ops.reg()
  reap()
  call('ZADD', L, now + C.lease * 1000, holder)
  call('HSET', H, holder, ARGV[5])
  return { 0, now }
end

-- renew info: the lease thread, every lease/4 (at most a second). Reaps
-- first, so a lease that ran out is lost for good even if its holder
-- comes back before anyone else looked. Reply: 0, 1 when this holder had
-- lost its lease, the number of keys processing.
function ops.renew()
  local lost = call('ZSCORE', L, holder) == false
  reap()
  if call('ZSCORE', L, holder) == false then lost = true end
  call('HSET', H, holder, ARGV[5])
  call('ZADD', L, now + C.lease * 1000, holder)
  return { 0, lost and 1 or 0, S.proc }
end

-- expire h...: holders whose connection is gone (found by a client).
function ops.expire()
  local n = 0
  for i = 5, #ARGV do
    if call('ZSCORE', L, ARGV[i]) then n = n + drop_holder(ARGV[i], true) end
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
  local all, n = call('HGETALL', H), 0
  for i = 1, #all, 2 do
    if string.sub(all[i + 1], 1, #want) == want then n = n + drop_holder(all[i], false) end
  end
  return { n }
end

-- One add. Returns 0 (new or marked) or 1 (coalesced).
local function add1(key, e, prio, after, rl, delayed)
  if e and not delayed and band(e.st, DIRTY) ~= 0 then
    incr('coal', 1)
    if raise(key, e, prio) then eput(key, e) end
    return 1
  end
  local fresh = e == nil
  if fresh then
    e = { st = 0, res = 0, fail = 0, tb = 0, ts = 0, seq = 0, tag = 0, prio = prio }
    incr('ne', 1)
  end
  local delay = after
  if delayed then
    if rl then
      local was = e.fail
      local d = when(e)
      if delay == 0 or d < delay then delay = d end
      if e.st == IDLE and was == 0 and e.fail > 0 then incr('fl', 1) end
    end
    incr('retr', 1)
  end
  -- Priorities, as controller-runtime: a key idle or processing (handed
  -- out) takes the new add's; a queued or waiting one keeps the higher.
  if C.fair then
    if fresh or e.st == IDLE or e.st == PROC then e.prio = prio else raise(key, e, prio) end
  end
  if band(e.st, DIRTY) ~= 0 then
    incr('coal', 1)
    eput(key, e)
    return 1
  end
  if delay == 0 then
    if fresh then incr('live', 1) end
    mark_dirty(key, e, now)
    return 0
  end
  local ready = now + delay
  if band(e.st, WAIT) ~= 0 then
    local old = tonumber(call('ZSCORE', D, key))
    if old and ready < old then
      wait_add(key, ready)
      e.tb = ready
    end
    eput(key, e)
    incr('coal', 1)
    return 1
  end
  if fresh then incr('live', 1) end
  if e.st == IDLE then unidle(key, e) end
  e.st = e.st == PROC and PROC + WAIT or WAIT
  e.tb = ready
  e.seq = nextseq()
  eput(key, e)
  wait_add(key, ready)
  return 0
end

-- add n (key prio after_us rl delayed)*n. All or none: the keys that need
-- a new entry must all fit. Reply: 0, then one result per key.
function mut.add()
  if SD then return { -ESHUTDOWN } end
  local n = tonumber(ARGV[5])
  local rec, fresh = {}, 0   -- key -> its record, or false when new
  for i = 0, n - 1 do
    local key = ARGV[6 + i * 5]
    if rec[key] == nil then
      rec[key] = eget(key) or false
      if not rec[key] then fresh = fresh + 1 end
    end
  end
  if fresh > 0 and not make_room(fresh, rec) then return { -ENOSPC } end
  local out, seen = { 0 }, {}
  for i = 0, n - 1 do
    local b = 6 + i * 5
    local key = ARGV[b]
    -- a key met again in the batch: its record as the first add left it
    local e
    if seen[key] then e = eget(key) else e = rec[key] or nil end
    seen[key] = true
    out[i + 2] = add1(key, e, tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
                      ARGV[b + 3] == '1', ARGV[b + 4] == '1')
  end
  return out
end

-- The hand-out: the front key becomes this holder's, with a new epoch.
-- Reply: 0 key epoch | -EAGAIN next_ready_us now | -ESHUTDOWN.
local function get1()
  promote()
  local key, e = take()
  if not key then
    if SD then ring(B); return { -ESHUTDOWN } end
    local f = S.nw > 0 and call('ZRANGE', D, 0, 0, 'WITHSCORES') or {}
    return { -EAGAIN, f[2] and tonumber(f[2]) or 0, now }
  end
  if not e then return { -EBADMSG, key } end
  incr('ep', 1)
  e.st = PROC
  observe('q', now > e.tb and now - e.tb or 0)
  e.ts = now
  eput(key, e)
  call('HSET', PR, key, holder..' '..S.ep..' '..slot..' '..reqid)
  incr('proc', 1)
  incr('dp', -1)
  if S.nq > 0 then ring(B) end   -- pass the wake on
  return { 0, key, S.ep }
end

-- A holder takes keys only under a lease, or a key it took could
-- outlive it unseen by reap. Its lease thread keeps it; this puts back
-- one that was reaped (its lease ran out) before the thread noticed.
-- P:h and P:l always change together, and HEXISTS is the cheaper look.
local function lease_renew()
  if holder ~= '' and call('HEXISTS', H, holder) == 0 then
    call('ZADD', L, now + C.lease * 1000, holder)
    call('HSET', H, holder, '- 0 - 0@-')   -- its lease thread says who
  end
end

function mut.get()
  lease_renew()
  return get1()
end

-- Done: epoch "" when this handle does not know it (a done for a key
-- another process got, as shared memory allows).
local function done1(key, epoch, record, code, msg, forget)
  local p = call('HGET', PR, key)
  if not p then return epoch == '' and -ENOENT or -ESTALE end
  if epoch ~= '' then
    local h, ep = string.match(p, '^(%S+) (%S+)')
    if h ~= holder or ep ~= epoch then return -ESTALE end
  end
  local e = eget(key)
  if not e then return -EBADMSG end
  if forget then e.fail = 0 end   -- processing: not counted in 'fl'
  if record then record_result(key, e, code, msg) end
  call('HDEL', PR, key)
  observe('w', now - e.ts)
  incr('proc', -1)
  if band(e.st, DIRTY) ~= 0 then
    e.st = DIRTY + QUEUED
    if not C.fair then e.seq = nextseq() end
    eput(key, e)
    enqueue(key, e)
  elseif band(e.st, WAIT) ~= 0 then
    e.st = WAIT
    eput(key, e)
  else
    settle(key, e)
  end
  if S.proc == 0 and SD then ring(DB) end
  return 0
end

-- done key epoch record code msg get: wq_done, wq_finish (record 1; 2:
-- and forget, wq_finish_get's forget), and with get = 1 wq_done_get and
-- wq_finish_get (a done that worked answers with the get's reply).
function mut.done()
  local rc = done1(ARGV[5], ARGV[6], ARGV[7] ~= '0', tonumber(ARGV[8]), ARGV[9],
                   ARGV[7] == '2')
  if rc < 0 or ARGV[10] ~= '1' then return { rc } end
  lease_renew()
  return get1()
end

function ops.len()
  promote()
  return { S.nq }
end

-- shutdown: reply 0 and the shutdown generation a drain starts from
-- (every shutdown and resume raises it: a drain that sees it move was
-- cancelled).
function mut.shutdown()
  call('HSET', M, 'sd', '1')   -- for readers without the script
  SD = true
  incr('sd', 1 - S.sd)
  incr('sg', 1)
  ring(B)
  ring(DB)
  return { 0, S.sg }
end

function mut.resume()
  call('HSET', M, 'sd', '0')
  SD = false
  incr('sd', -S.sd)
  incr('sg', 1)
  call('DEL', B)
  ring(DB)
  if S.nq > 0 or S.nw > 0 then ring(B) end
  return { 0 }
end

-- drain: reply processing count, shutdown generation, shutdown flag.
function ops.drain()
  reap()
  if S.proc == 0 then ring(DB) end
  return { S.proc, S.sg, SD and 1 or 0 }
end

function mut.forget()
  local key = ARGV[5]
  local e = eget(key)
  if not e or e.fail == 0 then return { 0 } end
  if e.st == IDLE then incr('fl', -1) end
  e.fail = 0
  if e.st == IDLE and e.res == 0 then
    call('ZREM', I, key)
    edel(key)
  else
    eput(key, e)
  end
  return { 0 }
end

function mut.remove()
  local key = ARGV[5]
  local e = eget(key)
  if not e then return { -ENOENT } end
  if band(e.st, PROC) ~= 0 then return { -EBUSY } end
  if band(e.st, WAIT) ~= 0 then wait_remove(key) end
  if band(e.st, QUEUED) ~= 0 then dequeue(key, e); incr('dp', -1) end
  if e.st ~= IDLE then incr('live', -1) end
  release(key, e)
  return { 0 }
end

function ops.nreq()
  local e = eget(ARGV[5])
  return { e and e.fail or 0 }
end

-- result key: state, code, wall time, message.
function ops.result()
  local key = ARGV[5]
  local e = eget(key)
  local r = call('HGET', R, key)
  local code, wall, msg = 0, 0, ''
  if r then
    code, wall = struct.unpack('<id', r)
    msg = string.sub(r, 13)
  end
  local state = 0
  if e and band(e.st, PROC) ~= 0 then state = 2
  elseif e and e.st ~= IDLE then state = 1
  elseif r then state = code == 0 and 3 or 4 end
  return { 0, state, code, wall, msg }
end

local function counts()
  return {
    S.nq, S.proc, S.nw, S.live, call('ZCOUNT', L, now, '+inf'), S.adds, S.coal, S.retr,
    S.cr, SD and 1 or 0, S.fl, call('HLEN', R),
    call('ZCARD', I), S.dp, 0, now,   -- 0: metrics puts the running time here
  }
end

-- stats: the counters (after reaping and promoting), next ready time.
function ops.stats()
  reap()
  promote()
  local c = counts()
  local f = S.nw > 0 and call('ZRANGE', D, 0, 0, 'WITHSCORES') or {}
  c[#c + 1] = f[2] and tonumber(f[2]) or 0
  table.insert(c, 1, 0)
  return c
end

-- metrics: the counters, the oldest processing start, the histograms.
function ops.metrics()
  reap()
  promote()
  local c = counts()
  -- The time the processing keys have run so far, summed here rather
  -- than kept as a running sum of start times: those are ~1.7e15 us, and
  -- a sum of a few of them is past what a double holds exactly.
  local oldest, running = now, 0
  for _, key in ipairs(call('HKEYS', PR)) do
    local e = eget(key)
    if e then
      if e.ts < oldest then oldest = e.ts end
      if e.ts < now then running = running + (now - e.ts) end
    end
  end
  c[15] = running
  c[#c + 1] = oldest
  local hist = {}
  for _, h in ipairs({ 'q', 'w', 'r' }) do
    local f = {}
    for b = 0, HIST do f[#f + 1] = 'h'..h..b end
    f[#f + 1] = 'h'..h..'s'
    for _, v in ipairs(call('HMGET', M, unpack(f))) do hist[#hist + 1] = tonumber(v or '0') end
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
  local phase, cur, cnt = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
  local out, keys = { 0, 0, '0', now }, {}
  if phase == 0 then
    local c = tonumber(cur)
    if C.fair then
      for _, m in ipairs(call('ZRANGE', FP, c, c + cnt - 1)) do
        keys[#keys + 1] = string.sub(m, 37)
      end
    else
      keys = call('LRANGE', Q, c, c + cnt - 1)
    end
    if #keys < cnt then out[2], out[3] = 1, '0' else out[2], out[3] = 0, tostring(c + #keys) end
  else
    local r = call('HSCAN', K, cur, 'COUNT', cnt)
    out[2] = r[1] == '0' and 2 or 1
    out[3] = r[1]
    for i = 1, #r[2], 2 do
      local st = string.byte(r[2][i + 1], 1) or 0
      if band(st, QUEUED) == 0 then keys[#keys + 1] = r[2][i] end
    end
  end
  for _, key in ipairs(keys) do
    out[#out + 1] = key
    out[#out + 1] = call('HGET', K, key) or ''
    local p = call('HGET', PR, key)
    local info = ''
    if p then
      local h = string.match(p, '^(%S+)')
      local alive = call('ZSCORE', L, h)
      info = (call('HGET', H, h) or '')..'\n'..((alive and tonumber(alive) >= now) and '1' or '0')
    end
    out[#out + 1] = info
    out[#out + 1] = call('HGET', R, key) or ''
    out[#out + 1] = tonumber(call('ZSCORE', D, key) or '0')
  end
  return out
end

-- check repair: every invariant between the records and the structures.
-- Reply: number of violations, then their descriptions.
function ops.check()
  local repair = ARGV[5] == '1'
  local v = { 0 }
  local function bad(what) v[#v + 1] = what end
  local all = call('HGETALL', K)
  local n = { live = 0, dp = 0, fl = 0, proc = 0, ne = 0 }
  local inq = {}
  local qn = 0
  if not C.fair then
    for i, key in ipairs(call('LRANGE', Q, 0, -1)) do
      if inq[key] then bad('key "'..key..'" is in the FIFO twice') end
      inq[key] = i
      qn = qn + 1
    end
  else
    for i, key in ipairs(call('ZRANGE', FA, 0, -1)) do inq[key] = i; qn = qn + 1 end
  end
  local states = {}
  for i = 1, #all, 2 do
    local key = all[i]
    local ok, st, res, fail, tb, ts = pcall(struct.unpack, REC, all[i + 1])
    n.ne = n.ne + 1
    if not ok or #all[i + 1] ~= 42 then
      bad('key "'..key..'": record unreadable')
    else
      states[key] = st
      local legal = st == DIRTY + QUEUED or st == PROC or st == PROC + DIRTY or
        st == PROC + WAIT or st == WAIT or st == IDLE
      if not legal then bad('key "'..key..'": illegal state '..st) end
      if st ~= IDLE then n.live = n.live + 1 elseif fail > 0 then n.fl = n.fl + 1 end
      if band(st, DIRTY) ~= 0 then n.dp = n.dp + 1 end
      if (res == 1) ~= (call('HEXISTS', R, key) == 1) then
        bad('key "'..key..'": result flag and result table disagree')
      end
      if band(st, PROC) ~= 0 then
        n.proc = n.proc + 1
        if not call('HGET', PR, key) then bad('key "'..key..'" is processing without a holder') end
      end
      if band(st, QUEUED) ~= 0 and not inq[key] then bad('key "'..key..'" is queued but not in the FIFO') end
      if band(st, QUEUED) == 0 and inq[key] then bad('key "'..key..'" is in the FIFO but not queued') end
      if (band(st, WAIT) ~= 0) ~= (call('ZSCORE', D, key) ~= false) then
        bad('key "'..key..'": waiting state and delay set disagree')
      end
    end
  end
  for key in pairs(inq) do
    if not states[key] then bad('key "'..key..'" is in the FIFO without an entry') end
  end
  for _, key in ipairs(call('HKEYS', PR)) do
    if not states[key] or band(states[key], PROC) == 0 then
      bad('key "'..key..'" has a holder but is not processing')
    end
  end
  local function counter(name, field, want)
    if S[field] ~= want then
      bad(name..' counter is '..S[field]..', not '..want)
      if repair then S[field] = want; S_dirty = true end
    end
  end
  counter('live', 'live', n.live)
  counter('processing', 'proc', n.proc)
  counter('dirty', 'dp', n.dp)
  counter('failing', 'fl', n.fl)
  counter('entries', 'ne', n.ne)
  counter('queued', 'nq', qn)
  counter('waiting', 'nw', call('ZCARD', D))
  if repair and #v > 1 then
    -- Rebuild the containers from the records, which are the truth.
    if not C.fair then
      local order = {}
      for key, st in pairs(states) do
        if band(st, QUEUED) ~= 0 then order[#order + 1] = { key, inq[key] or math.huge } end
      end
      table.sort(order, function(a, b) return a[2] < b[2] end)
      call('DEL', Q)
      for _, o in ipairs(order) do call('RPUSH', Q, o[1]) end
      S.nq = #order
    end
    for _, key in ipairs(call('HKEYS', PR)) do
      if not states[key] or band(states[key], PROC) == 0 then call('HDEL', PR, key) end
    end
    for key, st in pairs(states) do
      if band(st, PROC) ~= 0 and not call('HGET', PR, key) then
        call('HSET', PR, key, 'repaired 0 0 0')   -- a holder that never renews:
        call('ZADD', L, 0, 'repaired')           -- requeued by the reap below
      end
    end
    S_dirty = true
  end
  if repair or ARGV[6] == '1' then reap() end
  v[1] = #v - 1
  return v
end

-- unlink: every key of the queue goes; sleepers wake and find it gone.
function ops.unlink()
  local n = call('DEL', M, K, Q, FP, FA, FT, FV, D, PR, L, H, I, R, RA)
  call('RPUSH', B, '1')
  call('PEXPIRE', B, 5000)
  call('RPUSH', DB, '1')
  call('PEXPIRE', DB, 5000)
  return { n > 0 and 0 or -ENOENT }
end

------------------------------------------------------------------------
-- The entry point
------------------------------------------------------------------------
-- A call sent again after its connection dropped (reqid "r..."): the
-- reply of its first run, or nil when it did not run (run it now). A get
-- is found by the hand-out it made (P:p records holder, slot, reqid); any
-- other call by its receipt.
local function replay(op, with_get)
  local r = call('HGET', M, 'z:'..holder..':'..slot)
  local sp = r and string.find(r, ' ', 1, true)
  local ran = r ~= false and r ~= nil and (sp and string.sub(r, 1, sp - 1) or r) == reqid
  if with_get then
    if op == 'done' and not ran then return nil end
    local all = call('HGETALL', PR)
    for i = 1, #all, 2 do
      local h, ep, sl, rq = string.match(all[i + 1], '^(%S+) (%S+) (%S+) (%S+)$')
      if h == holder and sl == slot and rq == reqid then return { 0, all[i], tonumber(ep) } end
    end
    if op == 'get' then return nil end
    return get1()   -- the done ran and its get found nothing: look again
  end
  if not ran then return nil end
  local out = {}
  for x in string.gmatch(string.sub(r, sp + 1), '[^,]+') do out[#out + 1] = tonumber(x) end
  return out
end

local function main(keys, args)
  if not call then call, band = redis.call, bit.band end
  local n = keys_for(keys[1])
  ARGV = args
  local op = args[1]
  holder, slot, reqid = args[2], args[3], args[4]
  -- reqid: "" (no receipt), "n<id>" (first send) or "r<id>" (sent again)
  resend = string.sub(reqid, 1, 1) == 'r'
  reqid = string.sub(reqid, 2)
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fn, is_mut = ops[op], false
  if not fn then fn, is_mut = mut[op], true end
  if not fn then return { -EINVAL } end
  if op == 'open' or op == 'unlink' then
    n.raw = nil
    return fn()
  end
  local st = call('HGET', M, 'st')
  if not st then return { -EIDRM } end
  if n.raw == st then   -- the cache is this state
    C, S = n.C, n.S
  else
    local cfg = call('HGET', M, 'cfg')
    if not cfg then return { -EIDRM } end
    C = cfg_of(cfg)
    S = st_of(st)
  end
  n.raw = nil   -- until this call has finished
  SD = S.sd == 1
  S_dirty = false
  local with_get = op == 'get' or (op == 'done' and args[10] == '1')
  local reply = is_mut and resend and replay(op, with_get) or fn()
  -- Everything this call changed in P:m, in one write: the state and the
  -- receipt.
  if S_dirty then
    st = st_pack(S)
    if is_mut and reqid ~= '' and op ~= 'get' then
      call('HSET', M, 'st', st, 'z:'..holder..':'..slot,
           with_get and reqid or reqid..' '..table.concat(reply, ','))
    else
      call('HSET', M, 'st', st)
    end
  end
  n.raw, n.C, n.S = st, C, S
  return reply
end

redis.register_function('@NAME@', main)
