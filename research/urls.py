"""URL helpers: canonical forms for deduplication, hosts, and domain-list matching."""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from research.netguard import DEFAULT_PORTS, MalformedHostError, normalise_host


# Parameters that only say where a click came from; dropping them never changes the page.
TRACKING_PARAMETERS = frozenset({
    "gclid", "gclsrc", "dclid", "gbraid", "wbraid", "fbclid", "msclkid", "yclid", "twclid", "ttclid",
    "li_fat_id", "mc_cid", "mc_eid", "_ga", "_gl", "_hsenc", "_hsmi", "hsctatracking", "igshid",
    "oly_anon_id", "oly_enc_id", "vero_id", "vero_conv", "wickedid", "rb_clickid", "s_cid", "mkt_tok",
    "srsltid", "spm", "ref_src", "ref_url",
})
TRACKING_PREFIXES = ("utm_", "pk_", "mtm_")

_SCHEME_PATTERN = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_tracking_parameter(name: str) -> bool:
    """Whether a query parameter name is a known click-tracking parameter."""
    lowered = name.lower()
    return lowered in TRACKING_PARAMETERS or lowered.startswith(TRACKING_PREFIXES)


def _without_tracking_parameters(query: str) -> str:
    """Drop tracking parameters from a raw query string, leaving the others byte for byte."""
    if not query:
        return ""
    kept = [pair for pair in query.split("&") if pair and not is_tracking_parameter(unquote_plus(pair.split("=", 1)[0]))]
    return "&".join(kept)


def _netloc(scheme: str, userinfo: str, host: str, port: int | None) -> str:
    """Rebuild a network location from its parts, leaving out the scheme's default port."""
    shown_host = f"[{host}]" if ":" in host else host
    shown_port = "" if port is None or DEFAULT_PORTS.get(scheme) == port else f":{port}"
    return f"{userinfo}{shown_host}{shown_port}"


def canonicalize_url(url: str) -> str:
    """The canonical form of an http(s) URL: lower-case scheme and host, no default port, no fragment, no tracking parameters; other URLs come back stripped of whitespace only."""
    text = url.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return text
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return text
    host = parts.hostname.lower().rstrip(".")
    userinfo = parts.netloc.rpartition("@")[0] + "@" if "@" in parts.netloc else ""
    path = parts.path or "/"
    query = _without_tracking_parameters(parts.query)
    return urlunsplit((scheme, _netloc(scheme, userinfo, host, port), path, query, ""))


def comparable_host(hostname: str) -> str:
    """`hostname` as the fetcher connects to it (IDNA with UTS 46 mapping, so full-width and upper-case letters fold; no trailing dot); a malformed one only lower-cased."""
    text = hostname.strip().strip(".")
    if not text:
        return ""
    try:
        return normalise_host(text)
    except MalformedHostError:
        # The fetcher refuses such a host anyway; the filter still compares what it can.
        return text.lower()


def host_of(url: str) -> str:
    """The host name of a URL in the fetcher's canonical form (see `comparable_host`), or "" when it has none."""
    try:
        hostname = urlsplit(url.strip()).hostname
    except ValueError:
        return ""
    return comparable_host(hostname or "")


def normalize_domain(domain: str) -> str:
    """A domain-list entry as a bare canonical host: "https://*.Example.com/x" becomes "example.com"."""
    text = domain.strip()
    if _SCHEME_PATTERN.match(text):
        text = host_of(text)
    text = text.split("/", 1)[0]
    return comparable_host(text.removeprefix("*."))


def domain_matches(host: str, domains: Iterable[str]) -> bool:
    """Whether `host` is one of `domains` or a subdomain of one ("www.example.com" matches "example.com"), both in canonical form."""
    host = comparable_host(host)
    if not host:
        return False
    for entry in domains:
        domain = normalize_domain(entry)
        if domain and (host == domain or host.endswith("." + domain)):
            return True
    return False


def url_matches(url: str, domains: Iterable[str]) -> bool:
    """Whether the URL's host is one of `domains` or a subdomain of one."""
    return domain_matches(host_of(url), domains)
