"""Where webhooks may go: a public address, or a host the operator allow-listed.

A destination is checked when a job names it (``callback_url``) and again right before
each delivery, after DNS resolution; the delivery then connects to the address that was
checked (the host name still goes in ``Host`` and TLS SNI), so a name that resolves
differently the second time cannot reach an internal address."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

ADDRESS = ipaddress.IPv4Address | ipaddress.IPv6Address


class DestinationRefused(ValueError):
    """A webhook URL that must not be called; the message is safe to show the tenant."""


@dataclass(frozen=True)
class Destination:
    """A checked webhook target: the URL, its host, port, and the address to connect to."""

    url: str
    scheme: str
    host: str
    port: int
    address: str  # the checked IP address (as text)


def is_public(address: ADDRESS) -> bool:
    """False for loopback, private, link-local, multicast, reserved and unspecified
    addresses (and IPv4 ones mapped into IPv6)."""
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    return not (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
    )


def parse_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL without credentials; DestinationRefused
    otherwise. Parsed by httpx, the parser the delivery uses, so a URL accepted here is
    one the delivery can send to (a laxer parser let through control characters and host
    names that IDNA 2003 maps but httpx's IDNA 2008 refuses, which then failed at every
    delivery). The host is the ASCII (punycode) form that DNS, ``Host`` and SNI get."""
    try:
        parsed = httpx.URL(url)
        host = parsed.raw_host.decode("ascii").lower()
        port = parsed.port
    except (httpx.InvalidURL, ValueError):  # idna's errors are UnicodeErrors
        raise DestinationRefused(
            "callback_url is not a valid URL (control characters, spaces in the host or "
            "a host name IDNA 2008 refuses)"
        ) from None
    if parsed.scheme not in ("http", "https") or not host:
        raise DestinationRefused("callback_url must be an http:// or https:// URL with a host")
    if parsed.userinfo:
        raise DestinationRefused("callback_url must not carry credentials")
    if port is not None and not 0 < port < 65536:
        raise DestinationRefused("callback_url's port must be in 1-65535")
    return parsed.scheme, host, port or (443 if parsed.scheme == "https" else 80)


def resolve(
    url: str,
    *,
    allow_hosts: tuple[str, ...],
    lookup: Callable[..., list[Any]] = socket.getaddrinfo,
) -> Destination:
    """Check ``url`` and pick the address to deliver to: every address the host resolves
    to must be public unless the host (name or literal address) is in ``allow_hosts``."""
    scheme, host, port = parse_url(url)
    try:
        infos = lookup(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise DestinationRefused("callback_url's host does not resolve") from None
    addresses = []
    for info in infos:
        try:
            addresses.append(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
        except ValueError:
            continue
    if not addresses:
        raise DestinationRefused("callback_url's host does not resolve")
    allowed = host in allow_hosts
    if not allowed and not all(is_public(a) for a in addresses):
        raise DestinationRefused(
            "callback_url resolves to a loopback, private, link-local or multicast address; "
            "such destinations need the operator's allow-list (INFLIGHT_WEBHOOK_ALLOW_HOSTS)"
        )
    return Destination(
        url=str(httpx.URL(url)), scheme=scheme, host=host, port=port, address=str(addresses[0])
    )
