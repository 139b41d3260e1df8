"""Notification URLs, pure (no threads, no network): which URL may be a target, and the URL as
shown anywhere (``mask_url``: a webhook's path and query carry its secret). The inventory, the
plan, the console and the notifier all use these, so that none of the first three imports the
notifier's threads; the notifier (cluster/notify/notifier.py) delivers."""
from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

MASK = "****"


def _token_like(segment: str) -> bool:
    return len(segment) >= 16 or (len(segment) >= 8 and any(ch.isdigit() for ch in segment))


def mask_url(url: str) -> str:
    """``url`` with what may be a secret replaced by ``****`` (the rule in the module docstring).

    >>> mask_url("https://bot:pw@hooks.example.com/services/T0123ABCD/B0456EFGH/abcdefghijklmnopqrstuvwx?x=1")
    'https://****@hooks.example.com/services/****/****/****?x=****'
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return MASK            # not even a URL: show nothing of it
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = (f"{MASK}@" if "@" in parts.netloc else "") + host + (f":{port}" if port is not None else "")
    path = "/".join(MASK if _token_like(segment) else segment for segment in parts.path.split("/"))
    query = "&".join(item.split("=", 1)[0] + f"={MASK}" if item else item for item in parts.query.split("&")) \
        if parts.query else ""
    return urlunsplit((parts.scheme, netloc, path, query, MASK if parts.fragment else ""))


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a notification target (None when it can): http or https, a host."""
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"{mask_url(url)} is not an http:// or https:// URL"
    if not parts.hostname:
        return f"{mask_url(url)} names no host"
    return None
