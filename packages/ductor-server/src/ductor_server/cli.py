"""The `ductor` command line: start the service (`cli_server`) and drive it (`cli_client`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ductor_server import __version__
from ductor_server.cli_apply import add_apply_command
from ductor_server.cli_chat import add_chat_command
from ductor_server.cli_client import add_client_commands
from ductor_server.cli_connections import add_connections_commands
from ductor_server.cli_extensions import add_extensions_commands
from ductor_server.cli_keys import add_keys_commands
from ductor_server.cli_routing import register as add_routing_commands
from ductor_server.cli_server import add_server_commands
from ductor_server.cli_settlement import add_settlement_commands


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every `ductor` subcommand."""
    parser = argparse.ArgumentParser(
        prog="ductor", description="Ductor: the clearing layer for units of work."
    )
    parser.add_argument("--version", action="version", version=f"ductor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_server_commands(sub)
    add_client_commands(sub)
    add_keys_commands(sub)
    add_routing_commands(sub)
    add_settlement_commands(sub)
    add_extensions_commands(sub)
    add_connections_commands(sub)
    add_apply_command(sub)
    add_chat_command(sub)
    _mark_leaves(parser)
    return parser


def _mark_leaves(parser: argparse.ArgumentParser) -> None:
    """Let each command without sub-commands name itself, so a usage error found
    after parsing shows that command's usage instead of the top level's."""
    children = [
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    ]
    if not children:
        parser.set_defaults(usage_parser=parser)
    for action in children:
        for child in set(action.choices.values()):
            _mark_leaves(child)


def parse_command(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """Parse a command line, with options allowed between a command's positionals.

    argparse gives an optional positional (`DATA` of `events send NAME [DATA]`)
    only the words right after the ones before it, so `events send NAME --api-key
    K DATA` would leave `DATA` over; such leftovers fill the command's unfilled
    optional positionals in order. Anything still left is a usage error shown
    with that command's usage.
    """
    args, extra = parser.parse_known_args(argv)
    leaf: argparse.ArgumentParser = getattr(args, "usage_parser", parser)
    for action in leaf._actions:
        if not extra or extra[0].startswith("-"):
            break
        if action.option_strings or action.nargs != "?":
            continue
        if getattr(args, action.dest, None) == action.default:
            word = extra.pop(0)
            setattr(args, action.dest, action.type(word) if callable(action.type) else word)
    if extra:
        # e.g. `ductor events send NAME DATA extra`: say so with that command's usage.
        leaf.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


BROKEN_PIPE = 141
"""The exit status when the reader of stdout went away (`ductor ... | head -1`):
128 + SIGPIPE, what a shell shows for a tool that signal ended."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `ductor` console script."""
    try:
        try:
            return _run(argv)
        finally:
            # What is still in stdout's buffer is written here, where a closed
            # pipe is caught, not by the interpreter's last flush, which can only
            # print "Exception ignored" about it.
            if sys.stdout is not None:
                sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        return BROKEN_PIPE


def _discard_stdout() -> None:
    """Point stdout's file descriptor at /dev/null, so that the interpreter's last
    flush of what the failed write left buffered finds no closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parse_command(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result: int = args.func(args)
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except OSError as exc:
        # A file of the data dir (the pid file, a key file) another user owns, or
        # that is no file (a directory in its place).
        if exc.filename is None and not isinstance(exc, PermissionError):
            raise
        where = f" {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"error: cannot use{where}: {exc.strerror or exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
