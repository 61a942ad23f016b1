"""The composition root wires one process: one CEL engine everywhere (DAG runs too),
a registry of step handlers of its own, and services bound to the runtime's parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from ductor_server.bridge.driver import BridgeDriver
from ductor_server.composition import build
from ductor_server.engine.actions import HttpAction
from ductor_server.services.route_step import RouteStep
from ductor_server.settings import Settings


@pytest.mark.parametrize("engine", ["cel-python", "cel-rust"])
def test_the_configured_engine_serves_dag_runs_routing_and_validation(
    engine: str, tmp_path: Path
) -> None:
    composition = build(Settings(data_dir=tmp_path, cel_engine=engine))
    expressions = composition.expressions
    assert expressions.name == engine
    assert composition.runtime.engine is expressions
    assert composition.runtime.parts.engine is expressions
    assert composition.services.routing.engine is expressions


def test_each_runtime_has_its_own_handlers(tmp_path: Path) -> None:
    one = build(Settings(data_dir=tmp_path))
    two = build(Settings(data_dir=tmp_path))
    route = one.actions.get("route")
    assert isinstance(route, RouteStep)
    assert route.service is one.services.routing
    assert two.actions.get("route") is not route
    http_one, http_two = one.actions.get("action:http"), two.actions.get("action:http")
    assert isinstance(http_one, HttpAction)
    assert http_one is not http_two  # stopping one runtime closes only its own client
    bridge = one.actions.get("bridge")
    assert isinstance(bridge, BridgeDriver)
    assert two.actions.get("bridge") is not bridge
    assert "bridge" in one.runtime.kinds.names()


def test_an_unknown_engine_is_refused_when_building(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown expression engine"):
        build(Settings(data_dir=tmp_path, cel_engine="cel-cobol"))


async def test_running_opens_migrates_and_closes_the_store(tmp_path: Path) -> None:
    composition = build(Settings(data_dir=tmp_path, poll_interval=0.05))
    async with composition.running():
        assert composition.runtime.running
        key = await composition.services.keys.provision("t1", name="k")
        assert (await composition.services.keys.authenticate(key)).tenant_id == "t1"
    assert not composition.runtime.running
    assert (tmp_path / "ductor.db").is_file()
