"""Fetching an image from an http(s) URL (only with --allow-remote-images) without reaching into the server's network.

Every hop's host name is resolved here and every address it resolves to is checked before any
connection: loopback, private, link-local (cloud metadata endpoints), multicast, reserved and
unspecified addresses are refused (`--allow-private-image-hosts` permits loopback and private
ones, never link-local). The connection then goes to the checked address (the name is kept for
the Host header and TLS), so a second, different DNS answer cannot redirect it. Redirects are
followed by hand, at most MAX_REDIRECTS, each one checked the same way. The whole fetch, redirects
included, has one deadline (`remote_timeout_s`) and one size cap (`max_image_bytes`).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from urllib.parse import urljoin, urlsplit

from vlchat.app.errors import ForbiddenMediaError, MediaError
from vlchat.app.settings import MediaLimits

MAX_REDIRECTS = 3
REDIRECTS = (301, 302, 303, 307, 308)


def refused_reason(address: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_private: bool) -> str | None:
    """Why the server may not connect to `address` (None: it may)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_link_local:
        return "a link-local address"
    if address.is_loopback:  # before "reserved": ::1 lies in a reserved IPv6 block
        return None if allow_private else "a loopback or private address"
    if address.is_multicast or address.is_unspecified or address.is_reserved:
        return "a multicast, unspecified or reserved address"
    if (address.is_private or not address.is_global) and not allow_private:
        return "a loopback or private address"
    return None


def checked_address(host: str, port: int, allow_private: bool) -> str:
    """An address of `host` to connect to, after checking every address it resolves to."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise MediaError(f"could not resolve the image host {host!r}") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    for address in addresses:
        reason = refused_reason(address, allow_private)
        if reason:
            raise ForbiddenMediaError(
                f"the image host {host!r} resolves to {reason} ({address}); the server fetches images from public "
                "addresses only (--allow-private-image-hosts permits private ones)"
            )
    return str(addresses[0])


def fetch_remote(url: str, limits: MediaLimits) -> bytes:
    if not limits.allow_remote:
        raise ForbiddenMediaError(
            "remote image URLs are disabled on this server; send the image as a data: URL "
            "(or start the server with --allow-remote-images)"
        )
    import httpx

    deadline = time.monotonic() + limits.remote_timeout_s
    try:
        with httpx.Client(follow_redirects=False, trust_env=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                with _open(client, url, limits, deadline) as response:
                    if response.status_code in REDIRECTS and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    if response.status_code != 200:
                        raise MediaError(f"fetching the image returned HTTP {response.status_code}")
                    return _read_body(response, limits, deadline)
    except httpx.HTTPError as exc:
        raise MediaError(f"could not fetch the image: {type(exc).__name__}") from None
    raise MediaError(f"fetching the image was redirected more than {MAX_REDIRECTS} times")


def _open(client, url: str, limits: MediaLimits, deadline: float):
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MediaError(f"image URLs must be http(s) URLs with a host, got {url[:200]!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = checked_address(parts.hostname, port, limits.allow_private_remote)
    netloc = f"[{address}]" if ":" in address else address
    pinned = parts._replace(netloc=f"{netloc}:{port}").geturl()
    host_header = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    remaining = max(0.01, deadline - time.monotonic())
    extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    return client.stream("GET", pinned, headers={"Host": host_header}, timeout=remaining, extensions=extensions)


def _read_body(response, limits: MediaLimits, deadline: float) -> bytes:
    length = response.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limits.max_image_bytes:
        raise MediaError(f"the image is larger than the {limits.max_image_bytes} byte limit")
    chunks, total = [], 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > limits.max_image_bytes:
            raise MediaError(f"the image is larger than the {limits.max_image_bytes} byte limit")
        if time.monotonic() > deadline:
            raise MediaError(f"fetching the image took longer than {limits.remote_timeout_s:g} s")
        chunks.append(chunk)
    return b"".join(chunks)
