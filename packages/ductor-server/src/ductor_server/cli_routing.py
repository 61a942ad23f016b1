"""The `ductor routing` command group: `simulate` replays events offline.

This module does the file I/O and the progress bar; the routing itself is the
pure `ductor_routing` simulation, the same code the server runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import msgspec

PROGRESS_THRESHOLD = 2_000
"""Inputs with at least this many lines show a progress bar (with --progress auto)."""


class ProgressBar:
    """A one-line text progress bar redrawn in place on a stream."""

    def __init__(self, total: int, stream: IO[str], *, width: int = 30) -> None:
        self.total = max(total, 1)
        self.stream = stream
        self.width = width
        self._shown = -1

    def update(self, done: int) -> None:
        """Redraw when the percentage changed."""
        percent = min(100, done * 100 // self.total)
        if percent == self._shown:
            return
        self._shown = percent
        filled = self.width * percent // 100
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\rsimulating [{bar}] {percent:3d}% {done}/{self.total}")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line."""
        self.stream.write("\n")
        self.stream.flush()


def _cmd_simulate(args: argparse.Namespace) -> int:
    # Imported here, not at the top: CEL and the plugins cost every other `ductor`
    # command its start-up time.
    from ductor_core.errors import DuctorError
    from ductor_core.expressions import default_engine
    from ductor_routing import (
        ConfigError,
        Simulation,
        build_router,
        decode_config,
        decode_event,
        encode_decision,
        format_summary,
    )
    from ductor_server.extensions import install_cel_functions, installed_extensions
    from ductor_server.extensions.wiring import plugin_enrichers, plugin_strategies

    config_path = Path(args.config)
    events_path = Path(args.events)
    try:
        config = decode_config(config_path.read_bytes())
        # The installed plugins, loaded as the server loads them (bad ones are
        # reported and skipped); their CEL functions before the engine is built.
        extensions = installed_extensions()
        install_cel_functions()
        registry = plugin_strategies(extensions)
        enrichers = plugin_enrichers(extensions)
        router = build_router(
            config,
            engine=default_engine(),
            registry=registry,
            enricher_registry=enrichers,
            seed=args.seed,
        )
        with events_path.open("rb") as fh:
            total = sum(1 for line in fh if line.strip())
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DuctorError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if isinstance(exc, ConfigError) and isinstance(exc.details, list):
            for problem in exc.details:
                print(f"  {problem.pointer}: {problem.message}", file=sys.stderr)
        return 2

    to_stdout = args.out == "-"
    # A file is written beside its target and put in place only once every event
    # was read: an events file that fails half way leaves an earlier output (or
    # the events file itself, when --out names it) as it was, and no partial one.
    target = Path(args.out)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        out: IO[bytes] = sys.stdout.buffer if to_stdout else partial.open("wb")
    except OSError as exc:
        print(f"error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    show = args.progress == "always" or (args.progress == "auto" and total >= PROGRESS_THRESHOLD)
    bar = ProgressBar(total, sys.stderr) if show else None
    table_stream = sys.stderr if to_stdout else sys.stdout
    simulation = Simulation(router)
    done = 0
    finished = False
    try:
        with events_path.open("rb") as fh:
            for line_no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                decision = simulation.feed(decode_event(line, line_no=line_no))
                if decision is not None:
                    out.write(encode_decision(decision))
                    out.write(b"\n")
                done += 1
                if bar is not None:
                    bar.update(done)
        finished = True
    except (DuctorError, OSError) as exc:
        if bar is not None:
            bar.close()
        message = exc.message if isinstance(exc, DuctorError) else str(exc)
        print(f"error: {message}", file=sys.stderr)
        return 2
    finally:
        if to_stdout:
            out.flush()
        else:
            out.close()
            if finished:
                os.replace(partial, target)
            else:
                partial.unlink(missing_ok=True)
    if bar is not None:
        bar.close()
    summary = simulation.summary()
    if args.summary_json is not None:
        try:
            Path(args.summary_json).write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
        except OSError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    table_stream.write(format_summary(summary))
    if not to_stdout:
        table_stream.write(f"decisions written to {args.out}\n")
    return 0


def _cmd_routing_help(args: argparse.Namespace) -> int:
    args.routing_parser.print_help()
    return 2


def register(subparsers: Any) -> None:
    """Add the `routing` command group (with `simulate`) to the `ductor` subcommands."""
    routing = subparsers.add_parser("routing", help="routing tools (offline simulation)")
    routing.set_defaults(func=_cmd_routing_help, routing_parser=routing)
    commands = routing.add_subparsers(dest="routing_command", metavar="COMMAND")
    simulate = commands.add_parser(
        "simulate",
        help="replay a JSONL stream of events through the routing pipeline, state in memory",
        description=(
            "Route every event of EVENTS (JSON lines) with the configuration in --config, "
            "print a summary table and write the decisions as JSON lines."
        ),
    )
    simulate.add_argument("events", help="events file, one JSON object per line")
    simulate.add_argument("--config", required=True, help="routing configuration (JSON)")
    simulate.add_argument(
        "--out", default="decisions.jsonl", help="decisions output file; '-' for stdout"
    )
    simulate.add_argument("--seed", type=int, default=None, help="override the config's seed")
    simulate.add_argument(
        "--summary-json", default=None, help="also write the summary as JSON to this file"
    )
    simulate.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help=f"progress bar on stderr (auto: inputs of {PROGRESS_THRESHOLD}+ lines)",
    )
    simulate.set_defaults(func=_cmd_simulate)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `ductor routing ...` on its own (argv without the leading "routing")."""
    parser = argparse.ArgumentParser(prog="ductor")
    register(parser.add_subparsers(dest="command", metavar="COMMAND"))
    args = parser.parse_args(["routing", *(argv if argv is not None else sys.argv[1:])])
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
