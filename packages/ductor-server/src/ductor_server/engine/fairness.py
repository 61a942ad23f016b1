"""Fair scheduling of ready tasks: which task runs next, and which must wait.

Pure and synchronous (no I/O, no clock of its own: callers pass `now`), so the
in-process queue uses it directly and the Redis queue's Lua script follows it
line by line; the property tests in `tests/engine/test_fairness.py` hold both
to the same rules:

- Tiers: a task of a higher tier is always picked before one of a lower tier
  that could also run (strict priority, so a busy high tier can starve lower ones).
  A tenant policy's `tier` puts all of a tenant's tasks in that tier.
- Within a tier, tenants share by weight (deficit round robin): while every
  tenant has work, tenant `t` gets `weight(t)` picks per round.
- Limits: a tenant never has more than `max_running` tasks leased, a workflow
  of a tenant never more than its limit, and a tenant never starts more than
  `burst + rate * T` tasks in any window of `T` seconds. A run's own limits
  (its workflow's `concurrency` option) hold per limit key: never more than
  `key_concurrency` tasks of one (tenant, workflow, limit key) leased, never
  more than `key_burst + key_rate * T` of them started in `T` seconds. A tenant
  or key held back by a limit is skipped, not waited for (the queue stays
  work-conserving), and each key has a queue of its own, so a key at its limit
  never holds back another key's tasks.
- Slots: given the worker slots there are, a tenant at its weighted share gets
  another only when no tenant below its share can use it, and no tenant ever
  holds more than all slots but the policy's `headroom`.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

MAX_WEIGHT = 1000
MAX_TIER = 9


MAX_LIMIT = 1_000_000
"""The largest `max_running`, `burst`, workflow cap or `rate` a policy may set."""
MAX_WORKFLOW_CAPS = 100
"""The most workflow caps one tenant policy may hold."""


class TenantPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one tenant is scheduled.

    Attributes:
        weight: its share within a tier relative to the other tenants (1 to 1000).
        tier: the tier of all its tasks (0 to 9, higher first); None: each
            task's own tier (0 unless the engine says otherwise).
        max_running: at most this many of its tasks leased at once (None: no limit).
        rate: at most this many of its tasks started per second, on average (None: no limit).
        burst: how many starts the rate limit lets through at once (at least 1).
        workflows: per workflow slug, at most this many of its tasks leased at once.
    """

    weight: int = 1
    tier: int | None = None
    max_running: int | None = None
    rate: float | None = None
    burst: int = 1
    workflows: dict[str, int] = msgspec.field(default_factory=dict)

    def problems(self, pointer: str = "") -> list[tuple[str, str]]:
        """What is wrong with this policy: (JSON pointer, message) pairs."""
        out: list[tuple[str, str]] = []

        def bad(name: str, message: str) -> None:
            out.append((f"{pointer}/{name}", message))

        if not 1 <= self.weight <= MAX_WEIGHT:
            bad("weight", f"must be 1 to {MAX_WEIGHT}, got {self.weight}")
        if self.tier is not None and not 0 <= self.tier <= MAX_TIER:
            bad("tier", f"must be 0 to {MAX_TIER}, got {self.tier}")
        if self.max_running is not None and not 1 <= self.max_running <= MAX_LIMIT:
            bad("max_running", f"must be 1 to {MAX_LIMIT}, got {self.max_running}")
        if self.rate is not None and not 0 < self.rate <= MAX_LIMIT:
            bad("rate", f"must be above 0 and at most {MAX_LIMIT}, got {self.rate}")
        if not 1 <= self.burst <= MAX_LIMIT:
            bad("burst", f"must be 1 to {MAX_LIMIT}, got {self.burst}")
        if len(self.workflows) > MAX_WORKFLOW_CAPS:
            bad(
                "workflows", f"at most {MAX_WORKFLOW_CAPS} workflow caps, got {len(self.workflows)}"
            )
        for slug, limit in self.workflows.items():
            name = "workflows/" + slug.replace("~", "~0").replace("/", "~1")
            if not slug or len(slug) > 200:
                bad(name, "a workflow slug must be 1 to 200 characters")
            if not 1 <= limit <= MAX_LIMIT:
                bad(name, f"must be 1 to {MAX_LIMIT}, got {limit}")
        return out


class FairPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The scheduling policy of every tenant (`DUCTOR_FAIRNESS`, JSON).

    Attributes:
        default: the policy of a tenant not named in `tenants`.
        tenants: per tenant id, its own policy.
        headroom: the fraction of the worker slots no one tenant may hold (0 to
            0.5, rounded up to whole slots): kept free for a tenant that arrives
            while another's slow tasks hold the rest; 0 lets one tenant take all.
    """

    default: TenantPolicy = msgspec.field(default_factory=TenantPolicy)
    tenants: dict[str, TenantPolicy] = msgspec.field(default_factory=dict)
    headroom: float = 0.125

    def of(self, tenant: str) -> TenantPolicy:
        """The policy that applies to `tenant`."""
        return self.tenants.get(tenant, self.default)

    def with_tenants(self, tenants: dict[str, TenantPolicy]) -> FairPolicy:
        """This policy with `tenants`' own policies in place of those named here."""
        if not tenants:
            return self
        return msgspec.structs.replace(self, tenants={**self.tenants, **tenants})

    def problems(self) -> list[tuple[str, str]]:
        """What is wrong with this policy: (JSON pointer, message) pairs."""
        out = self.default.problems("/default")
        for tenant, tp in self.tenants.items():
            key = tenant.replace("~", "~0").replace("/", "~1")
            out.extend(tp.problems(f"/tenants/{key}"))
        if not 0 <= self.headroom <= 0.5:
            out.append(("/headroom", f"must be 0 to 0.5, got {self.headroom}"))
        return out

    @classmethod
    def from_json(cls, text: str | bytes) -> FairPolicy:
        """Decode and check a policy.

        Raises:
            ValueError: naming every problem with its JSON pointer.
        """
        try:
            policy = msgspec.json.decode(text, type=cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"fairness policy: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ValueError(f"fairness policy is not JSON: {exc}") from exc
        problems = policy.problems()
        if problems:
            raise ValueError(
                "fairness policy: " + "; ".join(f"{where}: {what}" for where, what in problems)
            )
        return policy


@dataclass(frozen=True)
class Ticket:
    """One ready task as the scheduler sees it.

    Attributes:
        key: the task's identity (its id).
        tenant: whose task it is.
        workflow: its run's workflow (family slug).
        tier: its tier (a tenant policy's `tier`, when set, takes its place).
        seq: orders a tenant's tasks (oldest first).
        limit_key: its run's limit key (the workflow's CEL `key` over the run's
            input, evaluated once when the run was created); tasks of one
            tenant, workflow and limit key share the limits below. None: the run
            has no limits of its own.
        key_concurrency: at most this many tasks of the limit key leased at once.
        key_rate: at most this many tasks of the limit key started per second.
        key_burst: how many starts the key's rate lets through at once.
    """

    key: str
    tenant: str
    workflow: str
    tier: int = 0
    seq: int = 0
    limit_key: str | None = None
    key_concurrency: int | None = None
    key_rate: float | None = None
    key_burst: int = 1

    @property
    def group(self) -> tuple[str, str, str] | None:
        """What the key's limits count over: (tenant, workflow, limit key)."""
        if self.limit_key is None:
            return None
        return (self.tenant, self.workflow, self.limit_key)

    @property
    def flow(self) -> str:
        """The queue this ticket waits in within its tenant's workflow: one per
        limit key, so one key held back by its limits never blocks another."""
        return "" if self.limit_key is None else "k" + self.limit_key


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class _KeyBucket(_Bucket):
    rate: float
    burst: int


@dataclass
class _Flows:
    """A tenant's ready tickets of one workflow in one tier, one queue per flow,
    and a heap of the flows by the seq of their oldest ticket (entries whose
    flow's head has moved on are skipped when met)."""

    queues: dict[str, deque[Ticket]] = field(default_factory=dict)
    heads: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class _Tier:
    # tenant -> workflow -> its ready tickets
    queues: dict[str, dict[str, _Flows]] = field(default_factory=dict)
    ring: deque[str] = field(default_factory=deque)
    deficit: dict[str, int] = field(default_factory=dict)


_PRUNE_BUCKETS = 4096
"""Key rate buckets kept before the full ones (which say nothing) are dropped."""


class FairScheduler:
    """Ready and running tasks, and the fair order in which ready ones start.

    `push` adds a ready task, `pick` leases the next ones (they count as
    running), `finish` ends a running one and `requeue` makes it ready again.
    """

    def __init__(self, policy: FairPolicy | None = None) -> None:
        self.policy = policy or FairPolicy()
        self._tiers: dict[int, _Tier] = {}
        self._ready: dict[str, Ticket] = {}
        self._placed: dict[str, int] = {}  # ready ticket -> the tier it waits in
        self._running: dict[str, Ticket] = {}
        self._tenant_running: dict[str, int] = {}
        self._workflow_running: dict[tuple[str, str], int] = {}
        self._key_running: dict[tuple[str, str, str], int] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._key_buckets: dict[tuple[str, str, str], _KeyBucket] = {}

    # --- what is there ----------------------------------------------------------------

    def __contains__(self, key: object) -> bool:
        return key in self._ready or key in self._running

    @property
    def ready_count(self) -> int:
        """How many tasks wait to start."""
        return len(self._ready)

    @property
    def running_count(self) -> int:
        """How many tasks are running."""
        return len(self._running)

    def ready(self) -> Iterator[Ticket]:
        """The ready tickets (in no particular order)."""
        return iter(list(self._ready.values()))

    def running(self) -> Iterator[Ticket]:
        """The running tickets (in no particular order)."""
        return iter(list(self._running.values()))

    def running_of(self, tenant: str, workflow: str | None = None) -> int:
        """How many tasks of `tenant` (of its `workflow` if given) are running."""
        if workflow is None:
            return self._tenant_running.get(tenant, 0)
        return self._workflow_running.get((tenant, workflow), 0)

    def running_of_key(self, tenant: str, workflow: str, limit_key: str) -> int:
        """How many tasks of `tenant`'s `workflow` with `limit_key` are running."""
        return self._key_running.get((tenant, workflow, limit_key), 0)

    def running_ticket(self, key: str) -> Ticket | None:
        """The running ticket of task `key` (None: not running here)."""
        return self._running.get(key)

    def tier_of(self, ticket: Ticket) -> int:
        """The tier `ticket` waits in: its tenant policy's `tier`, else its own."""
        tier = self.policy.of(ticket.tenant).tier
        return ticket.tier if tier is None else tier

    # --- changes ----------------------------------------------------------------------

    def set_policy(self, policy: FairPolicy) -> None:
        """Schedule by `policy` from now on (running tasks keep running; ready ones
        move to the tier the new policy gives their tenant)."""
        if policy == self.policy:
            return
        self.policy = policy
        moved = [t for t in self._ready.values() if self.tier_of(t) != self._placed[t.key]]
        for ticket in moved:
            self.discard(ticket.key)
        for ticket in sorted(moved, key=lambda t: t.seq):
            self.push(ticket)

    def push(self, ticket: Ticket) -> bool:
        """Add a ready task; False if the scheduler already holds its key."""
        if ticket.key in self:
            return False
        level = self.tier_of(ticket)
        self._ready[ticket.key] = ticket
        self._placed[ticket.key] = level
        tier = self._tiers.setdefault(level, _Tier())
        workflows = tier.queues.get(ticket.tenant)
        if workflows is None:
            workflows = tier.queues[ticket.tenant] = {}
            tier.ring.append(ticket.tenant)
        flows = workflows.get(ticket.workflow)
        if flows is None:
            flows = workflows[ticket.workflow] = _Flows()
        queue = flows.queues.get(ticket.flow)
        if queue is None:
            queue = flows.queues[ticket.flow] = deque()
        if queue and queue[-1].seq > ticket.seq:
            # Out of order (a released task, or a task whose insert committed after
            # a later one's): insert it where its seq keeps the queue sorted, by
            # bisection, not by sorting the whole queue again on every such push.
            queue.insert(bisect.bisect_right(queue, ticket.seq, key=_seq), ticket)
        else:
            queue.append(ticket)
        if queue[0] is ticket:
            heapq.heappush(flows.heads, (ticket.seq, ticket.flow))
        return True

    def mark_running(self, ticket: Ticket) -> bool:
        """Count a task leased elsewhere (found in the store on a rebuild) as
        running; False if the scheduler already holds it as running."""
        if ticket.key in self._running:
            return False
        self.discard(ticket.key)
        self._start(ticket)
        return True

    def discard(self, key: str) -> bool:
        """Forget a ready task (taken or ended elsewhere); False if not ready."""
        ticket = self._ready.pop(key, None)
        if ticket is None:
            return False
        level = self._placed.pop(key)
        tier = self._tiers[level]
        workflows = tier.queues[ticket.tenant]
        flows = workflows[ticket.workflow]
        queue = flows.queues[ticket.flow]
        was_head = queue[0] is ticket
        queue.remove(ticket)
        if not queue:
            del flows.queues[ticket.flow]
        elif was_head:
            heapq.heappush(flows.heads, (queue[0].seq, ticket.flow))
        if not flows.queues:
            del workflows[ticket.workflow]
        if not workflows:
            self._drop_tenant(level, ticket.tenant)
        return True

    def rekey(self, key: str, new: Ticket) -> None:
        """A running ticket takes its task's identity (`new`: the same ticket with
        its key and order), known once the task is stored."""
        old = self._running.pop(key)
        assert (old.tenant, old.workflow, old.group) == (new.tenant, new.workflow, new.group)
        self._running[new.key] = new

    def finish(self, key: str) -> bool:
        """End a running task; False if it was not running."""
        ticket = self._running.pop(key, None)
        if ticket is None:
            return False
        _decrement(self._tenant_running, ticket.tenant)
        _decrement(self._workflow_running, (ticket.tenant, ticket.workflow))
        if (group := ticket.group) is not None:
            _decrement(self._key_running, group)
        return True

    def requeue(self, key: str) -> bool:
        """Make a running task ready again (released); False if it was not running."""
        ticket = self._running.get(key)
        if ticket is None:
            return False
        self.finish(key)
        self.push(ticket)
        return True

    # --- the choice -------------------------------------------------------------------

    def pick(self, limit: int, now: float, *, capacity: int | None = None) -> list[Ticket]:
        """Start up to `limit` ready tasks, fairly; fewer when the rest must wait.

        With `capacity` (the worker slots there are), a tenant already holding
        its share of them (`capacity * weight / total weight` of the tenants with
        ready or running tasks) gets another only when no tenant below its share
        can start one, and no tenant ever holds more than `tenant_cap(capacity)`.
        """
        picked: list[Ticket] = []
        while len(picked) < limit:
            ticket = self._pick_one(now, capacity)
            if ticket is None:
                break
            picked.append(ticket)
        return picked

    def start_at_once(self, ticket: Ticket, now: float, *, capacity: int | None = None) -> bool:
        """Start `ticket` without waiting its turn, when that takes no turn from
        anyone: no task is ready at all, its tenant holds less than its share of
        `capacity` (and less than `tenant_cap`), and no limit holds it back.
        True: it counts as running (its rate tokens taken); False: it must wait
        in the queue like any other.
        """
        if self._ready or ticket.key in self._running:
            return False
        if capacity is not None and (
            self.running_of(ticket.tenant) >= self.tenant_cap(capacity)
            or self.over_share(ticket.tenant, capacity)
        ):
            return False
        if not self.could_start(ticket, now):
            return False
        self._take_token(ticket.tenant, self.policy.of(ticket.tenant), now)
        self._take_key_token(ticket, now)
        self._start(ticket)
        return True

    def tenant_cap(self, capacity: int) -> int:
        """The most slots of `capacity` one tenant may hold: all but the policy's
        `headroom`, kept for a tenant that arrives while another's tasks run."""
        return max(1, capacity - math.ceil(capacity * self.policy.headroom))

    def could_start(self, ticket: Ticket, now: float) -> bool:
        """True if no limit holds `ticket` back at `now` (ignoring the order)."""
        tp = self.policy.of(ticket.tenant)
        if tp.max_running is not None and self.running_of(ticket.tenant) >= tp.max_running:
            return False
        cap = tp.workflows.get(ticket.workflow)
        if cap is not None and self.running_of(ticket.tenant, ticket.workflow) >= cap:
            return False
        return self._tokens(ticket.tenant, tp, now) >= 1 and self._key_allows(ticket, now)

    def has_ready(self, tenant: str) -> bool:
        """True if `tenant` has a ready task (startable or not)."""
        return any(tenant in tier.queues for tier in self._tiers.values())

    def share_of(self, tenant: str, capacity: int) -> float:
        """The slots `tenant` is due out of `capacity`, among the tenants that
        have ready or running tasks (and `tenant` itself)."""
        active = {tenant, *self._tenant_running}
        for tier in self._tiers.values():
            active.update(tier.queues)
        total = sum(self.policy.of(t).weight for t in active)
        return capacity * self.policy.of(tenant).weight / total

    def over_share(self, tenant: str, capacity: int) -> bool:
        """True if `tenant` holds at least its share of `capacity` slots."""
        return self.running_of(tenant) >= self.share_of(tenant, capacity)

    def next_start_at(self, now: float) -> float | None:
        """When a task held back only by a rate limit (its tenant's or its key's)
        can start again (None: no ready task waits on a rate)."""
        soonest: float | None = None

        def consider(at: float) -> None:
            nonlocal soonest
            soonest = at if soonest is None else min(soonest, at)

        for tier in self._tiers.values():
            for tenant in tier.queues:
                tp = self.policy.of(tenant)
                if tp.rate is None:
                    continue
                missing = 1 - self._tokens(tenant, tp, now)
                if missing > 0:
                    consider(now + missing / tp.rate)
        for ticket in self._heads():
            if ticket.key_rate is None or (group := ticket.group) is None:
                continue
            missing = 1 - self._key_tokens(group, ticket, now)
            if missing > 0:
                consider(now + missing / ticket.key_rate)
        return soonest

    def _heads(self) -> Iterator[Ticket]:
        for tier in self._tiers.values():
            for workflows in tier.queues.values():
                for flows in workflows.values():
                    for queue in flows.queues.values():
                        yield queue[0]

    def _pick_one(self, now: float, capacity: int | None) -> Ticket | None:
        cap = None if capacity is None else self.tenant_cap(capacity)
        for level in sorted(self._tiers, reverse=True):
            tier = self._tiers[level]
            ticket = None
            if capacity is not None:
                ticket = self._pick_in(tier, now, capacity, cap)
            if ticket is None:
                ticket = self._pick_in(tier, now, None, cap)
            if ticket is not None:
                return ticket
        return None

    def _pick_in(
        self, tier: _Tier, now: float, capacity: int | None, cap: int | None
    ) -> Ticket | None:
        for _ in range(len(tier.ring)):
            tenant = tier.ring[0]
            if (cap is not None and self.running_of(tenant) >= cap) or (
                capacity is not None and self.over_share(tenant, capacity)
            ):
                tier.ring.rotate(-1)
                continue
            tp = self.policy.of(tenant)
            ticket = self._head(tier, tenant, tp, now)
            if ticket is None:
                # Held back by a limit: no credit banked while it waits.
                tier.deficit[tenant] = 0
                tier.ring.rotate(-1)
                continue
            credit = tier.deficit.get(tenant, 0)
            if credit < 1:
                credit += tp.weight
            credit -= 1
            self.discard(ticket.key)
            if tenant in tier.queues:
                if credit < 1:
                    tier.ring.rotate(-1)
                tier.deficit[tenant] = credit
            self._take_token(tenant, tp, now)
            self._take_key_token(ticket, now)
            self._start(ticket)
            return ticket
        return None

    def _head(self, tier: _Tier, tenant: str, tp: TenantPolicy, now: float) -> Ticket | None:
        """The oldest ready task of `tenant` in `tier` that its limits let start."""
        if tp.max_running is not None and self.running_of(tenant) >= tp.max_running:
            return None
        if self._tokens(tenant, tp, now) < 1:
            return None
        best: Ticket | None = None
        for workflow, flows in tier.queues[tenant].items():
            cap = tp.workflows.get(workflow)
            if cap is not None and self.running_of(tenant, workflow) >= cap:
                continue
            ticket = self._first_startable(flows, now)
            if ticket is not None and (best is None or ticket.seq < best.seq):
                best = ticket
        return best

    def _first_startable(self, flows: _Flows, now: float) -> Ticket | None:
        """The oldest flow head its key's limits let start. The flows met on
        the way are held back by their keys (at most as many as run, plus those
        waiting on their rate)."""
        met: list[tuple[int, str]] = []
        seen: set[str] = set()
        found: Ticket | None = None
        while flows.heads:
            seq, flow = heapq.heappop(flows.heads)
            queue = flows.queues.get(flow)
            if not queue or queue[0].seq != seq or flow in seen:
                continue  # the flow's head moved on (or this entry is a repeat)
            seen.add(flow)
            met.append((seq, flow))
            if self._key_allows(queue[0], now):
                found = queue[0]
                break
        for entry in met:
            heapq.heappush(flows.heads, entry)
        return found

    def _key_allows(self, ticket: Ticket, now: float) -> bool:
        group = ticket.group
        if group is None:
            return True
        limit = ticket.key_concurrency
        if limit is not None and self._key_running.get(group, 0) >= limit:
            return False
        return ticket.key_rate is None or self._key_tokens(group, ticket, now) >= 1

    def _tokens(self, tenant: str, tp: TenantPolicy, now: float) -> float:
        if tp.rate is None:
            return float("inf")
        bucket = self._buckets.get(tenant)
        if bucket is None:
            return float(tp.burst)
        return min(float(tp.burst), bucket.tokens + max(now - bucket.at, 0.0) * tp.rate)

    def _take_token(self, tenant: str, tp: TenantPolicy, now: float) -> None:
        if tp.rate is None:
            return
        at = max(now, self._buckets[tenant].at) if tenant in self._buckets else now
        self._buckets[tenant] = _Bucket(tokens=self._tokens(tenant, tp, now) - 1, at=at)

    def _key_tokens(self, group: tuple[str, str, str], ticket: Ticket, now: float) -> float:
        rate = ticket.key_rate
        if rate is None:
            return float("inf")
        bucket = self._key_buckets.get(group)
        if bucket is None:
            return float(ticket.key_burst)
        return min(float(ticket.key_burst), bucket.tokens + max(now - bucket.at, 0.0) * rate)

    def _take_key_token(self, ticket: Ticket, now: float) -> None:
        group = ticket.group
        if group is None or ticket.key_rate is None:
            return
        old = self._key_buckets.get(group)
        at = now if old is None else max(now, old.at)
        tokens = self._key_tokens(group, ticket, now) - 1
        self._key_buckets[group] = _KeyBucket(
            tokens=tokens, at=at, rate=ticket.key_rate, burst=ticket.key_burst
        )
        if len(self._key_buckets) > _PRUNE_BUCKETS:
            self._prune_key_buckets(now)

    def _prune_key_buckets(self, now: float) -> None:
        # A bucket refilled to its burst says nothing a missing one would not.
        full = [
            g
            for g, b in self._key_buckets.items()
            if b.tokens + max(now - b.at, 0.0) * b.rate >= b.burst
        ]
        for group in full:
            del self._key_buckets[group]

    def _start(self, ticket: Ticket) -> None:
        self._running[ticket.key] = ticket
        self._tenant_running[ticket.tenant] = self._tenant_running.get(ticket.tenant, 0) + 1
        flow = (ticket.tenant, ticket.workflow)
        self._workflow_running[flow] = self._workflow_running.get(flow, 0) + 1
        if (group := ticket.group) is not None:
            self._key_running[group] = self._key_running.get(group, 0) + 1

    def _drop_tenant(self, level: int, tenant: str) -> None:
        tier = self._tiers[level]
        del tier.queues[tenant]
        tier.ring.remove(tenant)
        tier.deficit.pop(tenant, None)
        if not tier.queues:
            del self._tiers[level]


def _seq(ticket: Ticket) -> int:
    return ticket.seq


def _decrement(counts: dict[Any, int], key: Any) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


__all__ = [
    "MAX_LIMIT",
    "MAX_TIER",
    "MAX_WEIGHT",
    "MAX_WORKFLOW_CAPS",
    "FairPolicy",
    "FairScheduler",
    "TenantPolicy",
    "Ticket",
]
