"""Extensions: the eight entry-point groups plugins publish under, the one mechanism
that loads them, and the lifecycle-hook dispatcher.

The composition root loads them once per process (`installed_extensions`) and
hands each point's values to what uses it; `GET /v1/extensions` and `ductor
extensions list` show the same listing. See docs/extending.md.
"""

from __future__ import annotations

from ductor_server.extensions.hooks import (
    DECISION_MADE,
    DEFAULT_HOOK_TIMEOUT,
    ENTRY_POSTED,
    EVENT_NAMES,
    RUN_FINISHED,
    SERVER_STARTED,
    SERVER_STOPPING,
    Hook,
    HookDispatcher,
    HookEvent,
)
from ductor_server.extensions.loader import (
    CEL_FUNCTIONS,
    ExtensionFailure,
    Extensions,
    ExtensionsView,
    LoadedExtension,
    PointView,
    install_cel_functions,
    installed_extensions,
    is_installed,
    load_extensions,
    register_cel_functions,
)
from ductor_server.extensions.points import (
    POINTS,
    ExtensionContractError,
    ExtensionPoint,
    KindValidator,
    StepExtension,
    StepHandler,
)

__all__ = [
    "CEL_FUNCTIONS",
    # events
    "DECISION_MADE",
    "DEFAULT_HOOK_TIMEOUT",
    "ENTRY_POSTED",
    "EVENT_NAMES",
    # the points and their contracts
    "POINTS",
    "RUN_FINISHED",
    "SERVER_STARTED",
    "SERVER_STOPPING",
    "ExtensionContractError",
    # loading
    "ExtensionFailure",
    "ExtensionPoint",
    "Extensions",
    "ExtensionsView",
    "Hook",
    "HookDispatcher",
    "HookEvent",
    "KindValidator",
    "LoadedExtension",
    "PointView",
    "StepExtension",
    "StepHandler",
    "install_cel_functions",
    "installed_extensions",
    "is_installed",
    "load_extensions",
    "register_cel_functions",
]
