"""docs/extending.md agrees with the code: its tables of groups, failure codes and hook
events are the code's, its JSON sample decodes as the listing, and its Python
samples run."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from ductor_server.extensions import EVENT_NAMES, POINTS, ExtensionsView
from ductor_server.extensions.loader import DUPLICATE, LOAD_FAILED
from ductor_server.extensions.points import ExtensionContractError
from ductor_server.extensions.wiring import PLUGIN_REFUSED

DOC = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()


def test_the_group_table_lists_every_point_in_order() -> None:
    table = DOC.split("## Publishing a plugin")[0]
    groups = re.findall(r"^\| `(ductor\.[a-z.]+)` \|", table, re.MULTILINE)
    assert groups == [point.group for point in POINTS]
    sections = re.findall(r"^## \d\. .*: `(ductor\.[a-z.]+)`$", DOC, re.MULTILINE)
    assert sections == groups


def test_the_failure_codes_are_the_codes() -> None:
    codes = re.findall(r"^\| `(extension\.[a-z_]+)` \|", DOC, re.MULTILINE)
    assert codes == [LOAD_FAILED, ExtensionContractError.code, DUPLICATE, PLUGIN_REFUSED]


def test_the_hook_events_are_the_events() -> None:
    section = DOC.split("## 7. ")[1].split("## 8. ")[0]
    events = re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \| ", section, re.MULTILINE)
    assert tuple(events) == EVENT_NAMES


def test_the_listing_sample_decodes() -> None:
    [sample] = re.findall(r"```json\n(.*?)\n```", DOC, re.DOTALL)
    view = msgspec.json.decode(sample, type=ExtensionsView)
    assert view.failures[0].code == ExtensionContractError.code


def test_the_python_samples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)\n```", DOC, re.DOTALL)
    assert len(blocks) == 4
    for block in blocks:
        exec(compile(block, "docs/extending.md", "exec"), {"__name__": "extending_doc"})
