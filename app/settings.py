"""Server settings: one dataclass built at the edge (CLI) and the one place app/ reads environment variables."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from vlchat.app.decode_budget import DecodeBudget
from vlchat.app.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860


@dataclass(slots=True)
class MediaLimits:
    """What an image may be; shared by the API, the UI and the terminal chat."""

    allow_remote: bool = False
    allow_private_remote: bool = False  # remote images from loopback and private addresses (never link-local)
    allowed_local_dir: str | None = None
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    max_images_per_request: int = 8
    remote_timeout_s: float = 10.0
    max_aspect_ratio: float = 200.0  # processors scale the short side up: a 1 x 20000 strip would take gigabytes
    max_request_pixels: int = 80_000_000  # all images of one request together, as their headers declare them
    max_working_pixels: int = 4_194_304  # larger images are scaled down (aspect kept) before the model's processor
    max_decode_bytes: int = 256 * 1024 * 1024  # image decoding of the whole server at once (app/decode_budget.py)
    decode_wait_s: float = 30.0  # a decode that waits longer for room answers 503
    max_processor_pixels: int = 16384 * 28 * 28  # the most a request's mm_processor_kwargs may ask (Qwen's default)
    decoding: DecodeBudget = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        limits = ("max_image_bytes", "max_image_pixels", "max_images_per_request", "max_request_pixels",
                  "max_working_pixels", "max_decode_bytes", "max_processor_pixels")  # fmt: skip
        for name in limits:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{limit_flag(name)} must be positive, not {getattr(self, name)}")
        self.decoding = DecodeBudget(self.max_decode_bytes, self.decode_wait_s)
        if not self.max_aspect_ratio >= 1:
            raise ConfigError(f"--max-aspect-ratio must be at least 1, not {self.max_aspect_ratio:g}")
        if self.allowed_local_dir is not None:
            path = Path(self.allowed_local_dir).expanduser()
            if not path.is_dir():
                raise ConfigError(f"--allowed-local-media-path {self.allowed_local_dir!r} is not a directory")
            self.allowed_local_dir = os.path.realpath(path)


def limit_flag(name: str) -> str:
    """The `vlchat serve` flag that sets the MediaLimits field `name`."""
    return "--max-images" if name == "max_images_per_request" else "--" + name.replace("_", "-")


@dataclass(slots=True)
class ServerConfig:
    """Everything `vlchat serve` needs; engine options pass through to the engine config untouched."""

    model: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    share: bool = False
    auth: tuple[str, str] | None = None
    api_key: str | None = None
    allowed_hosts: tuple[str, ...] = ()  # Host header names answered besides 127.0.0.1, localhost and `host`
    served_model_name: str | None = None
    media: MediaLimits = field(default_factory=MediaLimits)
    max_request_bytes: int = 64 * 1024 * 1024
    max_n: int = 8
    max_stop_strings: int = 8
    ui_concurrency: int = 64  # UI chats generating at once
    ui_queue_size: int = 256  # UI chats waiting for a turn; more are refused as busy
    ui_result_wait_s: float = 10.0  # a UI chat whose results nobody reads within this long of its start is stopped
    analytics_enabled: bool = False
    sampling_defaults: dict = field(default_factory=dict)  # under every request's own sampling fields
    chat_template: str | None = None  # a Jinja chat template used instead of the model's (--chat-template FILE)
    cors_origins: tuple[str, ...] = ()  # origins other than the server's own allowed to call the API from a browser
    engine_options: dict = field(default_factory=dict)

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port} is not a TCP port (0-65535)")
        if self.auth is not None and (len(self.auth) != 2 or not all(self.auth)):
            raise ConfigError("--auth takes USER:PASS with both parts non-empty")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("--api-key must not be empty")
        limits = (self.max_request_bytes, self.max_n, self.max_stop_strings, self.ui_concurrency, self.ui_queue_size)
        if min(limits) <= 0 or not self.ui_result_wait_s > 0:
            raise ConfigError("request limits must be positive")

    @property
    def unprotected(self) -> bool:
        return self.auth is None and self.api_key is None

    def replace(self, **changes) -> ServerConfig:
        return dataclasses.replace(self, **changes)


def parse_auth(value: str | None) -> tuple[str, str] | None:
    if value is None:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ConfigError("--auth takes USER:PASS, for example --auth alice:s3cret")
    return user, password


def read_chat_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--chat-template {path!r} cannot be read ({exc}); name a UTF-8 Jinja file") from None
    if not text.strip():
        raise ConfigError(f"--chat-template {path!r} is empty")
    return text


def read_env() -> dict[str, str | None]:
    """The environment variables app/ honours, read here and nowhere else."""
    return {
        "api_key": os.environ.get("VLCHAT_API_KEY") or None,
        "auth": os.environ.get("VLCHAT_AUTH") or None,
        "gradio_analytics": os.environ.get("GRADIO_ANALYTICS_ENABLED"),
        "tp_authkey": os.environ.get("VLCHAT_TP_AUTHKEY") or None,  # the key torchrun-started workers hold
    }


def quiet_gradio_defaults() -> None:
    """Gradio reads this when imported: analytics stay off unless the user turned them on."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
