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


def host_name_problem(host: str) -> str | None:
    """Why `host` can name no host, or None: a name (not an IP address, which may be
    in brackets) with an empty label, a label over 63 characters or more than 253
    characters in all (a final dot aside)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        return None
    name = bare.removesuffix(".")
    if len(name) > 253 or any(not 1 <= len(label) <= 63 for label in name.split(".")):
        return (
            "the host name must be dot-separated labels of 1 to 63 characters, at most 253 in all"
        )
    return None


def http_url(host: str, port: int | str) -> str:
    """The `http://` URL of `host` and `port`, an IPv6 address in brackets
    ("::1" is `http://[::1]:7070`: unbracketed, its colons read as the port's)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


__all__ = ["IPNetwork", "host_name_problem", "http_url", "parse_networks"]
