"""Fair scheduling of ready tasks: which task runs next, and which must wait.

Pure and synchronous (no I/O, no clock of its own: callers pass `now`), so the
in-process queue uses it directly and the Redis queue's Lua script follows it
line by line; the property tests in `tests/engine/test_fairness.py` hold both
to the same rules:

- Tiers: a task of a higher tier is always picked before one of a lower tier
  that could also run (strict priority, so a busy high tier can starve lower ones).
- Within a tier, tenants share by weight (deficit round robin): while every
  tenant has work, tenant `t` gets `weight(t)` picks per round.
- Limits: a tenant never has more than `max_running` tasks leased, a workflow
  of a tenant never more than its limit, and a tenant never starts more than
  `burst + rate * T` tasks in any window of `T` seconds. A tenant held back
  by a limit is skipped, not waited for (the queue stays work-conserving).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

MAX_WEIGHT = 1000


class TenantPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one tenant is scheduled.

    Attributes:
        weight: its share within a tier relative to the other tenants (1 to 1000).
        max_running: at most this many of its tasks leased at once (None: no limit).
        rate: at most this many of its tasks started per second, on average (None: no limit).
        burst: how many starts the rate limit lets through at once (at least 1).
        workflows: per workflow slug, at most this many of its tasks leased at once.
    """

    weight: int = 1
    max_running: int | None = None
    rate: float | None = None
    burst: int = 1
    workflows: dict[str, int] = msgspec.field(default_factory=dict)

    def problems(self, pointer: str) -> list[str]:
        """What is wrong with this policy, each problem with its JSON pointer."""
        out: list[str] = []
        if not 1 <= self.weight <= MAX_WEIGHT:
            out.append(f"{pointer}/weight: must be 1 to {MAX_WEIGHT}, got {self.weight}")
        if self.max_running is not None and self.max_running < 1:
            out.append(f"{pointer}/max_running: must be at least 1, got {self.max_running}")
        if self.rate is not None and not self.rate > 0:
            out.append(f"{pointer}/rate: must be above 0, got {self.rate}")
        if self.burst < 1:
            out.append(f"{pointer}/burst: must be at least 1, got {self.burst}")
        for slug, limit in self.workflows.items():
            if limit < 1:
                out.append(f"{pointer}/workflows/{slug}: must be at least 1, got {limit}")
        return out


class FairPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The scheduling policy of every tenant (`DUCTOR_FAIRNESS`, JSON).

    Attributes:
        default: the policy of a tenant not named in `tenants`.
        tenants: per tenant id, its own policy.
    """

    default: TenantPolicy = msgspec.field(default_factory=TenantPolicy)
    tenants: dict[str, TenantPolicy] = msgspec.field(default_factory=dict)

    def of(self, tenant: str) -> TenantPolicy:
        """The policy that applies to `tenant`."""
        return self.tenants.get(tenant, self.default)

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
        problems = policy.default.problems("/default")
        for tenant, tp in policy.tenants.items():
            problems.extend(tp.problems(f"/tenants/{tenant}"))
        if problems:
            raise ValueError("fairness policy: " + "; ".join(problems))
        return policy


@dataclass(frozen=True)
class Ticket:
    """One ready task as the scheduler sees it. `seq` orders a tenant's tasks
    (oldest first); `key` is the task's identity (its id)."""

    key: str
    tenant: str
    workflow: str
    tier: int = 0
    seq: int = 0


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class _Tier:
    # tenant -> workflow -> its ready tickets in seq order
    queues: dict[str, dict[str, deque[Ticket]]] = field(default_factory=dict)
    ring: deque[str] = field(default_factory=deque)
    deficit: dict[str, int] = field(default_factory=dict)


class FairScheduler:
    """Ready and running tasks, and the fair order in which ready ones start.

    `push` adds a ready task, `pick` leases the next ones (they count as
    running), `finish` ends a running one and `requeue` makes it ready again.
    """

    def __init__(self, policy: FairPolicy | None = None) -> None:
        self.policy = policy or FairPolicy()
        self._tiers: dict[int, _Tier] = {}
        self._ready: dict[str, Ticket] = {}
        self._running: dict[str, Ticket] = {}
        self._tenant_running: dict[str, int] = {}
        self._workflow_running: dict[tuple[str, str], int] = {}
        self._buckets: dict[str, _Bucket] = {}

    # --- what is there ----------------------------------------------------------------

    def __contains__(self, key: object) -> bool:
        return key in self._ready or key in self._running

    @property
    def ready_count(self) -> int:
        """How many tasks wait to start."""
        return len(self._ready)

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

    # --- changes ----------------------------------------------------------------------

    def push(self, ticket: Ticket) -> bool:
        """Add a ready task; False if the scheduler already holds its key."""
        if ticket.key in self:
            return False
        self._ready[ticket.key] = ticket
        tier = self._tiers.setdefault(ticket.tier, _Tier())
        flows = tier.queues.get(ticket.tenant)
        if flows is None:
            flows = tier.queues[ticket.tenant] = {}
            tier.ring.append(ticket.tenant)
        queue = flows.setdefault(ticket.workflow, deque())
        if queue and queue[-1].seq > ticket.seq:
            # Out of order (a released task): keep the queue sorted by seq.
            items = sorted([*queue, ticket], key=lambda t: t.seq)
            queue.clear()
            queue.extend(items)
        else:
            queue.append(ticket)
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
        tier = self._tiers[ticket.tier]
        flows = tier.queues[ticket.tenant]
        queue = flows[ticket.workflow]
        queue.remove(ticket)
        if not queue:
            del flows[ticket.workflow]
        if not flows:
            self._drop_tenant(ticket.tier, ticket.tenant)
        return True

    def finish(self, key: str) -> bool:
        """End a running task; False if it was not running."""
        ticket = self._running.pop(key, None)
        if ticket is None:
            return False
        self._tenant_running[ticket.tenant] -= 1
        if not self._tenant_running[ticket.tenant]:
            del self._tenant_running[ticket.tenant]
        flow = (ticket.tenant, ticket.workflow)
        self._workflow_running[flow] -= 1
        if not self._workflow_running[flow]:
            del self._workflow_running[flow]
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
        can start one.
        """
        picked: list[Ticket] = []
        while len(picked) < limit:
            ticket = self._pick_one(now, capacity)
            if ticket is None:
                break
            picked.append(ticket)
        return picked

    def could_start(self, ticket: Ticket, now: float) -> bool:
        """True if no limit holds `ticket` back at `now` (ignoring the order)."""
        tp = self.policy.of(ticket.tenant)
        if tp.max_running is not None and self.running_of(ticket.tenant) >= tp.max_running:
            return False
        cap = tp.workflows.get(ticket.workflow)
        if cap is not None and self.running_of(ticket.tenant, ticket.workflow) >= cap:
            return False
        return self._tokens(ticket.tenant, tp, now) >= 1

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
        """When a tenant held back only by its rate limit can start again (None:
        no ready tenant waits on its rate)."""
        soonest: float | None = None
        for tier in self._tiers.values():
            for tenant in tier.queues:
                tp = self.policy.of(tenant)
                if tp.rate is None:
                    continue
                missing = 1 - self._tokens(tenant, tp, now)
                if missing > 0:
                    at = now + missing / tp.rate
                    soonest = at if soonest is None else min(soonest, at)
        return soonest

    def _pick_one(self, now: float, capacity: int | None) -> Ticket | None:
        for level in sorted(self._tiers, reverse=True):
            tier = self._tiers[level]
            ticket = None
            if capacity is not None:
                ticket = self._pick_in(tier, now, capacity)
            if ticket is None:
                ticket = self._pick_in(tier, now, None)
            if ticket is not None:
                return ticket
        return None

    def _pick_in(self, tier: _Tier, now: float, capacity: int | None) -> Ticket | None:
        for _ in range(len(tier.ring)):
            tenant = tier.ring[0]
            if capacity is not None and self.over_share(tenant, capacity):
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
        for workflow, queue in tier.queues[tenant].items():
            cap = tp.workflows.get(workflow)
            if cap is not None and self.running_of(tenant, workflow) >= cap:
                continue
            if best is None or queue[0].seq < best.seq:
                best = queue[0]
        return best

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

    def _start(self, ticket: Ticket) -> None:
        self._running[ticket.key] = ticket
        self._tenant_running[ticket.tenant] = self._tenant_running.get(ticket.tenant, 0) + 1
        flow = (ticket.tenant, ticket.workflow)
        self._workflow_running[flow] = self._workflow_running.get(flow, 0) + 1

    def _drop_tenant(self, level: int, tenant: str) -> None:
        tier = self._tiers[level]
        del tier.queues[tenant]
        tier.ring.remove(tenant)
        tier.deficit.pop(tenant, None)
        if not tier.queues:
            del self._tiers[level]


__all__ = ["MAX_WEIGHT", "FairPolicy", "FairScheduler", "TenantPolicy", "Ticket"]
