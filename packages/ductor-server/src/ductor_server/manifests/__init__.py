"""Declarative configuration: manifest files of workflows, workers, pools, rule sets and
connections, planned against a server and applied (`ductor apply`, `serve --seed`).

`files` reads the manifests; `plan` diffs them against a `Target` with the
server's validators and applies the plan; `rest` and `local` are the two targets
(the REST API, the services of a starting process).
"""

from __future__ import annotations

from ductor_server.manifests.files import KINDS, Problem, Resource, read_manifests, where
from ductor_server.manifests.plan import (
    Action,
    Change,
    Plan,
    Target,
    TargetError,
    apply_plan,
    make_plan,
)

__all__ = [
    "KINDS",
    "Action",
    "Change",
    "Plan",
    "Problem",
    "Resource",
    "Target",
    "TargetError",
    "apply_plan",
    "make_plan",
    "read_manifests",
    "where",
]
