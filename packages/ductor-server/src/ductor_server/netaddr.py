"""IP networks as settings name them: parsed from "127.0.0.0/8, ::1" text, and a
listen address as a URL writes it. A leaf module (the standard library only),
shared by the settings, the outbound guard and the commands."""

from __future__ import annotations

import ipaddress

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """Parse "127.0.0.0/8, ::1, 10.1.2.3" into networks (a bare address is a /32 or /128).

    Raises:
        ValueError: an entry that is not an address or a network.
    """
    networks: list[IPNetwork] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not an IP address or network") from exc
    return tuple(networks)


def http_url(host: str, port: int | str) -> str:
    """The `http://` URL of `host` and `port`, an IPv6 address in brackets
    ("::1" is `http://[::1]:7070`: unbracketed, its colons read as the port's)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


__all__ = ["IPNetwork", "http_url", "parse_networks"]
