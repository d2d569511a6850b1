"""Remote images (--allow-remote-images) come from public addresses only: every hop's addresses are checked after DNS
resolution, before any connection; the fetch has one deadline and one size cap."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from tests.images import encode
from vlchat.app.errors import ForbiddenMediaError, MediaError
from vlchat.app.media import load_image
from vlchat.app.settings import MediaLimits

PUBLIC_ONLY = MediaLimits(allow_remote=True)
PRIVATE_OK = MediaLimits(allow_remote=True, allow_private_remote=True, remote_timeout_s=2.0, max_image_bytes=50_000)
RED = encode(Image.new("RGB", (6, 4), (255, 0, 0)))


@pytest.fixture
def server():
    """A local image server that counts its requests: /red.png, redirects, a slow and an endless body."""
    hits = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append((self.path, self.headers.get("Host")))
            if self.path == "/red.png":
                self._send(200, RED)
            elif self.path.startswith("/redirect?to="):
                self.send_response(302)
                self.send_header("Location", self.path.split("=", 1)[1])
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/loop":
                self.send_response(302)
                self.send_header("Location", "/loop")
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/slow":
                self.send_response(200)
                self.end_headers()
                for _ in range(100):  # a byte every 0.1 s: never idle long enough for a read timeout
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.1)
            elif self.path == "/endless":
                self.send_response(200)
                self.end_headers()
                for _ in range(1000):
                    self.wfile.write(b"x" * 4096)
            else:
                self._send(404, b"")

        def _send(self, status, body):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", f"localhost:{httpd.server_address[1]}", hits
    httpd.shutdown()


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://169.254.169.254/latest/meta-data/", "link-local"),  # cloud metadata
        ("http://[fe80::1]/x.png", "link-local"),
        ("http://10.0.0.1/x.png", "loopback or private"),
        ("http://192.168.1.1/x.png", "loopback or private"),
        ("http://[::1]:9/x.png", "loopback or private"),
        ("http://[::ffff:127.0.0.1]:9/x.png", "loopback or private"),
        ("http://0.0.0.0:9/x.png", "unspecified"),
        ("http://224.0.0.1/x.png", "multicast"),
    ],
)
def test_non_public_addresses_are_refused_before_connecting(url, reason):
    with pytest.raises(ForbiddenMediaError, match=reason):
        load_image(url, PUBLIC_ONLY)


def test_loopback_by_address_or_by_name_is_refused_and_never_contacted(server):
    base, by_name, hits = server
    for url in (f"{base}/red.png", f"http://{by_name}/red.png"):
        with pytest.raises(ForbiddenMediaError, match="resolves to a loopback or private address"):
            load_image(url, PUBLIC_ONLY)
    assert hits == []


def test_private_hosts_when_allowed_and_the_host_header_keeps_the_name(server):
    base, by_name, hits = server
    assert load_image(f"http://{by_name}/red.png", PRIVATE_OK).getpixel((0, 0)) == (255, 0, 0)
    assert hits == [("/red.png", by_name)]  # connected to the checked address, named as the URL names it


def test_every_redirect_is_checked(server):
    base, _, hits = server
    with pytest.raises(ForbiddenMediaError, match="link-local"):  # never allowed, even with private hosts
        load_image(f"{base}/redirect?to=http://169.254.169.254/latest/meta-data/", PRIVATE_OK)
    assert load_image(f"{base}/redirect?to=/red.png", PRIVATE_OK).size == (6, 4)
    with pytest.raises(MediaError, match="redirected more than 3 times"):
        load_image(f"{base}/loop", PRIVATE_OK)


def test_one_deadline_and_one_size_cap_for_the_whole_fetch(server):
    base, _, _ = server
    start = time.monotonic()
    with pytest.raises(MediaError, match="longer than 2 s"):
        load_image(f"{base}/slow", PRIVATE_OK)
    assert time.monotonic() - start < 8  # the body trickles for 10 s
    with pytest.raises(MediaError, match="larger than the 50000 byte limit"):
        load_image(f"{base}/endless", PRIVATE_OK)
