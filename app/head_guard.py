"""Checks of a request's head before anything reads it: its Host (DNS rebinding) and its framing.

Framing (RFC 9112 section 6.3): a request with both Transfer-Encoding and Content-Length, or with
more than one Content-Length, may be read differently by a proxy in front and by this server
(request smuggling); it is refused with 400 and the connection closed.

Host: refuse requests whose Host header names a host this server was not started for.

A web page on another origin can point a name it controls at 127.0.0.1 and then drive a loopback
server from the visitor's browser; its requests carry that name in Host. Allowed: 127.0.0.1,
::1, localhost, the --host value, and the --allowed-hosts names ("*" allows any). When the
server binds every interface (0.0.0.0 or ::), any IP address is allowed too: a page whose origin
is an IP address is that address, there is no name to rebind. "*.example.org" allows the names
under example.org; --share adds "*.gradio.live", the names Gradio's share links use.
"""

from __future__ import annotations

import ipaddress
import json

LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")
ALL_INTERFACES = ("0.0.0.0", "::", "")


def host_name(header: str) -> str:
    """The name in a Host header value, without port and brackets, lower case ('' when unreadable)."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[1:end] if end > 0 else ""
    name, _, port = header.rpartition(":") if header.count(":") == 1 else (header, "", "")
    if port and not port.isdigit():
        return ""
    return name.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HeadGuard:
    def __init__(self, app, host: str, allowed_hosts: tuple[str, ...] = ()) -> None:
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.any_ip = host in ALL_INTERFACES
        names = {n.lower().rstrip(".") for n in (*LOCAL_NAMES, host, *allowed_hosts) if n}
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))  # "*.example.org" -> ".example.org"
        self.names = {n for n in names if not n.startswith("*")}

    def allows(self, name: str) -> bool:
        if not name:
            return False
        return (self.any_host or name in self.names or (self.any_ip and _is_ip(name))
                or any(name.endswith(suffix) for suffix in self.suffixes))  # fmt: skip

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or []
        hosts = [v.decode("latin-1") for k, v in headers if k == b"host"]
        if not (len(hosts) == 1 and self.allows(host_name(hosts[0]))):
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            shown = hosts[0][:100] if hosts else "(none)"
            message = (f"this server does not answer to the host name {shown!r}; start it with --allowed-hosts "
                       "NAME to allow it")  # fmt: skip
            return await _refuse(send, message, "host_not_allowed")
        lengths = sum(k == b"content-length" for k, _ in headers)
        if lengths > 1 or (lengths and any(k == b"transfer-encoding" for k, _ in headers)):
            message = ("a request may carry Content-Length or Transfer-Encoding, not both, and one Content-Length "
                       "at most (RFC 9112 section 6.3)")  # fmt: skip
            return await _refuse(send, message, "ambiguous_framing")
        return await self.app(scope, receive, send)


async def _refuse(send, message: str, code: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()  # fmt: skip
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]  # fmt: skip
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})
