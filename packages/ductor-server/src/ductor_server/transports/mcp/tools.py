"""The MCP server's tools: the one tool table of `services.tools`, which the chat
agent serves too (named here for the MCP transport and its readers)."""

from __future__ import annotations

from ductor_server.services.tools import (
    TOOLS,
    TOOLS_BY_NAME,
    NoArgs,
    ToolError,
    ToolSpec,
    TriggerRunArgs,
    decode_arguments,
    input_schema,
)

__all__ = [
    "TOOLS",
    "TOOLS_BY_NAME",
    "NoArgs",
    "ToolError",
    "ToolSpec",
    "TriggerRunArgs",
    "decode_arguments",
    "input_schema",
]
