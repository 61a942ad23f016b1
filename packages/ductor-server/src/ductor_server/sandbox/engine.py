"""An `ExpressionEngine` that sends costly expressions to the sandbox and keeps the
rest in-process, untouched.

An expression whose static cost estimate is at least `threshold` compiles to a
`SandboxedProgram`, evaluated in a `SandboxPool` process. One under it with a
comprehension compiles to a `WatchedProgram`, which sends an evaluation to the
sandbox when the estimate made again with the variables (their sizes, the
weight of their lists' items) reaches `threshold`. Every other one compiles to
the inner engine's own program object, so the common path runs exactly the
code it ran without a sandbox. No I/O but the pool's pipes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Mapping
from typing import Any

from ductor_core.expressions import (
    BUILTIN_FUNCTIONS,
    BoundVariables,
    CelRustProgram,
    CompiledExpression,
    CostLimits,
    ExpressionEngine,
    FunctionRegistry,
    engine_by_name,
    estimate_cost,
)
from ductor_server.sandbox.pool import SandboxLimits, SandboxPool

#: Expressions estimated at this many cost units or more run in the sandbox. A
#: routing rule costs tens of units and a filter().map() over an input list a few
#: thousand; cel-rust has been measured taking up to about 300 us per unit.
DEFAULT_THRESHOLD = 10_000

# How many recent bind() results per thread remember their variables (a
# decision binds once and evaluates all its rules at once).
_REMEMBERED_BINDS = 8


class SandboxedProgram:
    """A costly program: each evaluation runs in a sandbox process."""

    __slots__ = ("_engine", "cost", "source")

    def __init__(self, source: str, cost: int, engine: SandboxedEngine) -> None:
        self.source = source
        self.cost = cost
        self._engine = engine

    def evaluate(self, activation: Any) -> Any:
        """Evaluate in the sandbox against a mapping, or variables this engine bound."""
        return self._engine._evaluate_sandboxed(self.source, activation)


class WatchedProgram:
    """A program under the threshold whose cost grows with its variables (it has a
    comprehension): each evaluation is estimated with them, as the inner program
    does anyway, and runs in the sandbox when that estimate reaches the threshold."""

    __slots__ = ("_engine", "_inner", "source")

    def __init__(self, inner: CelRustProgram, engine: SandboxedEngine) -> None:
        self.source = inner.source
        self._inner = inner
        self._engine = engine

    def evaluate(self, activation: Any) -> Any:
        """Evaluate in-process, or in the sandbox when these variables make it costly."""
        bound, cost = self._inner.admit(activation)
        if cost < self._engine.threshold:
            return self._inner.evaluate(bound)
        return self._engine._evaluate_sandboxed(self.source, activation)


class SandboxedEngine:
    """Wraps an engine: costly expressions evaluate in `pool`, the rest in-process.

    Args:
        inner: the in-process engine (compiles everything, evaluates cheap programs).
        pool: the sandbox processes of the same engine and limits.
        threshold: the estimated cost from which an expression is sandboxed.
        cache_size: how many compiled programs to keep.
        shared: custom functions the sandbox processes register too (the installed
            plugins' CEL functions); programs calling any other custom function
            stay in-process.
    """

    def __init__(
        self,
        inner: ExpressionEngine,
        pool: SandboxPool,
        *,
        threshold: int = DEFAULT_THRESHOLD,
        cache_size: int = 4096,
        shared: Collection[str] = (),
    ) -> None:
        self.inner = inner
        self.pool = pool
        self.threshold = threshold
        self._limits: CostLimits = getattr(inner, "limits", pool.limits)
        # Functions the sandbox processes do not have keep their programs in-process.
        builtin = {f.name: f.impl for f in BUILTIN_FUNCTIONS}
        self.shared = tuple(sorted(shared))
        self._local_only = tuple(
            f.name
            for f in inner.functions
            if builtin.get(f.name) is not f.impl and f.name not in self.shared
        )
        self._programs: OrderedDict[str, CompiledExpression] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._binds = threading.local()
        # Until a program is sandboxed, bind() is the inner engine's own method:
        # nothing to remember, nothing added.
        self.bind: Callable[[Mapping[str, Any]], BoundVariables] = inner.bind

    @property
    def name(self) -> str:
        return self.inner.name

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by recipe, for the engine's offload worker processes: a worker
        rebuilds one sandboxed engine of the same engine, limits and threshold
        (with sandbox processes of its own) and reuses it for every call, so
        costly expressions stay under the deadline and the memory cap there too.
        Only a wrapper of a process-wide engine (`engine_by_name`) travels."""
        try:
            shared = engine_by_name(self.inner.name)
        except ValueError:
            shared = None
        if shared is not self.inner:
            raise TypeError("only a sandbox around a process-wide engine can be pickled")
        recipe = (self.inner.name, self.pool.limits, self.pool.sandbox, self.threshold, self.shared)
        return (_rebuilt, recipe)

    @property
    def functions(self) -> FunctionRegistry:
        return self.inner.functions

    @property
    def limits(self) -> CostLimits:
        """The inner engine's cost limits."""
        return self._limits

    def compile(self, source: str) -> CompiledExpression:
        """The inner engine's program, or a `SandboxedProgram` when the estimate is at
        least `threshold` (both checked by the inner compile first)."""
        program = self._programs.get(source)
        if program is not None:
            return program
        inner = self.inner.compile(source)  # raises on syntax, functions and cost
        program = inner
        if not any(name in source for name in self._local_only):
            estimate = estimate_cost(source, self._limits)
            if estimate.cost >= self.threshold:
                program = SandboxedProgram(source, estimate.cost, self)
                self.bind = self._remembering_bind
            elif estimate.hottest is not None and isinstance(inner, CelRustProgram):
                program = WatchedProgram(inner, self)
                self.bind = self._remembering_bind
        with self._lock:
            self._programs[source] = program
            if len(self._programs) > self._cache_size:
                self._programs.popitem(last=False)
        return program

    def evaluate(self, source: str, activation: Any) -> Any:
        """Compile (cached) and evaluate `source`."""
        program = self._programs.get(source) or self.compile(source)
        return program.evaluate(activation)

    def _remembering_bind(self, activation: Mapping[str, Any]) -> BoundVariables:
        """`bind()` once a program is sandboxed: the inner engine's bound variables,
        with the mapping remembered (per thread, the last few) for sandboxed programs."""
        bound = self.inner.bind(activation)
        remembered: deque[tuple[BoundVariables, Mapping[str, Any]]] | None
        remembered = getattr(self._binds, "recent", None)
        if remembered is None:
            remembered = deque(maxlen=_REMEMBERED_BINDS)
            self._binds.recent = remembered
        remembered.append((bound, activation))
        return bound

    def _evaluate_sandboxed(self, source: str, activation: Any) -> Any:
        if isinstance(activation, Mapping):
            return self.pool.evaluate(source, activation)
        for bound, variables in reversed(getattr(self._binds, "recent", ())):
            if bound is activation:
                return self.pool.evaluate(source, variables)
        # Bound long ago or on another thread: the variables are gone, so
        # evaluate in-process, as without a sandbox.
        return self.inner.compile(source).evaluate(activation)

    def close(self) -> None:
        """Stop the sandbox processes."""
        self.pool.close()


_REBUILT: dict[tuple[Any, ...], SandboxedEngine] = {}
_REBUILT_LOCK = threading.Lock()


def _rebuilt(
    engine_name: str,
    limits: CostLimits,
    sandbox: SandboxLimits,
    threshold: int,
    shared: tuple[str, ...] = (),
) -> SandboxedEngine:
    """The sandboxed engine of this recipe in this process, built on first use."""
    key = (engine_name, limits, sandbox, threshold, shared)
    with _REBUILT_LOCK:
        found = _REBUILT.get(key)
        if found is None:
            pool = SandboxPool(engine_name, limits=limits, sandbox=sandbox)
            found = SandboxedEngine(
                engine_by_name(engine_name), pool, threshold=threshold, shared=shared
            )
            _REBUILT[key] = found
        return found
