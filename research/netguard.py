"""Network guard for the fetcher: host normalisation, address and port classification, the private-host allow list,
origins and resolvers."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import idna
from pydantic import BaseModel, ConfigDict

from research.errors import DeepthreadError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SHARED_ADDRESS_SPACE = ipaddress.IPv4Network("100.64.0.0/10")
NAT64_WELL_KNOWN_PREFIX = ipaddress.IPv6Network("64:ff9b::/96")
DEFAULT_PORTS = {"http": 80, "https": 443}
# Web pages live on these; a public host's other ports (SMTP 25, Redis 6379, ...) are services, not pages.
WEB_PORTS = frozenset({80, 443})

_DECIMAL_PART = re.compile(r"[0-9]+")
_HEX_PART = re.compile(r"0[xX][0-9a-fA-F]*")
_ASCII_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")


class ResolutionError(DeepthreadError):
    """A host name could not be resolved to any address."""


class MalformedHostError(ValueError, DeepthreadError):
    """A URL host that no browser or libc would resolve the same way twice."""


@runtime_checkable
class Resolver(Protocol):
    """Turns a host name into the IP address strings it resolves to."""

    async def resolve(self, host: str) -> list[str]:
        """Return the addresses of `host`; raises ResolutionError when the name does not resolve."""
        ...


class SystemResolver:
    """Resolves names through the operating system (`getaddrinfo`), off the event loop."""

    async def resolve(self, host: str) -> list[str]:
        """Return the unique addresses of `host` in the order the system gives; raises ResolutionError."""
        loop = asyncio.get_running_loop()
        try:
            answers = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as error:
            raise ResolutionError(f"could not resolve {host}: {error}") from error
        addresses: list[str] = []
        for _family, _type, _proto, _canonname, sockaddr in answers:
            address = str(sockaddr[0])
            if address not in addresses:
                addresses.append(address)
        if not addresses:
            raise ResolutionError(f"could not resolve {host}: no addresses")
        return addresses


class OverrideResolver:
    """Fixed answers for some names (like curl's --resolve), the wrapped resolver for the rest."""

    def __init__(self, overrides: dict[str, list[str]], fallback: Resolver) -> None:
        self.overrides = {name.lower().rstrip("."): list(addresses) for name, addresses in overrides.items()}
        self.fallback = fallback

    async def resolve(self, host: str) -> list[str]:
        """The fixed addresses of `host` if listed, else the fallback's answer; raises ResolutionError."""
        fixed = self.overrides.get(host.lower().rstrip("."))
        if fixed:
            return list(fixed)
        return await self.fallback.resolve(host)


def parse_resolve_overrides(text: str | list[str]) -> dict[str, list[str]]:
    """`host=ip` pairs (comma separated; repeat a host for several addresses); raises ValueError when malformed."""
    items = text if isinstance(text, list) else [item for item in text.split(",")]
    overrides: dict[str, list[str]] = {}
    for item in (entry.strip() for entry in items):
        if not item:
            continue
        host, separator, address = item.partition("=")
        if not separator or not host.strip():
            raise ValueError(f"expected host=address, got {item!r}")
        ipaddress.ip_address(address.strip())
        overrides.setdefault(host.strip().lower(), []).append(address.strip())
    return overrides


def _looks_numeric(label: str) -> bool:
    return bool(_DECIMAL_PART.fullmatch(label) or _HEX_PART.fullmatch(label))


def _parse_ipv4_number(part: str) -> int:
    if _HEX_PART.fullmatch(part):
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        if not set(part) <= set("01234567"):
            raise MalformedHostError(f"malformed octal part {part!r} in host")
        return int(part, 8)
    if not _DECIMAL_PART.fullmatch(part):
        raise MalformedHostError(f"malformed numeric part {part!r} in host")
    return int(part)


def parse_numeric_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """Read `host` the way browsers and inet_aton do (`127.1`, `0x7f000001`, `0177.0.0.1`, `2130706433`); None if it is a name; raises MalformedHostError."""
    parts = host.split(".")
    if parts and parts[-1] == "" and len(parts) > 1:
        parts = parts[:-1]
    if not _looks_numeric(parts[-1]):
        return None
    if len(parts) > 4:
        raise MalformedHostError(f"host {host!r} has too many numeric parts")
    numbers = [_parse_ipv4_number(part) for part in parts]
    *leading, last = numbers
    if any(number > 255 for number in leading) or last >= 256 ** (5 - len(numbers)):
        raise MalformedHostError(f"numeric host {host!r} is out of range")
    value = last
    for index, number in enumerate(leading):
        value += number * 256 ** (3 - index)
    return ipaddress.IPv4Address(value)


def normalise_host(hostname: str) -> str:
    """Return the canonical ASCII form of a URL host: an IP in standard notation or a lower-case IDNA name; raises MalformedHostError."""
    host = hostname.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise MalformedHostError("empty host")
    if ":" in host:
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError as error:
            raise MalformedHostError(f"malformed IPv6 host {hostname!r}") from error
    numeric = parse_numeric_ipv4(host)
    if numeric is not None:
        return str(numeric)
    if host.isascii():
        # Plain ASCII names skip IDNA, whose rules refuse real-world names such as `my_host.example.com`.
        if not _ASCII_NAME.fullmatch(host):
            raise MalformedHostError(f"malformed host name {hostname!r}")
        return host.rstrip(".")
    try:
        return idna.encode(host, uts46=True).decode("ascii").rstrip(".")
    except idna.IDNAError as error:
        raise MalformedHostError(f"malformed host name {hostname!r}") from error


def ip_literal(host: str) -> IPAddress | None:
    """Return the address if a normalised host is an IP literal, else None."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_localhost_name(host: str) -> bool:
    """Say whether a host name is `localhost` or under `.localhost`, which always mean this machine (RFC 6761)."""
    return host == "localhost" or host.endswith(".localhost")


def _ipv4_kind(address: ipaddress.IPv4Address) -> str | None:
    if address.is_unspecified or address in ipaddress.IPv4Network("0.0.0.0/8"):
        return "unspecified address"
    if address.is_loopback:
        return "loopback address"
    if address.is_link_local:
        return "link-local address"
    if address in SHARED_ADDRESS_SPACE:
        return "shared (CGNAT) address"
    if address.is_multicast:
        return "multicast address"
    if address.is_reserved:
        return "reserved address"
    if address.is_private:
        return "private address"
    if not address.is_global:
        return "non-public address"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    if address.ipv4_mapped is not None:
        return "IPv4-mapped", address.ipv4_mapped
    if address.sixtofour is not None:
        return "6to4", address.sixtofour
    if address in NAT64_WELL_KNOWN_PREFIX:
        return "NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    packed = address.packed
    if packed[:12] == bytes(12) and int(address) > 1:
        return "IPv4-compatible", ipaddress.IPv4Address(packed[12:])
    return None


def _ipv6_kind(address: ipaddress.IPv6Address) -> str | None:
    if address.is_unspecified:
        return "unspecified address"
    if address.is_loopback:
        return "loopback address"
    if address.is_link_local:
        return "link-local address"
    if address.is_site_local:
        return "site-local address"
    if address.is_multicast:
        return "multicast address"
    if address.is_private:
        return "private address"
    if address.is_reserved:
        return "reserved address"
    if not address.is_global:
        return "non-public address"
    return None


def _ipv6_reason(address: ipaddress.IPv6Address) -> str | None:
    embedded = _embedded_ipv4(address)
    if embedded is None:
        kind = _ipv6_kind(address)
        return None if kind is None else f"{kind} {address}"
    form, inner = embedded
    inner_kind = _ipv4_kind(inner)
    if inner_kind is not None:
        return f"{inner_kind} {inner} ({form} form {address})"
    if form in ("NAT64", "6to4"):
        return None
    # Mapped and compatible forms of a public IPv4 address have no business in a URL or a DNS answer.
    return f"{form} IPv6 address {address}"


def forbidden_reason(address: IPAddress) -> str | None:
    """Return why the fetcher must not connect to `address` (e.g. "private address 10.0.0.1"), or None if it is public."""
    if isinstance(address, ipaddress.IPv6Address):
        return _ipv6_reason(address)
    kind = _ipv4_kind(address)
    return None if kind is None else f"{kind} {address}"


def forbidden_port_reason(port: int) -> str | None:
    """Return why the fetcher must not connect to `port` of a public host (e.g. "port 6379 not allowed"), or None."""
    return None if port in WEB_PORTS else f"port {port} not allowed (only 80 and 443)"


def url_origin(url: str) -> tuple[str, str, int] | None:
    """The scheme, normalised host and port of an http(s) URL, or None when it has no such origin."""
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS or not parts.hostname:
            return None
        return scheme, normalise_host(parts.hostname), parts.port or DEFAULT_PORTS[scheme]
    except ValueError:  # a malformed host (MalformedHostError) or port
        return None


def same_origin(checked_url: str, other_url: str) -> bool:
    """Whether `other_url` is on `checked_url`'s origin; an upgrade from http to https of the same host counts as it."""
    checked, other = url_origin(checked_url), url_origin(other_url)
    if checked is None or other is None:
        return False
    return checked == other or (checked == ("http", other[1], 80) and other == ("https", checked[1], 443))


class AllowList(BaseModel):
    """Hosts (exact, case-insensitive) and networks that may be fetched although private (`FETCH_ALLOW_PRIVATE_HOSTS`)."""

    model_config = ConfigDict(frozen=True)

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    def allows(self, host: str, address: IPAddress) -> bool:
        """Say whether `host`, resolved to `address`, is exempt from the private-address refusal."""
        if host.lower().rstrip(".") in self.hosts:
            return True
        return any(address.version == network.version and address in network for network in self.networks)


def parse_allow_list(text: str) -> AllowList:
    """Parse a comma- or space-separated list of host names, addresses and CIDRs; raises ValueError on a malformed entry."""
    hosts: set[str] = set()
    networks: list[IPNetwork] = []
    for entry in re.split(r"[,\s]+", text.strip()):
        if not entry:
            continue
        if "/" in entry or ip_literal(entry.strip("[]")) is not None:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        else:
            hosts.add(normalise_host(entry))
    return AllowList(hosts=frozenset(hosts), networks=tuple(networks))
