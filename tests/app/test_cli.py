import subprocess
import sys

import pytest

from vlchat.app import __version__
from vlchat.app.cli import main


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"vlchat {__version__}"


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "vlchat.app.cli", "--help"], capture_output=True, text=True, check=True)
    assert "serve" in out.stdout and "chat" in out.stdout


def test_serve_options_become_a_server_config(monkeypatch, tmp_path):
    from vlchat.app.cli import build_parser, server_config

    monkeypatch.setenv("VLCHAT_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "--auth", "ann:pw", "--allow-remote-images",
                                      "--allowed-local-media-path", str(tmp_path), "--max-model-len", "256",
                                      "--prefill-delay-steps", "4", "--no-async-scheduling",
                                      "--kv-cache-dtype", "fp8", "--quantization", "fp8",
                                      "--piecewise-graph-tokens", "512"])  # fmt: skip
    config = server_config(args)
    assert (config.host, config.port, config.share) == ("127.0.0.1", 7860, False)  # local only by default
    assert config.auth == ("ann", "pw") and config.api_key == "from-env" and config.analytics_enabled is False
    assert config.media.allow_remote and config.media.allowed_local_dir == str(tmp_path.resolve())
    assert config.engine_options == {"max_model_len": 256, "prefill_delay_steps": 4, "async_scheduling": False,
                                     "kv_cache_dtype": "fp8", "quantization": "fp8",
                                     "piecewise_graph_tokens": 512}  # fmt: skip


def test_tensor_parallel_options_reach_the_engine(monkeypatch):
    from vlchat.app.cli import build_parser, server_config

    monkeypatch.setenv("VLCHAT_TP_AUTHKEY", "00ff")
    args = build_parser().parse_args(["serve", "--tensor-parallel-size", "2", "--tp-listen", "0.0.0.0:29600"])
    assert server_config(args).engine_options == {"tensor_parallel_size": 2, "tp_listen": "0.0.0.0:29600",
                                                  "tp_authkey": "00ff"}  # fmt: skip


def test_chat_template_file_and_cors_origins(tmp_path):
    from vlchat.app.cli import build_parser, server_config

    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    args = build_parser().parse_args(["serve", "--chat-template", str(template), "--cors-origins",
                                      "https://a.example", "http://localhost:3000"])  # fmt: skip
    config = server_config(args)
    assert config.chat_template == template.read_text()
    assert config.cors_origins == ("https://a.example", "http://localhost:3000")
    assert server_config(build_parser().parse_args(["serve"])).cors_origins == ()


def test_image_limit_flags_become_media_limits():
    from vlchat.app.cli import build_parser, server_config
    from vlchat.app.settings import MediaLimits

    args = build_parser().parse_args(["serve", "--max-image-bytes", "1000000", "--max-image-pixels", "2000000",
                                      "--max-request-pixels", "3000000", "--max-working-pixels", "500000",
                                      "--max-aspect-ratio", "20", "--max-decode-bytes", "64000000"])  # fmt: skip
    media = server_config(args).media
    assert (media.max_image_bytes, media.max_image_pixels, media.max_request_pixels, media.max_working_pixels,
            media.max_aspect_ratio, media.max_decode_bytes) == (1_000_000, 2_000_000, 3_000_000, 500_000, 20.0,
                                                                64_000_000)  # fmt: skip
    assert media.decoding.max_bytes == 64_000_000  # the server-wide decode budget is built from the flag
    assert server_config(build_parser().parse_args(["serve"])).media == MediaLimits()  # no flag: the defaults


@pytest.mark.parametrize(
    "argv, message",
    [
        (["serve", "--auth", "nocolon"], "USER:PASS"),
        (["serve", "--allowed-local-media-path", "/no/such/dir"], "not a directory"),
        (["serve", "--model", "/no/such/model"], "neither a directory nor a Hub id"),
        (["chat", "--model", "/no/such/model"], "neither a directory nor a Hub id"),
        (["serve", "--model", "nobody/no-such-model"], "could not get 'nobody/no-such-model'"),
        (["serve", "--model", __file__], "a .gguf file"),
        (["serve", "--chat-template", "/no/such/template.jinja"], "--chat-template"),
        (["serve", "--max-request-pixels", "0"], "--max-request-pixels must be positive"),
        (["serve", "--max-decode-bytes", "-1"], "--max-decode-bytes must be positive"),
        (["serve", "--max-aspect-ratio", "0.5"], "--max-aspect-ratio must be at least 1"),
    ],
    ids=["auth", "media-dir", "serve-model", "chat-model", "hub-id-offline", "not-a-model-file", "chat-template",
         "request-pixels-zero", "decode-bytes-negative", "aspect-ratio-below-1"],
)  # fmt: skip
def test_bad_options_are_one_line_errors(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert err.startswith(f"vlchat {argv[0]}: error: ")  # one "error", not "ModelLoadError error:"


def test_a_folder_with_only_config_json_names_what_is_missing(capsys, tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert main(["chat", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no weights" in err and "no tokenizer" in err and "sentencepiece" not in err.lower()


def test_a_port_in_use_is_one_line_before_the_model_loads(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # a model path that would fail to load: the port check must come first
        assert main(["serve", "--port", str(port), "--model", "/no/such/model"]) == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err and err.count("\n") == 1


def test_share_without_protection_warns_loudly(capsys):
    from vlchat.app.server import warn_if_unprotected
    from vlchat.app.settings import ServerConfig

    warn_if_unprotected(ServerConfig(share=True))
    assert "WARNING" in capsys.readouterr().err
    for protected in (ServerConfig(share=True, auth=("a", "b")), ServerConfig()):
        warn_if_unprotected(protected)
        assert capsys.readouterr().err == ""
    warn_if_unprotected(ServerConfig(share=True, api_key="k"))  # the key guards /v1 and, as its password, the UI
    assert capsys.readouterr().err == ""
    warn_if_unprotected(ServerConfig(host="0.0.0.0"))
    assert "without --auth or --api-key" in capsys.readouterr().err


def test_vlchat_serve_runs_and_stops_on_ctrl_c(tiny_engine, tmp_path):
    import signal
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "vlchat.app.cli", "serve", "--model", tiny_engine.config.model, "--port", str(port),
           "--max-model-len", "256", "--num-blocks", "32", "--api-key", "k", "--kv-cache-dtype", "int8"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        headers = {"Authorization": "Bearer k"}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200  # the UI
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    printed = proc.stdout.read()
    assert f"at http://127.0.0.1:{port}" in printed
    assert "KV cache: 512 tokens (int8 cache, 16-token blocks), max_model_len 256" in printed


def test_share_link_failure_is_one_line_and_serving_goes_on(monkeypatch, capsys):
    import threading

    from gradio import networking

    from vlchat.app.server import start_share_link
    from vlchat.app.settings import ServerConfig

    def no_network(*args):  # stands in for Gradio's share server, which must never be contacted from tests
        raise RuntimeError("Could not get share link from Gradio API Server.")

    monkeypatch.setattr(networking, "setup_tunnel", no_network)
    start_share_link(ServerConfig(share=True, port=7999))
    for thread in threading.enumerate():
        if thread.name == "vlchat-share":
            thread.join(timeout=5)
    err = capsys.readouterr().err
    assert err == "Could not create a share link (RuntimeError); serving locally only.\n"


def test_model_choices(tmp_path):
    from vlchat.app.model_choice import resolve_model

    demo = resolve_model(None)
    assert demo.demo and demo.name == "vlchat-demo" and demo.example_images()
    (tmp_path / "gemma-q4.gguf").write_bytes(b"GGUF")
    assert resolve_model(str(tmp_path / "gemma-q4.gguf")).name == "gemma-q4"
    (tmp_path / "m").mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (tmp_path / "m" / name).write_text("{}")
    (tmp_path / "m" / "vlchat.json").write_text('{"trained": false}')
    assert resolve_model(str(tmp_path / "m"), served_name="x").untrained
