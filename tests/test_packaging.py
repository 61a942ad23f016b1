"""The wheels, as docs/deploy.md builds and installs them: `uv build` of every
package, installed into a fresh virtual environment outside the checkout; then
each wheel's metadata and contents, and `ductor dev` with the hello-world of
docs/getting-started.md run from that environment alone (no checkout on the
path, no PYTHONPATH).

The build and install run once per module (they are the slow part).
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from packaging.requirements import Requirement

from ductor_server.testing import free_port

from .conftest import CHECKOUT, START_TIMEOUT

pytestmark = pytest.mark.slow

DEPLOY = CHECKOUT / "docs" / "deploy.md"
GETTING_STARTED = CHECKOUT / "docs" / "getting-started.md"
SDK = CHECKOUT / "docs" / "sdk.md"
PACKAGES = {
    "ductor-core": ("packages/ductor-core", "ductor_core"),
    "ductor-routing": ("packages/ductor-routing", "ductor_routing"),
    "ductor-settlement": ("packages/ductor-settlement", "ductor_settlement"),
    "ductor": ("packages/ductor-sdk", "ductor"),
    "ductor-server": ("packages/ductor-server", "ductor_server"),
    "ductor-ui": ("packages/ductor-ui", "ductor_ui"),
}


def section_blocks(path: Path, heading: str, language: str = "sh") -> list[str]:
    """The `language` blocks of the section of `path` under `heading` (a `#` line)."""
    text = "\n" + path.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return re.findall(rf"^```{language}\n(.*?)^```", section, re.DOTALL | re.MULTILINE)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without the checkout's: no virtualenv, no PYTHONPATH, no
    DUCTOR_* or project-environment settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DUCTOR_")
        and k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT"}
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(CHECKOUT))
    )
    env.update(extra)
    return env


@dataclass(frozen=True)
class Installed:
    work: Path
    dist: Path
    venv: Path
    log: str

    @property
    def bin(self) -> Path:
        return self.venv / "bin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """docs/deploy.md's install block, with its dist/ and /opt/ductor in a temp dir."""
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH (scripts/test puts it there)"
    work = tmp_path_factory.mktemp("packaging")
    (block,) = section_blocks(DEPLOY, "## Install from the wheels")
    script = block.replace("/opt/ductor", str(work / "venv")).replace("dist/", f"{work / 'dist'}/")
    env = clean_env(
        PATH=f"{Path(uv).parent}{os.pathsep}{clean_env()['PATH']}",
        UV_PYTHON=getattr(sys, "_base_executable", sys.executable),
        UV_PYTHON_DOWNLOADS="never",
    )
    attempts = []
    # From uv's cache first (no network); then as the doc says, from the index.
    for offline in ("1", ""):
        shutil.rmtree(work / "dist", ignore_errors=True)
        shutil.rmtree(work / "venv", ignore_errors=True)
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=CHECKOUT,
            env={**env, "UV_OFFLINE": offline} if offline else env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        attempts.append(f"--- UV_OFFLINE={offline!r}: exit {done.returncode}\n{done.stderr}")
        if done.returncode == 0:
            return Installed(work, work / "dist", work / "venv", done.stdout + done.stderr)
    raise AssertionError("the install block failed:\n" + "\n".join(attempts))


def wheel(installed: Installed, name: str) -> zipfile.ZipFile:
    (path,) = installed.dist.glob(f"{name.replace('-', '_')}-*-py3-none-any.whl")
    return zipfile.ZipFile(path)


def project(name: str) -> dict[str, Any]:
    folder, _ = PACKAGES[name]
    table: dict[str, Any] = tomllib.loads((CHECKOUT / folder / "pyproject.toml").read_text())
    return dict(table["project"])


def test_the_install_block_prints_the_version(installed: Installed) -> None:
    assert re.search(r"^ductor \d+\.\d+\.\d+$", installed.log, re.MULTILINE), installed.log
    wheels = sorted(p.name for p in installed.dist.glob("*.whl"))
    assert len(wheels) == len(PACKAGES), wheels
    assert (installed.dist / "constraints.txt").is_file()


def test_every_wheel_has_the_metadata_its_project_declares(installed: Installed) -> None:
    versions = {name: str(project(name)["version"]) for name in PACKAGES}
    assert len(set(versions.values())) == 1, f"the packages are released together: {versions}"
    (version,) = set(versions.values())
    for name in PACKAGES:
        declared = project(name)
        with wheel(installed, name) as whl:
            (meta_name,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
            meta = email.parser.Parser().parsestr(whl.read(meta_name).decode())
        assert meta["Name"] == name
        assert meta["Version"] == version
        assert meta["Requires-Python"] == declared["requires-python"]
        expected = {str(Requirement(r)) for r in declared["dependencies"]}
        for extra, reqs in declared.get("optional-dependencies", {}).items():
            expected |= {str(Requirement(f"{r}; extra == '{extra}'")) for r in reqs}
        assert {str(Requirement(r)) for r in meta.get_all("Requires-Dist") or []} == expected
        for requirement in map(Requirement, declared["dependencies"]):
            if requirement.name in PACKAGES:
                assert str(requirement.specifier) == f"=={version}", (
                    f"{name} must require {requirement.name} at its own version"
                )


def test_every_wheel_holds_its_package_and_no_tests(installed: Installed) -> None:
    for name, (folder, module) in PACKAGES.items():
        source = CHECKOUT / folder / "src" / module
        with wheel(installed, name) as whl:
            files = [n for n in whl.namelist() if not n.endswith("/")]
        inside = {n for n in files if not n.split("/", 1)[0].endswith(".dist-info")}
        assert inside, name
        assert all(n.startswith(f"{module}/") for n in inside), sorted(inside)
        for member in inside:
            parts = member.split("/")
            assert "tests" not in parts, member
            assert not parts[-1].startswith("test_"), member
            assert parts[-1] != "conftest.py", member
        expected = {
            f"{module}/{p.relative_to(source).as_posix()}"
            for p in source.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
        }
        assert inside == expected, f"{name}: {sorted(inside ^ expected)}"
        assert (f"{module}/py.typed" in inside) == (source / "py.typed").is_file()


def test_the_server_wheel_carries_both_backends_migrations(installed: Installed) -> None:
    source = CHECKOUT / "packages/ductor-server/src/ductor_server/storage/migrations"
    with wheel(installed, "ductor-server") as whl:
        for backend in ("postgres", "sqlite"):
            files = sorted((source / backend).glob("*.sql"))
            assert files, backend
            for path in files:
                member = f"ductor_server/storage/migrations/{backend}/{path.name}"
                assert whl.read(member) == path.read_bytes(), member
        entry_points = next(n for n in whl.namelist() if n.endswith("entry_points.txt"))
        assert "ductor = ductor_server.cli:main" in whl.read(entry_points).decode()


def test_the_environment_imports_nothing_from_the_checkout(installed: Installed) -> None:
    modules = [module for _, module in PACKAGES.values()]
    done = subprocess.run(
        [
            str(installed.bin / "python"),
            "-c",
            f"import {', '.join(modules)}\n" + "".join(f"print({m}.__file__)\n" for m in modules),
        ],
        cwd=installed.work,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines():
        assert Path(line).is_relative_to(installed.venv), line


@pytest.fixture
def dev_server(installed: Installed) -> Iterator[tuple[Path, int]]:
    """`ductor dev` of the installed environment, in a directory outside the checkout,
    with telemetry asked for (`OTEL_EXPORTER_OTLP_ENDPOINT`) but without the `otel`
    extra installed."""
    run_dir = installed.work / "run"
    run_dir.mkdir(exist_ok=True)
    port = free_port()
    with (run_dir / "server.log").open("ab") as log:
        proc = subprocess.Popen(
            [str(installed.bin / "ductor"), "dev", "--port", str(port)],
            cwd=run_dir,
            env=clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None, (run_dir / "server.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (run_dir / "server.log").read_text()
            time.sleep(0.1)
        yield run_dir, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_ductor_dev_runs_the_hello_world_from_the_wheels(
    installed: Installed, dev_server: tuple[Path, int]
) -> None:
    run_dir, port = dev_server
    blocks = [
        block
        for heading in (
            "## 2. Write and validate a workflow",
            "## 3. Publish it",
            "## 4. Trigger a run and watch it",
        )
        for block in section_blocks(GETTING_STARTED, heading)
    ]
    assert len(blocks) == 4
    script = "\n".join(b.replace("127.0.0.1:7070", f"127.0.0.1:{port}") for b in blocks)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=run_dir,
        env=clean_env(
            PATH=f"{installed.bin}{os.pathsep}{clean_env()['PATH']}",
            DUCTOR_PORT=str(port),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = (run_dir / "server.log").read_text()
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- server\n{log}"
    assert "hello-world.json: valid" in done.stdout
    assert "published hello-world version 1 (sha256:" in done.stdout
    assert re.search(r"hello-world v1  succeeded", done.stdout), done.stdout
    assert '"waited_until"' in done.stdout
    assert '"message":"hello"' in done.stdout.replace(" ", "")
    assert "Traceback" not in log
    # docs/observability.md: without the SDK, one warning naming the extra, and
    # the server runs without telemetry.
    assert "its SDK is not installed: install ductor-server[otel]; telemetry stays off" in log
    assert "OpenTelemetry: service" not in log


def test_the_sdk_wheel_stands_alone(installed: Installed) -> None:
    """docs/sdk.md's first install line, in an environment of its own (pip, as an
    application would), then its first example."""
    uv = shutil.which("uv")
    assert uv
    app = installed.work / "app"
    made = subprocess.run(
        [uv, "venv", "-q", "--seed", str(app / "venv")],
        env=clean_env(UV_PYTHON=getattr(sys, "_base_executable", sys.executable)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    (line, *_) = section_blocks(SDK, "# The bridge SDK (`ductor`)")[0].splitlines()
    assert line.startswith("pip install --find-links dist/ 'ductor==")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", line.replace("dist/", f"{installed.dist}/")],
        cwd=app,
        env=clean_env(PATH=f"{app / 'venv' / 'bin'}{os.pathsep}{clean_env()['PATH']}"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    listed = subprocess.run(
        [str(app / "venv" / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    names = {row.split("==")[0].lower() for row in listed.splitlines()}
    assert "ductor" in names
    assert not names & {"ductor-server", "ductor-core", "litestar"}, names
    first = section_blocks(SDK, "## Getting started", "python")[0]
    ran = subprocess.run(
        [str(app / "venv" / "bin" / "python"), "-c", first],
        cwd=app,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr


def test_ductor_migrate_from_the_wheels_migrates_postgres(
    installed: Installed, postgres_url: str
) -> None:
    done = subprocess.run(
        [str(installed.bin / "ductor"), "migrate"],
        cwd=installed.work,
        env=clean_env(DUCTOR_DATABASE_URL=postgres_url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    migrations = CHECKOUT / "packages/ductor-server/src/ductor_server/storage/migrations"
    count = len(list((migrations / "postgres").glob("*.sql")))
    applied = [line for line in done.stdout.splitlines() if line.startswith("applied ")]
    assert len(applied) == count, done.stdout
    assert done.stdout.splitlines() == applied, "one line per migration, nothing else"
