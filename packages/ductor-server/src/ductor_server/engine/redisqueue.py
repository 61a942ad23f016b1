"""The Redis fair `TaskQueue`: the scheduling of `engine.fairness` shared by every
process, with the ready set, the running counts and the turns kept in Redis.

Redis holds only what is ready and who runs what; the store stays the truth.
Ready tasks are learned from the store by id (as `LocalFairQueue` does) and the
whole ready set is read again every `resync_seconds`. A Lua script picks
atomically, and each picked task is then leased in the store by its key, where
one taken or ended meanwhile is refused. A task's slot is freed in Redis once
its completion has committed. When the queue's marker key is gone (FLUSHALL, a
Redis restart without persistence) a lease counts the tasks the store has
leased as running and rebuilds the ready set, with the queue lock held alone
(so no choice made from the lost Redis can still be on its way to the store);
no pick chooses before that. While Redis cannot be reached, each process
schedules by the same rules itself (`LocalFairQueue` in its shared mode,
counting every process's leases from the store, without slot shares, with the
lock held alone) and raises the queue's fence, and no pick chooses from Redis
again before it has counted those leases. Either way no task is lost, none runs
twice beyond what the store's lease allows, and no limit is exceeded.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

import msgspec
from redis.asyncio import Redis
from redis.exceptions import RedisError

from ductor_server.engine.fairness import FairPolicy
from ductor_server.engine.fairqueue import (
    RESCAN_EVERY,
    RESCAN_SLACK,
    LocalFairQueue,
    LookPace,
)
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.engine.queuepolicy import QueuePolicies
from ductor_server.engine.taskqueue import SqlTaskQueue
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.queuefence import hold_queue, queue_epoch
from ductor_server.storage.records import ReadyTask, TaskRecord, TaskRef

log = logging.getLogger("ductor.redisqueue")

HEAD_SCAN = 64
"""How many of a tenant's workflows a pick looks at (a random few when it has
more), and how many of a workflow's limit keys it reads at a time, oldest first,
to find a task no limit holds back. A key met at its limit is set aside until
it can start again (one of its tasks ends, or its rate lets it), so keys held
back never hide a ready one behind them."""

PARK_BUDGET = 16 * HEAD_SCAN
"""The most keys held back by their limits that one pick sets aside for one
tenant's turn (past that, the tenant waits for its next turn, and the next
pick goes on from there): a bound on the time one script may hold Redis."""

SLOT_TTL = 30.0
"""Seconds a process's worker slots count towards the shared capacity after its
last lease (a process that stopped leasing stops counting)."""

RECONCILE_AFTER = 10.0
"""Seconds after which a task Redis holds as leased, but the store does not (its
process died between choosing it and leasing it in the store, or its end never
reached Redis), makes the next lease count the store's leases again with the
queue lock held alone, which stops counting it."""

POLICY_TTL = 3600.0
"""Seconds Redis keeps a version of the queue policy after a process last gave
it (a pick that finds it gone has it given again)."""

ENDS_KEPT = 30.0
"""Seconds Redis remembers that a task ended (its completion committed), so that
a look at the store read just before that commit does not count it again."""

# Every key is under ARGV[1], the prefix. A task's `meta` (and its entry in
# `leased`) is "tenant\tworkflow\ttier\tflow\tkey concurrency\tkey rate\tkey burst":
# `flow` is "" (no limit key) or "k" followed by the run's limit key; the limit
# fields are "" when the run has none. Ready tasks live in
#   wfs:<tier>\t<tenant>                       the tenant's workflows with ready tasks
#   flows:<tier>\t<tenant>\t<workflow>         its flows, scored by their oldest task
#   fq:<tier>\t<tenant>\t<workflow>\t<flow>    the flow's tasks, scored by id
#   nready <tier>\t<tenant>\t<workflow>        how many tasks wait in its flows
# as `engine.fairness` keeps them in memory, except that a flow whose key a pick
# found at its limit is left out of `flows` until it may start again: until a
# task of the key ends (the tiers to put it back in `park:<tenant>\t<workflow>\t<flow>`)
# or, held back by the key's rate, until its time comes (`later`, members
# "<tier>\t<tenant>\t<workflow>\t<flow>" scored by that time). `built` is the fence
# (see `storage.queuefence`) at which the tasks the store has leased were last
# counted here with the queue lock held alone; it is gone after FLUSHALL, and a
# pick refuses to choose without it. `ended` holds the tasks that ended lately,
# scored by when.
_COMMON = """
local P = ARGV[1]
local function split(v)
  local out, i = {}, 1
  while true do
    local j = string.find(v, '\\t', i, true)
    if not j then
      table.insert(out, string.sub(v, i))
      return out
    end
    table.insert(out, string.sub(v, i, j - 1))
    i = j + 1
  end
end
local function keys_of(f)
  local base = f[3]..'\\t'..f[1]
  local wf = base..'\\t'..f[2]
  return P..'wfs:'..base, P..'flows:'..wf, P..'fq:'..wf..'\\t'..f[4], wf
end
-- Put a flow back among its workflow's flows, scored by its oldest task.
local function show(f)
  local _, flows, fq = keys_of(f)
  local head = redis.call('ZRANGE', fq, 0, 0, 'WITHSCORES')
  if #head > 0 then redis.call('ZADD', flows, head[2], f[4]) end
end
local function push(id, meta)
  if redis.call('HEXISTS', P..'meta', id) == 1 or redis.call('HEXISTS', P..'leased', id) == 1 then
    return 0
  end
  local f = split(meta)
  local wfs, flows, fq, wf = keys_of(f)
  redis.call('HSET', P..'meta', id, meta)
  if redis.call('SCARD', wfs) == 0 then
    redis.call('RPUSH', P..'ring:'..f[3], f[1])
    redis.call('ZADD', P..'tiers', tonumber(f[3]), f[3])
  end
  redis.call('SADD', wfs, f[2])
  redis.call('HINCRBY', P..'nready', wf, 1)
  redis.call('ZADD', fq, tonumber(id), id)
  show(f)
  return 1
end
local function unready(id)
  local meta = redis.call('HGET', P..'meta', id)
  if not meta then return nil end
  local f = split(meta)
  local wfs, flows, fq, wf = keys_of(f)
  redis.call('HDEL', P..'meta', id)
  redis.call('ZREM', fq, id)
  if redis.call('ZCARD', fq) > 0 then
    show(f)
  else
    redis.call('ZREM', flows, f[4])
  end
  if redis.call('HINCRBY', P..'nready', wf, -1) <= 0 then
    redis.call('HDEL', P..'nready', wf)
    redis.call('SREM', wfs, f[2])
    if redis.call('SCARD', wfs) == 0 then
      local tier = f[3]
      redis.call('LREM', P..'ring:'..tier, 0, f[1])
      redis.call('HDEL', P..'deficit:'..tier, f[1])
      if redis.call('LLEN', P..'ring:'..tier) == 0 then redis.call('ZREM', P..'tiers', tier) end
    end
  end
  return meta
end
local function decr(hash, field)
  if redis.call('HINCRBY', hash, field, -1) <= 0 then redis.call('HDEL', hash, field) end
end
local function start(id, meta, at)
  local f = split(meta)
  redis.call('HSET', P..'leased', id, meta)
  redis.call('HSET', P..'leased_at', id, at)
  redis.call('HINCRBY', P..'run:t', f[1], 1)
  redis.call('HINCRBY', P..'run:w', f[1]..'\\t'..f[2], 1)
  if f[4] ~= '' then redis.call('HINCRBY', P..'run:k', f[1]..'\\t'..f[2]..'\\t'..f[4], 1) end
end
local function finish(id)
  local meta = redis.call('HGET', P..'leased', id)
  if not meta then return nil end
  local f = split(meta)
  redis.call('HDEL', P..'leased', id)
  redis.call('HDEL', P..'leased_at', id)
  decr(P..'run:t', f[1])
  decr(P..'run:w', f[1]..'\\t'..f[2])
  if f[4] ~= '' then
    local group = f[1]..'\\t'..f[2]..'\\t'..f[4]
    decr(P..'run:k', group)
    -- The key may start again: its flows set aside at its limit come back.
    local parked = P..'park:'..group
    local tiers = redis.call('SMEMBERS', parked)
    if #tiers > 0 then
      redis.call('DEL', parked)
      for _, tier in ipairs(tiers) do show({f[1], f[2], tier, f[4]}) end
    end
  end
  return meta
end
"""

# ARGV: prefix, then id and meta per task. Returns how many were new.
_PUSH = (
    _COMMON
    + """
local added = 0
for i = 2, #ARGV, 2 do added = added + push(ARGV[i], ARGV[i+1]) end
return added
"""
)

# ARGV: prefix, mode ("finish", "done", "drop" or "requeue"), now, ids...
# "done": the tasks' completion committed (they are remembered as ended).
_END = (
    _COMMON
    + """
local now = tonumber(ARGV[3])
local n = 0
for i = 4, #ARGV do
  local id = ARGV[i]
  if ARGV[2] == 'drop' then
    if unready(id) then n = n + 1 end
    if finish(id) then n = n + 1 end
  else
    local meta = finish(id)
    if meta then
      n = n + 1
      if ARGV[2] == 'requeue' then push(id, meta) end
    end
    if ARGV[2] == 'done' then redis.call('ZADD', P..'ended', now, id) end
  end
end
if ARGV[2] == 'done' then
  redis.call('ZREMRANGEBYSCORE', P..'ended', '-inf', '(' .. (now - @ENDS_KEPT@))
end
return n
""".replace("@ENDS_KEPT@", repr(ENDS_KEPT))
)

# ARGV: prefix, now, cutoff, complete ("1": the list below is every task the
# store has leased), alone ("1": the queue lock is held alone), fence, then id
# and meta per task the store has leased. Counts each as running unless it
# ended meanwhile (after FLUSHALL, or leased without Redis). With `complete`,
# a task Redis holds as leased that the store does not is no longer counted
# when `alone` (no choice can be on its way to the store then), else only
# reported if it was chosen before `cutoff`. Records the fence in `built`:
# alone, always (Redis is whole at that fence now); otherwise only if `built`
# is there (Redis kept its state). Returns {such tasks, 1 if `built` was gone}.
_SYNC = (
    _COMMON
    + """
local now, cutoff = tonumber(ARGV[2]), tonumber(ARGV[3])
local complete, alone, fence = ARGV[4] == '1', ARGV[5] == '1', tonumber(ARGV[6])
local held = {}
for i = 7, #ARGV, 2 do
  local id = ARGV[i]
  held[id] = true
  if redis.call('HEXISTS', P..'leased', id) == 0 and not redis.call('ZSCORE', P..'ended', id) then
    unready(id)
    start(id, ARGV[i+1], now)
  end
end
local stale = 0
if complete then
  local all = redis.call('HGETALL', P..'leased_at')
  for i = 1, #all, 2 do
    if not held[all[i]] then
      if alone then
        finish(all[i])
        stale = stale + 1
      elseif tonumber(all[i+1]) < cutoff then
        stale = stale + 1
      end
    end
  end
end
local built = redis.call('GET', P..'built')
if alone or built then
  redis.call('SET', P..'built', math.max(tonumber(built or '0'), fence))
end
if built then return {stale, 0} end
return {stale, 1}
"""
)

# ARGV: prefix. Forgets every ready task (their tiers changed) and the cursor;
# the next looks at the store push them again, from the oldest. Returns how many.
_CLEAR = (
    _COMMON
    + """
local ids = redis.call('HKEYS', P..'meta')
for _, id in ipairs(ids) do unready(id) end
redis.call('DEL', P..'cursor')
return #ids
"""
)

# ARGV: prefix, limit, now, capacity (0: none), policy version (see
# `policy_fields`), head scan, owner, fence. Returns a flat list: id, tenant,
# id, tenant, ...; or, choosing nothing: -1 if Redis lost the queue (no
# `built`), -2 if it counted the store's leases at a fence older than `fence`
# (a process leased without it since), -3 if it does not hold the policy.
_PICK = (
    _COMMON
    + """
local built = redis.call('GET', P..'built')
if not built then return -1 end
if tonumber(built) < tonumber(ARGV[8]) then return -2 end
local pkey = P..'policy:'..ARGV[5]
local stored = redis.call('HGET', pkey, 'd')
if not stored then return -3 end
local policy = cjson.decode(stored)
local limit, now, capacity = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local scan = tonumber(ARGV[6])
local function given(v) return v ~= nil and v ~= cjson.null end
-- Each tenant's policy is read and decoded once per pick, when first needed.
local policies = {}
local function pol(t)
  local p = policies[t]
  if p == nil then
    local raw = redis.call('HGET', pkey, 't'..t)
    if raw then p = cjson.decode(raw) else p = policy.default end
    policies[t] = p
  end
  return p
end
-- Flows held back by their key's rate whose time has come are back in turn
-- (a little early rather than late: one that still cannot start is set aside again).
for _, entry in ipairs(redis.call('ZRANGEBYSCORE', P..'later', '-inf', now + 1e-6)) do
  redis.call('ZREM', P..'later', entry)
  local e = split(entry)
  show({e[2], e[3], e[1], e[4]})
end
-- The slots of every process that leased in the last `SLOT_TTL` seconds.
local total = 0
if capacity > 0 then
  redis.call('HSET', P..'slots', ARGV[7], capacity..'\\t'..ARGV[3])
  local all = redis.call('HGETALL', P..'slots')
  for i = 1, #all, 2 do
    local f = split(all[i+1])
    if tonumber(f[2]) < now - @SLOT_TTL@ then
      redis.call('HDEL', P..'slots', all[i])
    else
      total = total + tonumber(f[1])
    end
  end
end
local cap = nil
if total > 0 then cap = math.max(1, total - math.ceil(total * policy.headroom)) end
local function running(t) return tonumber(redis.call('HGET', P..'run:t', t) or '0') end
local function tokens(t, p)
  if not given(p.rate) then return math.huge end
  local left = redis.call('HGET', P..'bucket', t)
  if not left then return p.burst end
  local at = tonumber(redis.call('HGET', P..'bucket_at', t))
  return math.min(p.burst, tonumber(left) + math.max(now - at, 0) * p.rate)
end
-- A key's bucket: "tokens\\tat\\trate\\tburst" (the rate and burst of its last start).
local function key_tokens(group, f)
  local burst = tonumber(f[7])
  local b = redis.call('HGET', P..'kbucket', group)
  if not b then return burst end
  b = split(b)
  return math.min(burst, tonumber(b[1]) + math.max(now - tonumber(b[2]), 0) * tonumber(f[6]))
end
-- nil if the task's key lets it start; else 0 if the key is at its concurrency,
-- or when its rate lets it start.
local function key_holds(f)
  if f[4] == '' then return nil end
  local group = f[1]..'\\t'..f[2]..'\\t'..f[4]
  if f[5] ~= '' and tonumber(redis.call('HGET', P..'run:k', group) or '0') >= tonumber(f[5]) then
    return 0
  end
  if f[6] == '' then return nil end
  local left = key_tokens(group, f)
  if left >= 1 then return nil end
  return now + (1 - left) / tonumber(f[6])
end
local function set_aside(flows, f, tier, until_)
  redis.call('ZREM', flows, f[4])
  local group = f[1]..'\\t'..f[2]..'\\t'..f[4]
  if until_ == 0 then
    redis.call('SADD', P..'park:'..group, tier)
  else
    redis.call('ZADD', P..'later', until_, tier..'\\t'..group)
  end
end
local function share(t)
  local active, sum = {}, 0
  active[t] = true
  for _, x in ipairs(redis.call('HKEYS', P..'run:t')) do active[x] = true end
  for _, tier in ipairs(redis.call('ZRANGE', P..'tiers', 0, -1)) do
    for _, x in ipairs(redis.call('LRANGE', P..'ring:'..tier, 0, -1)) do active[x] = true end
  end
  for x, _ in pairs(active) do sum = sum + pol(x).weight end
  return total * pol(t).weight / sum
end
local function head(tier, t, p)
  if given(p.max_running) and running(t) >= p.max_running then return nil end
  if tokens(t, p) < 1 then return nil end
  local best, best_seq = nil, nil
  local budget = @PARK_BUDGET@
  local base = tier..'\\t'..t
  local wfs = redis.call('SRANDMEMBER', P..'wfs:'..base, scan)
  for _, wf in ipairs(wfs) do
    local cap = p.workflows and p.workflows[wf]
    if not given(cap) or tonumber(redis.call('HGET', P..'run:w', t..'\\t'..wf) or '0') < cap then
      local key = P..'flows:'..base..'\\t'..wf
      local more = true
      while more and budget > 0 do
        -- Every flow read here that does not stop the search is set aside,
        -- so the next read finds the ones after it.
        local flows = redis.call('ZRANGE', key, 0, scan - 1, 'WITHSCORES')
        more = #flows == 2 * scan
        for i = 1, #flows, 2 do
          local seq = tonumber(flows[i+1])
          if best_seq ~= nil and seq >= best_seq then
            more = false
            break
          end
          local id = redis.call('ZRANGE', P..'fq:'..base..'\\t'..wf..'\\t'..flows[i], 0, 0)[1]
          local f = split(redis.call('HGET', P..'meta', id))
          local held = key_holds(f)
          if held == nil then
            best, best_seq = id, seq
            more = false
            break
          end
          set_aside(key, f, tier, held)
          budget = budget - 1
          if budget <= 0 then
            more = false
            break
          end
        end
      end
    end
  end
  return best
end
local function take_tokens(t, p, f)
  if given(p.rate) then
    local at = tonumber(redis.call('HGET', P..'bucket_at', t) or tostring(now))
    redis.call('HSET', P..'bucket', t, tokens(t, p) - 1)
    redis.call('HSET', P..'bucket_at', t, math.max(now, at))
  end
  if f[4] ~= '' and f[6] ~= '' then
    local group = f[1]..'\\t'..f[2]..'\\t'..f[4]
    local b = redis.call('HGET', P..'kbucket', group)
    local at = now
    if b then at = math.max(now, tonumber(split(b)[2])) end
    local left = string.format('%.17g', key_tokens(group, f) - 1)
    local since = string.format('%.17g', at)
    redis.call('HSET', P..'kbucket', group, left..'\\t'..since..'\\t'..f[6]..'\\t'..f[7])
  end
end
local function pick_in(tier, use_share)
  local ring = P..'ring:'..tier
  for _ = 1, redis.call('LLEN', ring) do
    local t = redis.call('LINDEX', ring, 0)
    local p = pol(t)
    if (cap ~= nil and running(t) >= cap) or (use_share and running(t) >= share(t)) then
      redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
    else
      local id = head(tier, t, p)
      if not id then
        redis.call('HSET', P..'deficit:'..tier, t, 0)
        redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
      else
        local credit = tonumber(redis.call('HGET', P..'deficit:'..tier, t) or '0')
        if credit < 1 then credit = credit + p.weight end
        credit = credit - 1
        local meta = unready(id)
        if redis.call('LLEN', ring) > 0 and redis.call('LINDEX', ring, 0) == t then
          if credit < 1 then redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT') end
          redis.call('HSET', P..'deficit:'..tier, t, credit)
        end
        take_tokens(t, p, split(meta))
        start(id, meta, now)
        return id, t
      end
    end
  end
  return nil
end
local out = {}
while #out < 2 * limit do
  local found = false
  for _, tier in ipairs(redis.call('ZREVRANGE', P..'tiers', 0, -1)) do
    local id, t = nil, nil
    if total > 0 then id, t = pick_in(tier, true) end
    if not id then id, t = pick_in(tier, false) end
    if id then
      table.insert(out, id)
      table.insert(out, t)
      found = true
      break
    end
  end
  if not found then break end
end
if redis.call('HLEN', P..'kbucket') > @PRUNE@ then
  -- A key bucket refilled to its burst says nothing a missing one would not.
  local all = redis.call('HGETALL', P..'kbucket')
  for i = 1, #all, 2 do
    local b = split(all[i+1])
    local full = tonumber(b[1]) + math.max(now - tonumber(b[2]), 0) * tonumber(b[3])
    if full >= tonumber(b[4]) then redis.call('HDEL', P..'kbucket', all[i]) end
  end
end
return out
""".replace("@SLOT_TTL@", repr(SLOT_TTL))
    .replace("@PRUNE@", "4096")
    .replace("@PARK_BUDGET@", str(PARK_BUDGET))
)


def task_meta(task: ReadyTask, policy: FairPolicy) -> str:
    """A ready task as the Lua script keeps it (see `_COMMON`), in the tier its
    tenant's policy gives it."""
    tier = policy.of(task.tenant_id).tier
    fields = [task.tenant_id, task.workflow, str(task.tier if tier is None else tier)]
    limits = task.limits
    if limits is None:
        fields.extend(("", "", "", "1"))
    else:
        fields.extend(
            (
                "k" + limits.key,
                "" if limits.concurrency is None else str(limits.concurrency),
                "" if limits.rate is None else repr(float(limits.rate)),
                str(limits.burst),
            )
        )
    return "\t".join(fields)


class RedisFairQueue:
    """A `TaskQueue` whose fair order, limits and shares hold across every
    process on one Redis (keys under `<prefix>q:`).

    Every lease holds the queue lock (`storage.queuefence`) from before its pick
    until its lease commits: shared while it picks through Redis, alone when it
    counts the store's leases for Redis anew (Redis lost the queue, or holds a
    lease the store does not) or leases from the store without Redis. So a count
    taken alone misses no choice on its way to the store, and a lease from the
    store sees every one made through Redis. A pick refuses to choose from a
    Redis that lost the queue, or that has not yet counted what processes leased
    from the store on their own (the fence), whenever that happened during the
    lease: the lease then counts anew and picks again.

    Args:
        store: where the tasks are (the truth).
        redis: the shared Redis.
        prefix: this deployment's key prefix.
        policy: the tenants' weights and limits (the settings'); the operators'
            per-tenant policies in the store take its place for their tenants.
        capacity: this process's worker slots; the slots of every process that
            leased in the last `SLOT_TTL` seconds add up to the capacity the
            shares and the headroom are counted in. None: this process's leases
            share only the order of starts.
        wake: notified (TASKS) after completions while tasks wait, so that a
            task held back by a limit starts as soon as a slot frees anywhere;
            heard for policy changes (POLICY).
        resync_seconds: how often, at most, the whole ready set is read again;
            never more often than ten times the last such read took; 0: at
            every lease.
        rescan_every: seconds between looks that start below the highest task id
            seen (`RESCAN_EVERY`; 0: at every lease).
    """

    def __init__(
        self,
        store: Store,
        redis: Redis,
        *,
        prefix: str = "ductor:",
        policy: FairPolicy | None = None,
        capacity: int | None = None,
        wake: WakeUp | None = None,
        resync_seconds: float = 0.25,
        rescan_every: float = RESCAN_EVERY,
        scan_limit: int = 10_000,
    ) -> None:
        self.store = store
        self.redis = redis
        self.wake = wake
        # Under this database's epoch (`storage.queuefence.queue_epoch`), learned
        # at the first lease: another database's queue in the same Redis, or this
        # one's before a restore, is not this one.
        self._prefix = f"{prefix}q:"
        self.keys = self._prefix
        self._bound = False
        self.policies = QueuePolicies(policy, wake=wake)
        self.policy = self.policies.policy
        self._policy_version = policy_version(self.policy)
        self.capacity = capacity
        self.resync_seconds = resync_seconds
        self.pace = LookPace(rescan_every, min(RESCAN_SLACK, scan_limit // 2))
        self.scan_limit = scan_limit
        self.owner = uuid.uuid4().hex[:12]  # this process's entry in the shared slots
        self.refused = 0  # picked tasks the store would not lease
        self.rebuilds = 0  # times the ready set was rebuilt after Redis lost it
        self.recounts = 0  # counts of the store's leases taken with the lock held alone
        self.fallbacks = 0  # leases taken from the store while Redis was unreachable
        self.reconciled = 0  # tasks Redis held as leased that the store did not
        self._sql = SqlTaskQueue(store)
        # While Redis cannot be reached: the same rules in this process, counting
        # every process's leases from the store (no slot shares: the other
        # processes' slots are unknown then), with the queue lock held alone.
        self._fallback = LocalFairQueue(store, policies=self.policies, wake=wake, shared=True)
        self._resynced = 0.0
        self._resync_every = resync_seconds
        # Tasks whose completion committed, not yet recorded in Redis.
        self._ends: list[str] = []
        self._ends_lock = asyncio.Lock()
        self._recorder: asyncio.Task[None] | None = None
        self._push = redis.register_script(_PUSH)
        self._end = redis.register_script(_END)
        self._pick = redis.register_script(_PICK)
        self._sync = redis.register_script(_SYNC)
        self._clear = redis.register_script(_CLEAR)

    async def lease(
        self,
        *,
        owner: str,
        limit: int,
        lease_for: timedelta,
        now: datetime,
        handlers: Sequence[str] | None = None,
    ) -> list[TaskRecord]:
        """Lease up to `limit` tasks in the shared fair order (the store's order
        with `handlers`; this process's, by the same rules, while Redis cannot
        be reached)."""
        if handlers is not None:
            return await self._sql.lease(
                owner=owner, limit=limit, lease_for=lease_for, now=now, handlers=handlers
            )
        if limit < 1:
            return []
        await self._bind()
        await self.record_ends()
        alone = False
        for _ in range(3):
            try:
                if not alone and not await self.redis.exists(self.keys + "built"):
                    alone = True
                leased = await self._lease_once(
                    owner=owner, limit=limit, lease_for=lease_for, now=now, alone=alone
                )
            except RedisError as exc:
                self.fallbacks += 1
                log.warning("Redis unreachable (%s): leasing in this process's fair order", exc)
                return await self._fallback.lease(
                    owner=owner, limit=limit, lease_for=lease_for, now=now
                )
            if leased is not None:
                return leased
            # Redis lost the queue, holds a lease the store does not, or has not
            # counted a lease taken without it: count anew with the lock held alone.
            alone = True
        return []

    async def _lease_once(
        self, *, owner: str, limit: int, lease_for: timedelta, now: datetime, alone: bool
    ) -> list[TaskRecord] | None:
        """One lease under the queue lock (held `alone` or shared); None when it
        must be taken again with the lock held alone, nothing leased."""
        picked: list[tuple[str, str]] = []
        try:
            async with self.store.transaction() as tx:
                fence = await hold_queue(tx, alone=alone)
                await self._follow(await self.policies.current(tx))
                if await self._refresh(tx, now, fence=fence, alone=alone):
                    return None
                args: list[str | int] = [
                    self.keys,
                    limit,
                    repr(now.timestamp()),
                    self.capacity or 0,
                    self._policy_version,
                    HEAD_SCAN,
                    self.owner,
                    fence,
                ]
                flat = await self._pick(args=args)
                if flat == -3:
                    await self._store_policy()
                    flat = await self._pick(args=args)
                if isinstance(flat, int):
                    return None
                picked = [(_text(flat[i]), _text(flat[i + 1])) for i in range(0, len(flat), 2)]
                if not picked:
                    return []
                leased = await tx.lease_chosen_tasks(
                    [TaskRef(tenant_id=tenant, task_id=key) for key, tenant in picked],
                    owner=owner,
                    lease_for=lease_for,
                    now=now,
                )
        except RedisError:
            raise
        except BaseException:
            # Chosen but not leased (the store failed): ready again at once
            # rather than counted as running until the next count.
            await self._ended("requeue", [key for key, _ in picked])
            raise
        refused = [key for (key, _), task in zip(picked, leased, strict=True) if task is None]
        if refused:
            self.refused += len(refused)
            await self._ended("drop", refused)
            if self.wake is not None:
                # Others may be ready in place of the refused: look again at once.
                self.wake.notify(Topic.TASKS)
        return [task for task in leased if task is not None]

    async def _follow(self, policy: FairPolicy) -> None:
        """Schedule by `policy` from now on; when it moves a tenant to another
        tier, forget the ready set so that the next look files it again."""
        if policy is self.policy:
            return
        old, self.policy = self.policy, policy
        self._policy_version = policy_version(policy)
        tenants = {*old.tenants, *policy.tenants}
        if old.default.tier != policy.default.tier or any(
            old.of(t).tier != policy.of(t).tier for t in tenants
        ):
            await self._clear(args=[self.keys])
            self._resynced = 0.0

    async def _store_policy(self) -> None:
        """Give Redis this queue's policy (each version is kept `POLICY_TTL`
        seconds after it was last given)."""
        key = f"{self.keys}policy:{self._policy_version}"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=policy_fields(self.policy))  # type: ignore[arg-type]
            pipe.expire(key, int(POLICY_TTL))
            await pipe.execute()

    async def _refresh(self, tx: Tx, now: datetime, *, fence: int, alone: bool) -> bool:
        """Bring Redis up to date with the store; True if it holds as leased a
        task the store does not (chosen long enough ago that it is no choice on
        its way to the store), so that the store's leases must be counted anew
        with the lock held alone."""
        clock = time.monotonic()
        if alone or clock - self._resynced >= self._resync_every:
            rows = await tx.ready_tasks(now=now, limit=self.scan_limit)
            running = await tx.leased_tasks(now=now, limit=self.scan_limit)
            # What the store has leased counts as running (after FLUSHALL, or
            # leased without Redis, too). With the lock held alone no choice can
            # be on its way to the store, so what Redis alone holds as leased
            # stops counting; with it shared, such a task is only reported.
            args: list[str | int] = [
                self.keys,
                repr(now.timestamp()),
                repr(now.timestamp() - RECONCILE_AFTER),
                "1" if len(running) < self.scan_limit else "0",
                "1" if alone else "0",
                fence,
            ]
            for row in running:
                args.extend((row.id, task_meta(row, self.policy)))
            stale, rebuilt = (int(n) for n in await self._sync(args=args))
            if alone:
                self.recounts += 1
                self.reconciled += stale
                self.rebuilds += rebuilt
            elif stale:
                return True
            self.pace.saw_expired(now)
            expired = [row.id for row in rows if row.expired]
            if expired:
                # A lease that ran out with its process: its slot is free again.
                await self._ended("finish", expired, strict=True)
            await self._add(rows)
            self._resynced = time.monotonic()
            # A full look costs more as the backlog grows: the next one comes no
            # sooner than ten times what this one took (0: at every lease).
            if self.resync_seconds > 0:
                took = self._resynced - clock
                self._resync_every = max(self.resync_seconds, 10 * took)
            if len(rows) < self.scan_limit:
                return False  # it saw every ready task
        elif self.pace.expired_due(now):
            # Leases that ran out (a process died or stalled with its task) are
            # free again.
            lapsed = await tx.ready_tasks(now=now, expired_only=True, limit=self.scan_limit)
            if lapsed:
                await self._ended("finish", [row.id for row in lapsed], strict=True)
                await self._add(lapsed)
        # New tasks by id, also after a full look that could not hold every
        # ready task (it holds the oldest; the newest are found here).
        cursor = int(await self.redis.get(self.keys + "cursor") or 0)
        rows = await tx.ready_tasks(
            now=now, after_id=str(self.pace.after(cursor, clock)), limit=self.scan_limit
        )
        await self._add(rows)
        return False

    async def _add(self, rows: list[ReadyTask]) -> None:
        if not rows:
            return
        args: list[str | int] = [self.keys]
        for row in rows:
            args.extend((row.id, task_meta(row, self.policy)))
        await self._push(args=args)
        top = max(int(row.id) for row in rows)
        # The cursor only moves up (another process may have seen further).
        cursor = int(await self.redis.get(self.keys + "cursor") or 0)
        self.pace.saw(cursor, (int(row.id) for row in rows), time.monotonic())
        if top > cursor:
            await self.redis.set(self.keys + "cursor", top)

    async def _ended(self, mode: str, keys: Sequence[str], *, strict: bool = False) -> None:
        if not keys:
            return
        try:
            await self._end(args=[self.keys, mode, repr(time.time()), *keys])
        except RedisError as exc:
            if strict:
                raise
            # The count heals at the next count taken alone; the store has the truth.
            log.warning("could not record %d ended tasks in Redis: %s", len(keys), exc)

    async def record_ends(self) -> None:
        """Record in Redis the ends of the tasks whose completion has committed,
        freeing their slots (each lease does this first; completions also have it
        done soon after their commit)."""
        async with self._ends_lock:
            while self._ends:
                ids, self._ends = self._ends, []
                await self._ended("done", ids)

    async def _record_soon(self) -> None:
        try:
            await self.record_ends()
            if self.wake is not None:
                try:
                    waiting = await self.redis.exists(self.keys + "tiers")
                except RedisError:
                    waiting = 0
                if waiting:
                    self.wake.notify(Topic.TASKS)
        except Exception:
            log.exception("recording ended tasks in Redis failed")

    def _committed(self, ids: list[str]) -> None:
        self._ends.extend(ids)
        if self._recorder is None or self._recorder.done():
            self._recorder = asyncio.get_running_loop().create_task(self._record_soon())

    async def extend(
        self, refs: Sequence[TaskRef], *, owner: str, lease_until: datetime
    ) -> list[bool]:
        """Push the leases in the store."""
        return await self._sql.extend(refs, owner=owner, lease_until=lease_until)

    async def complete(self, tx: Tx, refs: Sequence[TaskRef]) -> None:
        """Mark the tasks done in `tx`; once it commits, their slots are free (a
        slot freed in Redis before the commit could be counted again by a look
        at the store made just before it)."""
        await self._bind(tx)
        await tx.finish_tasks(refs)
        for ref in refs:
            self._fallback.scheduler.finish(ref.task_id)
        ids = [ref.task_id for ref in refs]
        if ids:
            tx.session.after_commit(lambda: self._committed(ids))

    async def release(self, refs: Sequence[TaskRef], *, available_at: datetime) -> int:
        """Give the tasks back in the store; they are ready again in Redis too."""
        await self._bind()
        count = await self._sql.release(refs, available_at=available_at)
        await self._ended("requeue", [ref.task_id for ref in refs])
        return count

    async def _bind(self, tx: Tx | None = None) -> None:
        """Put this queue's keys under the database's epoch, once (in `tx` when the
        caller holds one)."""
        if self._bound:
            return
        if tx is None:
            async with self.store.transaction() as own:
                epoch = await queue_epoch(own)
        else:
            epoch = await queue_epoch(tx)
        self.keys = f"{self._prefix}{epoch}:"
        self._bound = True


def policy_fields(policy: FairPolicy) -> dict[str, str]:
    """The policy as Redis keeps it for picks (`<prefix>q:policy:<version>`): "d"
    the default tenant policy and the headroom, "t<tenant>" each tenant's own,
    JSON each, so that a pick decodes only the tenants it meets."""
    fields = {"d": msgspec.json.encode({"default": policy.default, "headroom": policy.headroom})}
    for tenant, own in policy.tenants.items():
        fields["t" + tenant] = msgspec.json.encode(own)
    return {name: value.decode() for name, value in fields.items()}


def policy_version(policy: FairPolicy) -> str:
    """A digest of the policy that names its copy in Redis."""
    return hashlib.sha256(msgspec.json.encode(policy)).hexdigest()[:24]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = [
    "ENDS_KEPT",
    "HEAD_SCAN",
    "PARK_BUDGET",
    "POLICY_TTL",
    "RECONCILE_AFTER",
    "SLOT_TTL",
    "RedisFairQueue",
    "policy_fields",
    "policy_version",
    "task_meta",
]
