"""The `vlchat` command line: `serve`, `chat` and `--version`."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from vlchat.app import __version__
from vlchat.app.errors import is_user_error
from vlchat.app.settings import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    MediaLimits,
    ServerConfig,
    limit_flag,
    parse_auth,
    read_chat_template,
    read_env,
)

# MediaLimits fields `vlchat serve` sets from a flag of the same name (max_images_per_request: --max-images)
IMAGE_LIMITS = {
    "max_image_bytes": (int, "bytes of one image as sent"),
    "max_image_pixels": (int, "pixels of one image, as its header declares them"),
    "max_request_pixels": (int, "pixels of all images of one request together"),
    "max_working_pixels": (int, "larger images are scaled down (aspect kept) to this many pixels before the "
                                "model's processor"),
    "max_aspect_ratio": (float, "longest over shortest side of an image"),
    "max_decode_bytes": (int, "memory for decoding images, the whole server at once; a decode that waits "
                              "too long for room answers 503"),
}  # fmt: skip
_LIMIT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(MediaLimits)}

ENGINE_OPTIONS = ("dtype", "device", "max_model_len", "max_num_seqs", "num_blocks", "kernel_backend", "enforce_eager",
                  "max_num_batched_tokens", "prefill_delay_steps", "async_scheduling", "tensor_parallel_size",
                  "tp_listen", "kv_cache_dtype", "quantization", "piecewise_graph_tokens")  # fmt: skip


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="an HF model directory, Hub id or .gguf file (default: the demo model in assets/)")
    p.add_argument("--dtype", choices=("auto", "float32", "float16", "bfloat16"), help="weights dtype (default: auto)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), help="where the model runs (default: auto)")
    p.add_argument("--max-model-len", type=int, help="context length limit in tokens")
    p.add_argument("--max-num-seqs", type=int, help="sequences batched at once")
    p.add_argument("--num-blocks", type=int, help="KV cache blocks (default: sized from free memory)")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8", "int8", "int4"),
                   help="KV cache storage: auto (the model's dtype), fp8 (e4m3), int8 or int4 (per-token scales); "
                   "fp8/int8 hold about twice the 16-bit tokens, int4 about 3.5x (default: auto)")  # fmt: skip
    p.add_argument("--kernel-backend", choices=("auto", "triton", "torch"), help="attention kernels (default: auto)")
    p.add_argument("--quantization", choices=("fp8",), help="quantize a 16-bit checkpoint at load (fp8: W8A8)")
    p.add_argument("--enforce-eager", action="store_true", default=None, help="never capture CUDA graphs")
    p.add_argument("--piecewise-graph-tokens", type=int, metavar="N",
                   help="replay prefill and mixed steps of up to N tokens as CUDA graphs in pieces between the "
                   "attention calls (experimental; default: 0, eager)")  # fmt: skip
    p.add_argument("--max-num-batched-tokens", type=int, help="tokens one step may process (default: 2048)")
    p.add_argument("--prefill-delay-steps", type=int,
                   help="steps a new prompt may wait to be prefilled with others while sequences decode "
                   "(default: 16 with CUDA graphs, else 0)")  # fmt: skip
    p.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false", default=None,
                   help="collect each step's tokens before scheduling the next (default: async on CUDA)")  # fmt: skip
    p.add_argument("--tensor-parallel-size", type=int, metavar="N",
                   help="shard the model over N GPUs, one worker process each (default: 1)")  # fmt: skip
    p.add_argument("--tp-listen", metavar="HOST:PORT",
                   help="wait for the N workers at HOST:PORT instead of starting them (torchrun over several machines; "
                   "env VLCHAT_TP_AUTHKEY: their shared hex key; docs/TENSOR_PARALLEL.md)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlchat", description="Vision-language chat on your own GPU or CPU.")
    parser.add_argument("--version", action="version", version=f"vlchat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="serve the browser UI at / and the OpenAI-compatible API at /v1")
    _add_engine_options(serve)
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default: {DEFAULT_HOST}, this machine)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default: {DEFAULT_PORT})")
    serve.add_argument("--share", action="store_true", help="ask Gradio for a public link (needs internet access)")
    serve.add_argument("--auth", metavar="USER:PASS", help="password-protect the browser UI (env VLCHAT_AUTH)")
    serve.add_argument(
        "--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1 (or env VLCHAT_API_KEY)"
    )
    serve.add_argument("--allowed-hosts", metavar="NAMES",
                       help="comma-separated host names the server answers to besides 127.0.0.1, localhost and "
                       "--host ('*': any; against DNS rebinding, the default answers only those)")  # fmt: skip
    serve.add_argument("--served-model-name", help="the model name the API reports")
    serve.add_argument("--allow-remote-images", action="store_true", help="let requests name http(s) image URLs")
    serve.add_argument("--allow-private-image-hosts", action="store_true",
                       help="with --allow-remote-images, also fetch from loopback and private addresses "
                       "(never link-local); by default only public addresses are fetched from")  # fmt: skip
    serve.add_argument("--allowed-local-media-path", metavar="DIR", help="let requests name image files inside DIR")
    serve.add_argument("--max-images", type=int, default=8, help="images per request at most (default: 8)")
    for name, (kind, meaning) in IMAGE_LIMITS.items():
        serve.add_argument(limit_flag(name), dest=name, type=kind, metavar="N" if kind is int else "R",
                           help=f"{meaning} (default: {_LIMIT_DEFAULTS[name]:,})")  # fmt: skip
    serve.add_argument("--chat-template", metavar="FILE", help="a Jinja chat template to use instead of the model's")
    serve.add_argument("--cors-origins", metavar="ORIGIN", nargs="+", default=[],
                       help="browser origins allowed to call the API besides the server's own "
                       "(e.g. https://app.example.com; default: none)")  # fmt: skip

    chat = sub.add_parser("chat", help="chat in the terminal (/image PATH, /reset, /exit)")
    _add_engine_options(chat)
    chat.add_argument("--system", help="a system prompt")
    chat.add_argument("--max-tokens", type=int, default=512, help="tokens per answer at most (default: 512)")
    chat.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default: 0.7; 0: greedy)")
    chat.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling (default: 0.95)")
    chat.add_argument("--seed", type=int, help="seed for reproducible answers")
    return parser


def engine_options(args: argparse.Namespace) -> dict:
    options = {name: getattr(args, name) for name in ENGINE_OPTIONS if getattr(args, name, None) is not None}
    authkey = read_env()["tp_authkey"]
    if authkey is not None:
        options["tp_authkey"] = authkey
    return options


def server_config(args: argparse.Namespace) -> ServerConfig:
    env = read_env()
    media = MediaLimits(
        allow_remote=args.allow_remote_images,
        allow_private_remote=args.allow_private_image_hosts,
        allowed_local_dir=args.allowed_local_media_path,
        max_images_per_request=args.max_images,
        **{name: getattr(args, name) for name in IMAGE_LIMITS if getattr(args, name) is not None},
    )
    return ServerConfig(
        model=args.model,
        host=args.host,
        port=args.port,
        share=args.share,
        auth=parse_auth(args.auth or env["auth"]),
        api_key=args.api_key or env["api_key"],
        allowed_hosts=tuple(h.strip() for h in (args.allowed_hosts or "").split(",") if h.strip()),
        served_model_name=args.served_model_name,
        media=media,
        analytics_enabled=(env["gradio_analytics"] or "").lower() in ("1", "true"),
        engine_options=engine_options(args),
        chat_template=read_chat_template(args.chat_template),
        cors_origins=tuple(args.cors_origins),
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if args.command == "serve":
            from vlchat.app.server import serve

            return serve(server_config(args))
        from vlchat.app.chat import chat_main
        from vlchat.app.generation import sampling_params

        sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p}
        sampling["seed"] = args.seed
        sampling_params(**sampling)  # a bad --temperature etc. fails now, not at every message
        return chat_main(args.model, engine_options(args), sampling, args.system)
    except Exception as exc:
        if not is_user_error(exc):
            raise
        print(f"vlchat {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
