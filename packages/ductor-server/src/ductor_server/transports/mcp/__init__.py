"""The MCP transport: an MCP server (streamable HTTP, at `/mcp`) whose tools and
resources call the same services as REST, for the tenant of the API key.
`ductor_server.app` mounts it; see docs/mcp.md."""

from __future__ import annotations

from ductor_server.transports.mcp.endpoint import MCP_PATH, McpEndpoint
from ductor_server.transports.mcp.tools import TOOLS, ToolSpec, input_schema

# `mcp` itself is imported by `transports.mcp.server`, which `McpEndpoint` loads
# in the background: importing this package does not import it.
__all__ = ["MCP_PATH", "TOOLS", "McpEndpoint", "ToolSpec", "input_schema"]
