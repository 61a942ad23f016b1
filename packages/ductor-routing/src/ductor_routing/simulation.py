"""Offline simulation: replay a stream of events through the real pipeline, state in memory.

The caller reads the files and writes the output; this module only turns
decoded events into decisions, commits them to an `InMemoryRoutingState` and
keeps the tallies for the summary table. Same config, events and seed give
the same decisions.
"""

from __future__ import annotations

import datetime

import msgspec

from ductor_routing.decisions import Decision, Outcome
from ductor_routing.errors import AssignConflict, ConfigError
from ductor_routing.pipeline import Router
from ductor_routing.routables import Routable
from ductor_routing.shadow import ShadowStrategyReport, ShadowTally
from ductor_routing.state import InMemoryRoutingState


class SimEvent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One line of the events file: a routable to route, or a completion.

    Attributes:
        at: when it happens (the pipeline's `now`).
        routable: a routable to route.
        complete: the id of an earlier routable whose assignee finished it,
            which gives its load back.
    """

    at: datetime.datetime
    routable: Routable | None = None
    complete: str | None = None


def decode_event(line: bytes | str, *, line_no: int = 0) -> SimEvent:
    """Decode one JSONL line.

    Raises:
        ConfigError: the line is not a valid event (names the line number).
    """
    try:
        event = msgspec.json.decode(line, type=SimEvent)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"events line {line_no}: {exc}") from exc
    if (event.routable is None) == (event.complete is None):
        raise ConfigError(f"events line {line_no}: give exactly one of 'routable', 'complete'")
    return event


class RecipientSummary(msgspec.Struct, frozen=True, kw_only=True):
    """Totals for one member of one pool."""

    pool: str
    worker: str
    assigned: int
    spend: int
    filtered: dict[str, int]


class PoolSummary(msgspec.Struct, frozen=True, kw_only=True):
    """Totals for one pool."""

    pool: str
    decisions: int
    assigned: int
    unassigned: int
    spend: int


class SimulationSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What a simulation did, for the summary table and for tests.

    `routed` counts decisions made; `duplicates` (a routable repeated at the
    same time, hence the same decision) and `conflicts` are not in the
    outcome counts nor in the per-pool and per-recipient tallies.
    """

    events: int
    routed: int
    assigned: int
    unassigned: int
    invalid: int
    completed: int
    conflicts: int
    duplicates: int
    spend: int
    pools: tuple[PoolSummary, ...]
    recipients: tuple[RecipientSummary, ...]
    shadows: tuple[ShadowStrategyReport, ...]


class Simulation:
    """Replays events through `router`, committing each intent to in-memory state.

    Args:
        router: the compiled routing configuration.
        state: the starting state (empty if omitted).
    """

    def __init__(self, router: Router, state: InMemoryRoutingState | None = None) -> None:
        self.router = router
        self.state = state if state is not None else InMemoryRoutingState()
        self._events = 0
        self._outcomes = dict.fromkeys(Outcome, 0)
        self._completed = 0
        self._conflicts = 0
        self._duplicates = 0
        self._held: dict[str, tuple[str, str]] = {}
        self._pools: dict[str, list[int]] = {}
        self._recipients: dict[tuple[str, str], _Tally] = {}
        self._shadows = ShadowTally()
        for pool_id in router.pool_ids:
            self._pools[pool_id] = [0, 0, 0, 0]
            for member in router.pool(pool_id).members:
                self._recipients[(pool_id, member.worker)] = _Tally()

    def feed(self, event: SimEvent) -> Decision | None:
        """Apply one event; return the decision when it routed a routable."""
        self._events += 1
        if event.complete is not None:
            held = self._held.pop(event.complete, None)
            if held is not None:
                self.state.release(held[0], held[1])
                self._completed += 1
            return None
        routable = event.routable
        assert routable is not None  # decode_event guarantees one of the two
        decision = self.router.route(routable, self.state, event.at)
        if decision.intent is not None:
            try:
                applied = self.state.commit(decision.intent)
            except AssignConflict:  # cannot happen single-threaded; counted if it does
                self._conflicts += 1
                return decision
            if not applied:
                # The same routable at the same time again: the same decision,
                # already committed once.
                self._duplicates += 1
                return decision
            self._held[routable.id] = (decision.intent.worker, decision.intent.channel)
        self._count(decision)
        return decision

    def _count(self, decision: Decision) -> None:
        self._outcomes[decision.outcome] += 1
        ex = decision.explanation
        if ex.pool is None:
            return
        pool_row = self._pools[ex.pool]
        pool_row[0] += 1
        if decision.outcome is Outcome.ASSIGNED and decision.worker is not None:
            pool_row[1] += 1
            pool_row[3] += decision.charge
            tally = self._recipients[(ex.pool, decision.worker)]
            tally.assigned += 1
            tally.spend += decision.charge
        else:
            pool_row[2] += 1
        for exclusion in ex.excluded:
            for worker in exclusion.workers:
                filtered = self._recipients[(ex.pool, worker)].filtered
                filtered[exclusion.reason] = filtered.get(exclusion.reason, 0) + 1
        self._shadows.add(decision)

    def summary(self) -> SimulationSummary:
        """The totals so far."""
        pools = tuple(
            PoolSummary(pool=p, decisions=r[0], assigned=r[1], unassigned=r[2], spend=r[3])
            for p, r in self._pools.items()
        )
        recipients = tuple(
            RecipientSummary(
                pool=pool,
                worker=worker,
                assigned=t.assigned,
                spend=t.spend,
                filtered=dict(sorted(t.filtered.items())),
            )
            for (pool, worker), t in self._recipients.items()
        )
        return SimulationSummary(
            events=self._events,
            routed=sum(self._outcomes.values()) + self._duplicates + self._conflicts,
            assigned=self._outcomes[Outcome.ASSIGNED],
            unassigned=self._outcomes[Outcome.UNASSIGNED],
            invalid=self._outcomes[Outcome.INVALID],
            completed=self._completed,
            conflicts=self._conflicts,
            duplicates=self._duplicates,
            spend=sum(p.spend for p in pools),
            pools=pools,
            recipients=recipients,
            shadows=self._shadows.report(),
        )


class _Tally:
    __slots__ = ("assigned", "filtered", "spend")

    def __init__(self) -> None:
        self.assigned = 0
        self.spend = 0
        self.filtered: dict[str, int] = {}


def format_micros(micros: int) -> str:
    """Micros as a decimal amount with two places, e.g. 12_500_000 -> "12.50"."""
    sign = "-" if micros < 0 else ""
    cents = (abs(micros) + 5_000) // 10_000
    return f"{sign}{cents // 100}.{cents % 100:02d}"


def format_summary(summary: SimulationSummary) -> str:
    """The summary as plain-text tables: totals, per pool, per recipient, shadows."""
    lines = [
        f"events {summary.events}  routed {summary.routed}  assigned {summary.assigned}  "
        f"unassigned {summary.unassigned}  invalid {summary.invalid}  "
        f"completed {summary.completed}  duplicates {summary.duplicates}  "
        f"spend {format_micros(summary.spend)}",
        "",
    ]
    reasons = sorted({r for rec in summary.recipients for r in rec.filtered})
    header = ["pool", "recipient", "assigned", *(f"filtered:{r}" for r in reasons), "spend"]
    rows: list[list[str]] = []
    for pool in summary.pools:
        rows.append(
            [pool.pool, "(all)", str(pool.assigned)]
            + [
                str(
                    sum(
                        rec.filtered.get(r, 0)
                        for rec in summary.recipients
                        if rec.pool == pool.pool
                    )
                )
                for r in reasons
            ]
            + [format_micros(pool.spend)]
        )
        for rec in summary.recipients:
            if rec.pool == pool.pool:
                rows.append(
                    ["", rec.worker, str(rec.assigned)]
                    + [str(rec.filtered.get(r, 0)) for r in reasons]
                    + [format_micros(rec.spend)]
                )
        rows.append(["", "(unassigned)", str(pool.unassigned)] + ["" for _ in reasons] + [""])
    # Routables no pool took (no rule matched and no default pool), and invalid ones.
    poolless = summary.unassigned - sum(pool.unassigned for pool in summary.pools)
    if poolless or summary.invalid:
        rows.append(["(no pool)", "(unassigned)", str(poolless)] + ["" for _ in reasons] + [""])
        rows.append(["", "(invalid)", str(summary.invalid)] + ["" for _ in reasons] + [""])
    lines.extend(_table(header, rows))
    if summary.shadows:
        lines.append("")
        shadow_rows = [
            [
                s.pool,
                s.live_strategy,
                s.strategy,
                str(s.decisions),
                f"{s.agreement_rate * 100:.1f}%",
                str(s.decisions - s.agreements),
            ]
            for s in summary.shadows
        ]
        lines.extend(
            _table(["pool", "live", "shadow", "decisions", "agreement", "differ"], shadow_rows)
        )
    return "\n".join(lines) + "\n"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def render(cells: list[str]) -> str:
        out = [cells[0].ljust(widths[0]), cells[1].ljust(widths[1])]
        out.extend(cell.rjust(widths[i + 2]) for i, cell in enumerate(cells[2:]))
        return "  ".join(out).rstrip()

    return [render(header), "  ".join("-" * w for w in widths), *(render(r) for r in rows)]
