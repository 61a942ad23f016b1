"""IP networks as settings name them: parsed from "127.0.0.0/8, ::1" text. A leaf
module (the standard library only), shared by the settings and the outbound guard."""

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


__all__ = ["IPNetwork", "parse_networks"]
