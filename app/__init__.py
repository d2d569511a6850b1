"""vlchat application layer: CLI, HTTP API, browser UI and Python client."""

__version__ = "0.1.0"
