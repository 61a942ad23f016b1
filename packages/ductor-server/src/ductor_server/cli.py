"""The `ductor` command line: start the service and drive it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ductor_server import __version__
from ductor_server.settings import Settings


def _cmd_dev(args: argparse.Namespace) -> int:
    import uvicorn

    from ductor_server.app import create_app

    settings = Settings.from_env(host=args.host, port=args.port, data_dir=Path(args.data_dir))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    print(f"ductor {__version__} (embedded) on http://{settings.host}:{settings.port}", flush=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every `ductor` subcommand."""
    parser = argparse.ArgumentParser(
        prog="ductor", description="Ductor: the clearing layer for units of work."
    )
    parser.add_argument("--version", action="version", version=f"ductor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    dev = sub.add_parser("dev", help="run on the embedded default (SQLite, in-process queue)")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=7070)
    dev.add_argument("--data-dir", default=".ductor")
    dev.set_defaults(func=_cmd_dev)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `ductor` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
