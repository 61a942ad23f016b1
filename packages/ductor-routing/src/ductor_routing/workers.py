"""The worker registry model: one identity for humans, agents and systems.

Plain data only; availability and capacity are read by the pipeline, never changed here.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

MAX_PROFICIENCY = 100
"""The highest skill level; proficiencies run from 0 to this."""


class WorkerKind(enum.StrEnum):
    """What a worker is; routing treats all kinds the same way."""

    HUMAN = "human"
    AGENT = "agent"
    SYSTEM = "system"


class Availability(enum.StrEnum):
    """Whether a worker can take new work now; only AVAILABLE is eligible."""

    AVAILABLE = "available"
    BUSY = "busy"
    AWAY = "away"
    OFFLINE = "offline"


class Worker(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A recipient of work: a person, an agent, a queue or a downstream system.

    Attributes:
        id: unique worker id.
        kind: human, agent or system.
        name: display name.
        skills: skill name to proficiency (0-100), used by the skills strategy.
        attributes: JSON attributes member filters may read as `worker.attributes`.
        capacity: concurrent work items per channel; a channel that is absent
            is unlimited, 0 means the worker takes nothing on that channel.
        availability: only "available" workers are eligible.
        weight: relative share for the weighted strategy (a member may override it).
    """

    id: str
    kind: WorkerKind = WorkerKind.HUMAN
    name: str | None = None
    skills: dict[str, int] = {}
    attributes: dict[str, Any] = {}
    capacity: dict[str, int] = {}
    availability: Availability = Availability.AVAILABLE
    weight: int = 1

    def activation(self) -> dict[str, Any]:
        """The worker as the JSON value CEL sees under the name `worker`."""
        return {
            "id": self.id,
            "kind": self.kind.value,
            "skills": self.skills,
            "attributes": self.attributes,
            "weight": self.weight,
        }
