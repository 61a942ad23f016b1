"""`ductor apply DIR`: make a tenant's workflows, workers, pools, rule set and
connections what the manifest files say, over the REST API with the API key.

The reading, validating and diffing are `ductor_server.manifests`, shared with
`ductor serve --seed`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TextIO

from ductor_server.cli_client import (
    API_KEY_SOURCES,
    ClientError,
    checked_key,
    find_api_key,
    server_url,
    usage_error,
)


def _write(stream: TextIO, lines: list[str]) -> None:
    for line in lines:
        stream.write(line + "\n")


def cmd_apply(args: argparse.Namespace) -> int:
    """Plan the manifests under `args.source` against the server; apply unless
    `--dry-run`. Exit 0 when done, 1 on any problem (then nothing is applied)."""
    # Imported here: the manifests reach the services and the engine, which every
    # other `ductor` command would otherwise pay for at start-up.
    from ductor_server.manifests import apply_plan, make_plan, read_manifests
    from ductor_server.manifests import where as _where
    from ductor_server.manifests.report import (
        change_lines,
        failure,
        partial,
        problem_lines,
        summary,
    )
    from ductor_server.manifests.rest import RestTarget

    key = find_api_key(args.api_key, args.data_dir)
    if key is None:
        sys.stderr.write(
            "error: no API key: pass --api-key, set DUCTOR_API_KEY, or start `ductor dev` "
            "(it writes .ductor/api_key)\n"
        )
        return 1
    try:
        key = checked_key(key, API_KEY_SOURCES)
        url = server_url(args.url)
    except ClientError as exc:
        return usage_error(exc)
    resources, problems = read_manifests(Path(args.source))
    if not resources:
        _write(sys.stderr, [*problem_lines(problems), failure(problems)])
        return 1

    async def run() -> int:
        target = RestTarget(url, key)
        try:
            # The files that read well are checked by the server even when others did
            # not, so one run lists every problem.
            plan = await make_plan(target, resources)
            found = sorted([*problems, *plan.problems], key=_where)
            if found:
                _write(sys.stderr, [*problem_lines(found), failure(found)])
                return 1
            if args.dry_run:
                _write(
                    sys.stdout, [*change_lines(plan, applied=False), summary(plan, dry_run=True)]
                )
                return 0
            done, error = await apply_plan(target, plan)
            if error is not None:
                _write(sys.stderr, partial(done, f"{error.code}: {error.message}"))
                return 1
            _write(sys.stdout, [*change_lines(plan, applied=True), summary(plan, dry_run=False)])
            return 0
        finally:
            await target.aclose()

    return asyncio.run(run())


def add_apply_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `apply` on the top-level parser."""
    parser = sub.add_parser(
        "apply",
        help="create or update workflows, workers, pools, rules and connections from files",
        description="Read the manifests in SOURCE (a YAML or JSON file, or a directory of "
        "*.yaml, *.yml and *.json files, read recursively), check every resource with the "
        "server's validators and compare it with what the server has, then create or "
        "update what differs: connections, workers, pools, the rule set, workflows, in "
        "that order. Any problem is listed (file:line:column: pointer: message) and "
        "nothing is applied; exit status 1. See docs/configuration.md.",
    )
    parser.add_argument("source", help="a manifest file or a directory of them")
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would change; change nothing"
    )
    parser.add_argument("--url", default=None, help="server URL (default $DUCTOR_URL or :7070)")
    parser.add_argument("--api-key", default=None, help="API key (default $DUCTOR_API_KEY)")
    parser.add_argument("--data-dir", default=None, help="where to find api_key (default .ductor)")
    parser.set_defaults(func=cmd_apply)


__all__ = ["add_apply_command"]
