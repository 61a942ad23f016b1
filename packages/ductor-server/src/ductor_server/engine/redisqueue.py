"""The Redis fair `TaskQueue`: the scheduling of `engine.fairness` shared by every
process, with the ready set, the running counts and the turns kept in Redis.

Redis holds only what is ready and who runs what; the store stays the truth.
Ready tasks are learned from the store by id (as `LocalFairQueue` does) and the
whole ready set is read again every `resync_seconds`. A Lua script picks
atomically, and each picked task is then leased in the store by its key, where
one taken or ended meanwhile is refused. When the queue's marker key is gone
(FLUSHALL, a Redis restart without persistence) the next lease rebuilds the
ready set from the store; while Redis cannot be reached, workers lease from the
store in its own order. Either way no task is lost, and none runs twice beyond
what the store's lease allows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

import msgspec
from redis.asyncio import Redis
from redis.exceptions import RedisError

from ductor_server.engine.fairness import FairPolicy
from ductor_server.engine.fairqueue import RESCAN_SLACK
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.engine.taskqueue import SqlTaskQueue
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.records import ReadyTask, TaskRecord, TaskRef

log = logging.getLogger("ductor.redisqueue")

HEAD_SCAN = 64
"""How many of a tenant's oldest ready tasks a pick looks at to find one whose
workflow is below its cap (past that, the tenant waits for its next turn)."""

# KEYS: none (every key is under ARGV[1], the prefix). Entries of `meta` and
# `leased` are "tenant\tworkflow\ttier".
_COMMON = """
local P = ARGV[1]
local function split(v)
  local a = string.find(v, '\\t', 1, true)
  local b = string.find(v, '\\t', a + 1, true)
  return string.sub(v, 1, a - 1), string.sub(v, a + 1, b - 1), string.sub(v, b + 1)
end
local function push(id, tenant, wf, tier)
  if redis.call('HEXISTS', P..'meta', id) == 1 or redis.call('HEXISTS', P..'leased', id) == 1 then
    return 0
  end
  redis.call('HSET', P..'meta', id, tenant..'\\t'..wf..'\\t'..tier)
  local q = P..'ready:'..tier..':'..tenant
  if redis.call('ZCARD', q) == 0 then
    redis.call('RPUSH', P..'ring:'..tier, tenant)
    redis.call('ZADD', P..'tiers', tonumber(tier), tier)
  end
  redis.call('ZADD', q, tonumber(id), id)
  return 1
end
local function unready(id)
  local v = redis.call('HGET', P..'meta', id)
  if not v then return nil end
  local tenant, wf, tier = split(v)
  redis.call('HDEL', P..'meta', id)
  local q = P..'ready:'..tier..':'..tenant
  redis.call('ZREM', q, id)
  if redis.call('ZCARD', q) == 0 then
    redis.call('LREM', P..'ring:'..tier, 0, tenant)
    redis.call('HDEL', P..'deficit:'..tier, tenant)
    if redis.call('LLEN', P..'ring:'..tier) == 0 then redis.call('ZREM', P..'tiers', tier) end
  end
  return v
end
local function finish(id)
  local v = redis.call('HGET', P..'leased', id)
  if not v then return nil end
  local tenant, wf = split(v)
  redis.call('HDEL', P..'leased', id)
  if redis.call('HINCRBY', P..'run:t', tenant, -1) <= 0 then
    redis.call('HDEL', P..'run:t', tenant)
  end
  local key = tenant..'\\t'..wf
  if redis.call('HINCRBY', P..'run:w', key, -1) <= 0 then redis.call('HDEL', P..'run:w', key) end
  return v
end
"""

# ARGV: prefix, then id, tenant, workflow, tier per task. Returns how many were new.
_PUSH = (
    _COMMON
    + """
local added = 0
for i = 2, #ARGV, 4 do added = added + push(ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3]) end
return added
"""
)

# ARGV: prefix, mode ("finish", "drop" or "requeue"), ids...
_END = (
    _COMMON
    + """
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if ARGV[2] == 'drop' then
    if unready(id) then n = n + 1 end
    if finish(id) then n = n + 1 end
  else
    local v = finish(id)
    if v then
      n = n + 1
      if ARGV[2] == 'requeue' then
        local tenant, wf, tier = split(v)
        push(id, tenant, wf, tier)
      end
    end
  end
end
return n
"""
)

# ARGV: prefix, limit, now, capacity (0: none), policy JSON, head scan.
# Returns a flat list: id, tenant, id, tenant, ...
_PICK = (
    _COMMON
    + """
local limit, now, capacity = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local policy = cjson.decode(ARGV[5])
local scan = tonumber(ARGV[6])
local function pol(t)
  local p = policy.tenants[t] or policy.default
  return p
end
local function running(t) return tonumber(redis.call('HGET', P..'run:t', t) or '0') end
local function tokens(t, p)
  if p.rate == nil or p.rate == cjson.null then return math.huge end
  local left = redis.call('HGET', P..'bucket', t)
  if not left then return p.burst end
  local at = tonumber(redis.call('HGET', P..'bucket_at', t))
  return math.min(p.burst, tonumber(left) + math.max(now - at, 0) * p.rate)
end
local function share(t)
  local active, total = {}, 0
  active[t] = true
  local r = redis.call('HKEYS', P..'run:t')
  for _, x in ipairs(r) do active[x] = true end
  for _, tier in ipairs(redis.call('ZRANGE', P..'tiers', 0, -1)) do
    for _, x in ipairs(redis.call('LRANGE', P..'ring:'..tier, 0, -1)) do active[x] = true end
  end
  for x, _ in pairs(active) do total = total + pol(x).weight end
  return capacity * pol(t).weight / total
end
local function head(tier, t, p)
  if p.max_running ~= nil and p.max_running ~= cjson.null and running(t) >= p.max_running then
    return nil
  end
  if tokens(t, p) < 1 then return nil end
  local ids = redis.call('ZRANGE', P..'ready:'..tier..':'..t, 0, scan - 1)
  for _, id in ipairs(ids) do
    local _, wf = split(redis.call('HGET', P..'meta', id))
    local cap = p.workflows and p.workflows[wf]
    if cap == nil or cap == cjson.null
      or tonumber(redis.call('HGET', P..'run:w', t..'\\t'..wf) or '0') < cap then
      return id
    end
  end
  return nil
end
local function pick_in(tier, use_share)
  local ring = P..'ring:'..tier
  for _ = 1, redis.call('LLEN', ring) do
    local t = redis.call('LINDEX', ring, 0)
    local p = pol(t)
    if use_share and running(t) >= share(t) then
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
        local v = unready(id)
        local _, wf = split(v)
        if redis.call('LLEN', ring) > 0 and redis.call('LINDEX', ring, 0) == t then
          if credit < 1 then redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT') end
          redis.call('HSET', P..'deficit:'..tier, t, credit)
        end
        if p.rate ~= nil and p.rate ~= cjson.null then
          local at = tonumber(redis.call('HGET', P..'bucket_at', t) or tostring(now))
          redis.call('HSET', P..'bucket', t, tokens(t, p) - 1)
          redis.call('HSET', P..'bucket_at', t, math.max(now, at))
        end
        redis.call('HSET', P..'leased', id, v)
        redis.call('HINCRBY', P..'run:t', t, 1)
        redis.call('HINCRBY', P..'run:w', t..'\\t'..wf, 1)
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
    if capacity > 0 then id, t = pick_in(tier, true) end
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
return out
"""
)


class RedisFairQueue:
    """A `TaskQueue` whose fair order, limits and shares hold across every
    process on one Redis (keys under `<prefix>q:`).

    Args:
        store: where the tasks are (the truth).
        redis: the shared Redis.
        prefix: this deployment's key prefix.
        policy: the tenants' weights and limits.
        capacity: the worker slots of all processes together (for the shares);
            None to share only the order of starts.
        wake: notified (TASKS) after completions while tasks wait, so that a
            task held back by a limit starts as soon as a slot frees anywhere.
        resync_seconds: how often the whole ready set is read again.
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
        scan_limit: int = 10_000,
    ) -> None:
        self.store = store
        self.redis = redis
        self.wake = wake
        self.keys = f"{prefix}q:"
        self.policy = policy or FairPolicy()
        self._policy_json = msgspec.json.encode(self.policy).decode()
        self.capacity = capacity
        self.resync_seconds = resync_seconds
        self.scan_limit = scan_limit
        self.refused = 0  # picked tasks the store would not lease
        self.rebuilds = 0  # times the ready set was rebuilt after Redis lost it
        self.fallbacks = 0  # leases taken from the store while Redis was unreachable
        self._sql = SqlTaskQueue(store)
        self._resynced = 0.0
        self._push = redis.register_script(_PUSH)
        self._end = redis.register_script(_END)
        self._pick = redis.register_script(_PICK)

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
        with `handlers`, or while Redis cannot be reached)."""
        if handlers is not None:
            return await self._sql.lease(
                owner=owner, limit=limit, lease_for=lease_for, now=now, handlers=handlers
            )
        if limit < 1:
            return []
        try:
            async with self.store.transaction() as tx:
                await self._refresh(tx, now)
                flat = await self._pick(
                    args=[
                        self.keys,
                        limit,
                        now.timestamp(),
                        self.capacity or 0,
                        self._policy_json,
                        HEAD_SCAN,
                    ]
                )
                picked = [(_text(flat[i]), _text(flat[i + 1])) for i in range(0, len(flat), 2)]
                if not picked:
                    return []
                leased = await tx.lease_chosen_tasks(
                    [TaskRef(tenant_id=tenant, task_id=key) for key, tenant in picked],
                    owner=owner,
                    lease_for=lease_for,
                    now=now,
                )
        except RedisError as exc:
            self.fallbacks += 1
            log.warning("Redis unreachable (%s): leasing from the store in its order", exc)
            return await self._sql.lease(owner=owner, limit=limit, lease_for=lease_for, now=now)
        refused = [key for (key, _), task in zip(picked, leased, strict=True) if task is None]
        if refused:
            self.refused += len(refused)
            await self._ended("drop", refused)
        return [task for task in leased if task is not None]

    async def _refresh(self, tx: Tx, now: datetime) -> None:
        clock = time.monotonic()
        built = await self.redis.exists(self.keys + "built")
        if not built or clock - self._resynced >= self.resync_seconds:
            rows = await tx.ready_tasks(now=now, limit=self.scan_limit)
            self._resynced = clock
            expired = [row.id for row in rows if row.expired]
            if expired:
                # A lease that ran out with its process: its slot is free again.
                await self._end(args=[self.keys, "requeue", *expired])
            await self._add(rows)
            if not built:
                self.rebuilds += 1
                await self.redis.set(self.keys + "built", "1")
        else:
            cursor = int(await self.redis.get(self.keys + "cursor") or 0)
            after = str(max(cursor - RESCAN_SLACK, 0))
            rows = await tx.ready_tasks(now=now, after_id=after, limit=self.scan_limit)
            await self._add(rows)
            # Leases that ran out (a process died or stalled with its task) are
            # free again at once, as in the store's own order.
            lapsed = await tx.ready_tasks(now=now, expired_only=True, limit=self.scan_limit)
            if lapsed:
                await self._end(args=[self.keys, "requeue", *(row.id for row in lapsed)])
                await self._add(lapsed)

    async def _add(self, rows: list[ReadyTask]) -> None:
        if not rows:
            return
        args: list[str | int] = [self.keys]
        for row in rows:
            args.extend((row.id, row.tenant_id, row.workflow, row.tier))
        await self._push(args=args)
        top = max(int(row.id) for row in rows)
        # The cursor only moves up (another process may have seen further).
        cursor = int(await self.redis.get(self.keys + "cursor") or 0)
        if top > cursor:
            await self.redis.set(self.keys + "cursor", top)

    async def _ended(self, mode: str, keys: Sequence[str]) -> None:
        if not keys:
            return
        try:
            await self._end(args=[self.keys, mode, *keys])
        except RedisError as exc:
            # The count heals at the next rebuild; the store already has the truth.
            log.warning("could not record %d ended tasks in Redis: %s", len(keys), exc)

    async def extend(
        self, refs: Sequence[TaskRef], *, owner: str, lease_until: datetime
    ) -> list[bool]:
        """Push the leases in the store."""
        return await self._sql.extend(refs, owner=owner, lease_until=lease_until)

    async def complete(self, tx: Tx, refs: Sequence[TaskRef]) -> list[bool]:
        """Mark the tasks done in `tx`; their slots count as free from now on."""
        done = await tx.complete_tasks(refs)
        await self._ended("finish", [ref.task_id for ref in refs])
        if self.wake is not None and refs:
            try:
                waiting = await self.redis.exists(self.keys + "tiers")
            except RedisError:
                waiting = 0
            if waiting:
                self.wake.notify(Topic.TASKS)
        return done

    async def release(self, refs: Sequence[TaskRef], *, available_at: datetime) -> int:
        """Give the tasks back in the store; they are ready again in Redis too."""
        count = await self._sql.release(refs, available_at=available_at)
        await self._ended("requeue", [ref.task_id for ref in refs])
        return count


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = ["HEAD_SCAN", "RedisFairQueue"]
