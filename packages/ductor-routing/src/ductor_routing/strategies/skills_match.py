"""Skills match: the candidate with the highest proficiency in the skills the work needs.

Required skills come from a routable attribute (a list of names, or name to
minimum level) and/or the strategy's `required` option.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ductor_routing.errors import ConfigError
from ductor_routing.strategies.base import Score, Selection, SelectionContext, check_options
from ductor_routing.workers import MAX_PROFICIENCY

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry


class SkillsMatch:
    """Score = mean proficiency over the required skills; a missing or too-low skill disqualifies.

    Args:
        attribute: the routable attribute naming the required skills.
        required: skills every routable of the pool needs (name to minimum level).
    """

    name = "skills_match"

    def __init__(self, *, attribute: str = "skills", required: Mapping[str, int] | None = None):
        self.attribute = attribute
        self.required = dict(required or {})

    def _requirements(self, attrs: Mapping[str, Any]) -> tuple[dict[str, int], str]:
        """The skills the routable needs, and what is wrong with its requirement
        (empty if nothing): a requirement it states badly is never dropped, since
        whoever got the work might then lack the skill."""
        needed = dict(self.required)
        raw = attrs.get(self.attribute)
        if raw is None:
            return needed, ""
        if isinstance(raw, list):
            for i, skill in enumerate(raw):
                if not isinstance(skill, str):
                    return needed, f"{self.attribute}[{i}] is {_shown(skill)}, not a skill name"
                needed.setdefault(skill, 0)
            return needed, ""
        if isinstance(raw, dict):
            for skill, level in raw.items():
                if isinstance(level, bool) or not isinstance(level, int):
                    return needed, (
                        f"{self.attribute}.{skill} is {_shown(level)}, not an integer level"
                    )
                needed[str(skill)] = max(needed.get(str(skill), 0), level)
            return needed, ""
        return needed, (
            f"{self.attribute} is {_shown(raw)}, not a list of skill names"
            " or an object of skill name to level"
        )

    def select(self, ctx: SelectionContext) -> Selection:
        """Rank qualified candidates by mean then total proficiency, then position."""
        needed, bad = self._requirements(ctx.routable.attributes)
        if bad:
            unscored = tuple(
                Score(worker=c.worker.id, value=None, note=bad) for c in ctx.candidates
            )
            return Selection(pick=None, scores=unscored, note=bad)
        scores: list[Score] = []
        best: tuple[float, int, int, str] | None = None
        for c in ctx.candidates:
            skills = c.worker.skills
            problem = ""
            for skill, level in sorted(needed.items()):
                have = skills.get(skill)
                if have is None:
                    problem = f"missing skill {skill}"
                    break
                if have < level:
                    problem = f"{skill} {have} < {level}"
                    break
            if problem:
                scores.append(Score(worker=c.worker.id, value=None, note=problem))
                continue
            total = sum(skills[s] for s in needed)
            mean = total / len(needed) if needed else 0.0
            scores.append(Score(worker=c.worker.id, value=mean, note="mean proficiency"))
            key = (-mean, -total, c.position, c.worker.id)
            if best is None or key < best:
                best = key
        if best is None:
            return Selection(pick=None, scores=tuple(scores), note="no candidate has the skills")
        return Selection(pick=best[3], scores=tuple(scores))


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def skills_match(options: Mapping[str, Any], registry: StrategyRegistry) -> SkillsMatch:
    """Factory: options `attribute` (str) and `required` (skill to minimum level)."""
    check_options("skills_match", options, ("attribute", "required"))
    attribute = options.get("attribute", "skills")
    required = options.get("required", {})
    if not isinstance(attribute, str) or not isinstance(required, dict):
        raise ConfigError("skills_match: 'attribute' must be a string, 'required' an object")
    for skill, level in required.items():
        if (
            isinstance(level, bool)
            or not isinstance(level, int)
            or not 0 <= level <= MAX_PROFICIENCY
        ):
            raise ConfigError(
                f"skills_match: 'required' level of {skill!r} must be an integer "
                f"from 0 to {MAX_PROFICIENCY}, not {level!r}"
            )
    return SkillsMatch(attribute=attribute, required={str(k): v for k, v in required.items()})
