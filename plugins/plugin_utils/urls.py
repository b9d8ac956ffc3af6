"""URLs as they may be recorded (a node's marker, a message, a run's events), for the filters that record them."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def url_without_credentials(text: str) -> str:
    """The URL without the user and password before the host, and without the query and fragment, where presigned
    URLs carry their signature; anything that is not a URL with a scheme (a path) as it is."""
    parts = urlsplit(str(text))
    if not parts.scheme or not parts.netloc:
        return str(text)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
