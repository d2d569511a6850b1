"""The `vlchat` command line: `serve`, `chat` and `--version`."""

from __future__ import annotations

import argparse
import sys

from app import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlchat", description="Vision-language chat on your own GPU or CPU.")
    parser.add_argument("--version", action="version", version=f"vlchat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("serve", help="serve the browser UI at / and the OpenAI-compatible API at /v1")
    sub.add_parser("chat", help="chat in the terminal")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    print(f"vlchat {args.command}: not available yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
