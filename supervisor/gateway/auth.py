"""Who may use the gateway (``design/gateway.md``, "Security"): the token, the ``Origin`` and
``Host`` a request names, and the page's cookie.

Everything here runs on a request's head before its token is checked, on the one thread every
session shares: no Python loop over the head, only searches in C (the query for ``token=``,
the cookies for the page's), and the token compared in constant time.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Final
from urllib.parse import quote, unquote_plus

__all__ = ["WILDCARDS", "Auth", "host_names", "is_loopback", "strip_port", "url_host"]

#: Addresses that bind every interface: the URL names loopback (or the first allowed host).
WILDCARDS: Final = ("", "0.0.0.0", "::")
#: ``NAME:PORT`` or ``[V6]:PORT``: a host value that carries its port.
_PORT: Final = re.compile(r"(?<=[^:]):\d+$|(?<=\]):\d+$")


class Auth:
    """The checks of one gateway, once it knows its port: ``token`` (``Authorization: Bearer
    T`` or ``?token=T``), the ``Host`` values it answers to (``hosts``: :func:`host_names`) and
    the origins of its own pages (``scheme://HOST``)."""

    def __init__(self, token: str, *, port: int, hosts: Iterable[str], scheme: str) -> None:
        self.token = token
        self.hosts = frozenset(hosts)
        self.origins = frozenset(f"{scheme}://{name}" for name in self.hosts)
        # The cookie that lets a browser reload the page and load its files (it opens no API)
        # once the page has dropped the token from its URL: a key derived from the token, not
        # the token; named per port (cookies are per host, not per port).
        self.cookie_name = f"agent-supervisor-page-{port}"
        self.cookie_key = hmac.new(token.encode(), b"agent-supervisor page", "sha256").hexdigest()
        self._cookie = re.compile(rf"(?:^|[;\s]){re.escape(self.cookie_name)}=([^;\s]*)")
        #: What a head that may pass the token check holds somewhere: the token as it is, or
        #: as ``quote`` writes it in a URL (as ``serve`` prints it), or the page's cookie key.
        #: (A client that percent-encodes characters a URL needs not encode sends the token in
        #: its ``Authorization`` header instead.)
        self.credentials: tuple[bytes, ...] = (
            token.encode(),
            quote(token, safe="").encode(),
            self.cookie_key.encode(),
        )

    def check(
        self, headers: Mapping[str, str], query: str, repeated: Collection[str] = ()
    ) -> str | None:
        """None when a request with these headers (``repeated``: the names that came more than
        once) and query may be served; else what it is refused as: ``forbidden`` (another
        origin, or another host) or ``unauthorized``."""
        if "origin" in repeated:
            # A browser sends one Origin. Of two, which one a proxy or a framework takes is
            # anyone's guess: none is, rather than the one a check happened to look at.
            return "forbidden"
        if not self._origin_ok(headers):
            return "forbidden"
        if not self._token_ok(headers, query):
            return "unauthorized"
        return None

    def page_cookie_ok(self, headers: Mapping[str, str]) -> bool:
        """The page's cookie among the head's: one search in C, the others never split (this
        runs before the token is checked)."""
        found = self._cookie.search(headers.get("cookie", ""))
        key = self.cookie_key.encode()
        return found is not None and hmac.compare_digest(found.group(1).encode(), key)

    def _token_ok(self, headers: Mapping[str, str], query: str) -> bool:
        provided = None
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            provided = auth[7:].strip()
        else:
            provided = _query_token(query, longest=max(1024, 3 * len(self.token)))
        if provided is None:
            return False
        return hmac.compare_digest(provided.encode(), self.token.encode())

    def _origin_ok(self, headers: Mapping[str, str]) -> bool:
        """Same-origin only for browsers; DNS-rebinding guard on Host for everyone."""
        host = headers.get("host")
        if host is not None and host.lower() not in self.hosts:
            return False
        origin = headers.get("origin")
        if origin is None:
            return True  # not a browser (or a same-origin GET): the token decides
        return origin.lower() in self.origins


def host_names(host: str, port: int, allow_hosts: Iterable[str], *, tls: bool) -> set[str]:
    """The ``Host`` values a gateway bound to ``host:port`` answers to: ``NAME:PORT`` for its
    own names and the allowed ones, and the bare name too on the scheme's default port
    (browsers leave it out)."""
    default_port = 443 if tls else 80
    names = {host, "127.0.0.1", "localhost", "[::1]", url_host(host)}
    allowed: set[str] = set()
    for name in (*names, *allow_hosts):
        name = name.lower()
        if _PORT.search(name):
            allowed.add(name)
            continue
        allowed.add(f"{name}:{port}")
        if port == default_port:
            allowed.add(name)
    return allowed


def _query_token(query: str, *, longest: int) -> str | None:
    """The first ``token=`` value of a query, decoded as ``parse_qs`` would; nothing else of the
    query is looked at before the token is checked: two searches in C, and a value longer than
    ``longest`` is no token and never decoded."""
    if query.startswith("token="):
        at = 6
    else:
        at = query.find("&token=")
        if at < 0:
            return None
        at += 7
    end = query.find("&", at)
    value = query[at:] if end < 0 else query[at:end]
    if not value or len(value) > longest:
        return None
    return unquote_plus(value)


def url_host(host: str) -> str:
    """``host`` as a URL names it (an IPv6 address in brackets, a wildcard as loopback)."""
    if host == "::":
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    if host in WILDCARDS:
        return "127.0.0.1"
    return host


def strip_port(name: str) -> str:
    """A ``Host`` value without its port (``NAME:PORT``, ``[V6]:PORT``)."""
    return _PORT.sub("", name)


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1", "[::1]") or host.startswith("127.")
