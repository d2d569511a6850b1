"""Safe defaults: loopback bind, no remote fetch or local read unless allowed, checkpoints without code,
upload limits, temporary files removed, and a loud warning for --share without protection.

Nothing here contacts the network: the --share path is exercised only up to its warning (the
model load fails before any share link would be asked for), and `warn_if_unprotected` directly.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil
import pytest
import torch
from safetensors.torch import load_file

from tests.app.live import start_server
from tests.images import data_url, red_png
from tests.reliability.checks import assert_openai_error, http, wait_idle
from tests.reliability.conftest import AUTH
from vlchat.app.cli import build_parser, main, server_config
from vlchat.app.model_choice import EXAMPLES, ModelChoice
from vlchat.app.server import warn_if_unprotected
from vlchat.app.settings import DEFAULT_HOST, MediaLimits, ServerConfig, quiet_gradio_defaults
from vlchat.llm.errors import ModelLoadError

REPO = Path(__file__).resolve().parents[2]
UI_BODY_LIMIT = 1_000_000


def test_serve_binds_loopback_unless_told(text_model_dir, tmp_path):
    """`vlchat serve` with no --host listens on 127.0.0.1 only, and opens no connection to anywhere else."""
    assert build_parser().parse_args(["serve"]).host == DEFAULT_HOST == "127.0.0.1" == ServerConfig().host
    assert server_config(build_parser().parse_args(["serve", "--host", "0.0.0.0"])).host == "0.0.0.0"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "GRADIO_ANALYTICS_ENABLED"}  # the app's own default
    cmd = [sys.executable, "-m", "vlchat.app.cli", "serve", "--model", str(text_model_dir), "--port", str(port),
           "--device", "cpu", "--num-blocks", "32"]  # fmt: skip
    process = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "vlchat serve did not come up"
            time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200  # the UI page renders
        connections = psutil.Process(process.pid).net_connections(kind="inet")
        listening = {c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}, connections
        remote = {c.raddr.ip for c in connections if c.raddr}
        assert remote <= {"127.0.0.1"}, f"the server talks to {remote}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_gradio_analytics_are_off_by_default(monkeypatch):
    monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED", raising=False)
    quiet_gradio_defaults()
    assert os.environ["GRADIO_ANALYTICS_ENABLED"] == "False"
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "True")  # a user's explicit choice stands
    quiet_gradio_defaults()
    assert os.environ["GRADIO_ANALYTICS_ENABLED"] == "True"


@pytest.fixture
def counting_http_server():
    hits = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            body = red_png()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()


def image_request(url: str) -> dict:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2}


def test_no_remote_fetch_unless_allowed(vlm_server, vlm_engine, counting_http_server):
    url, hits = counting_http_server
    response = http.post(f"{vlm_server.url}/v1/chat/completions", json=image_request(f"{url}/cat.png"), headers=AUTH)
    assert_openai_error(response, 403, "--allow-remote-images")
    assert hits == [], "the server fetched a remote image it was not allowed to"
    allowed = start_server(vlm_engine, ModelChoice("x", "vlchat-demo"), with_ui=False,
                           media=MediaLimits(allow_remote=True, allow_private_remote=True))  # fmt: skip
    try:
        ok = http.post(f"{allowed.url}/v1/chat/completions", json=image_request(f"{url}/cat.png"))
        assert ok.status_code == 200 and hits == ["/cat.png"], ok.text
    finally:
        allowed.stop()
    wait_idle(vlm_engine)


def test_ui_does_not_fetch_remote_files_unless_allowed(vlm_engine, monkeypatch):
    """Gradio fetches any http(s) URL named as a file value; without --allow-remote-images the app refuses first.

    Gradio's downloader is replaced by a recorder that raises, so nothing is contacted either way.
    """
    import gradio.processing_utils

    fetched = []

    async def recorder(url, cache_dir):
        fetched.append(url)
        raise OSError("the tests never download")

    monkeypatch.setattr(gradio.processing_utils, "async_ssrf_protected_download", recorder)
    remote = {"path": "http://203.0.113.5/cat.png", "meta": {"_type": "gradio.FileData"}}  # TEST-NET-3
    data = [{"text": "What is this?", "files": [remote]}, "", 0.0, 1.0, 4, []]
    choice = ModelChoice(vlm_engine.config.model, "vlchat-demo")
    for allow_remote in (False, True):
        server = start_server(vlm_engine, choice, media=MediaLimits(allow_remote=allow_remote))
        try:
            call = httpx.post(f"{server.url}/gradio_api/call/chat", json={"data": data})
            join = httpx.post(f"{server.url}/gradio_api/queue/join",
                              json={"data": data, "fn_index": 0, "session_hash": "s", "event_data": None})  # fmt: skip
            if not allow_remote:
                for response in (call, join):
                    assert_openai_error(response, 403, "--allow-remote-images")
                assert fetched == []
            else:
                assert call.status_code == 200
                httpx.get(f"{server.url}/gradio_api/call/chat/{call.json()['event_id']}", timeout=30)
                assert fetched, "the allowed server did not try the URL (the test would miss a fetch)"
        finally:
            server.stop()
    wait_idle(vlm_engine)


def test_no_local_file_read_unless_allowed(vlm_engine, tmp_path):
    (tmp_path / "cat.png").write_bytes(red_png())
    server = start_server(vlm_engine, ModelChoice("x", "vlchat-demo"), with_ui=False)  # the default: no local paths
    try:
        for path in (str(tmp_path / "cat.png"), f"file://{tmp_path / 'cat.png'}", "cat.png"):
            response = http.post(f"{server.url}/v1/chat/completions", json=image_request(path))
            assert_openai_error(response, 403, "local file paths are disabled")
    finally:
        server.stop()


def _tiny_llama_with_bin(src: Path, dst: Path, payload=None) -> Path:
    """A copy of the tiny Llama whose weights are a pickle checkpoint (pytorch_model.bin), optionally hostile."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    state = load_file(src / "model.safetensors")
    if payload is None:
        torch.save(state, dst / "pytorch_model.bin")
    else:
        with open(dst / "pytorch_model.bin", "wb") as f:
            pickle.dump(payload, f)
    return dst


class _Hostile:
    """Unpickling this runs code: it would create the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickle_checkpoint_with_code_is_refused(text_model_dir, tmp_path, capsys):
    from vlchat.llm import LLM, SamplingParams

    marker = tmp_path / "pwned"
    hostile = _tiny_llama_with_bin(text_model_dir, tmp_path / "hostile", payload={"weights": _Hostile(marker)})
    with pytest.raises(ModelLoadError, match="safetensors"):
        LLM(str(hostile), device="cpu", num_blocks=16)
    assert not marker.exists(), "loading the checkpoint ran its code"

    # The CLI: --share without --auth/--api-key warns loudly first, then the load fails with one line (exit 2)
    # before any share link would be asked for.
    assert main(["serve", "--share", "--model", str(hostile), "--device", "cpu", "--num-blocks", "16"]) == 2
    err = capsys.readouterr().err
    assert "WARNING: --share publishes this server" in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("vlchat serve: ") and "safetensors" in err
    assert not marker.exists()

    plain = _tiny_llama_with_bin(text_model_dir, tmp_path / "plain")  # a plain tensor pickle still loads
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    from_bin = LLM(str(plain), device="cpu", num_blocks=16).generate(["Hello"], greedy)[0].token_ids
    from_safetensors = LLM(str(text_model_dir), device="cpu", num_blocks=16).generate(["Hello"], greedy)[0].token_ids
    assert from_bin == from_safetensors


def test_custom_code_in_a_model_directory_never_runs(text_model_dir, tmp_path):
    """auto_map entries pointing at Python files (trust_remote_code models) are ignored, their code not imported."""
    from vlchat.llm import LLM, SamplingParams

    model = tmp_path / "with-code"
    shutil.copytree(text_model_dir, model)
    marker = tmp_path / "pwned"
    (model / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    for name, auto_map in (("config.json", {"AutoConfig": "evil.Config", "AutoModelForCausalLM": "evil.Model"}),
                           ("tokenizer_config.json", {"AutoTokenizer": [None, "evil.Tokenizer"]})):  # fmt: skip
        config = json.loads((model / name).read_text())
        (model / name).write_text(json.dumps({**config, "auto_map": auto_map}))
    out = LLM(str(model), device="cpu", num_blocks=16).generate(["Hello"], SamplingParams(max_tokens=2))
    assert out[0].token_ids and not marker.exists(), "the model directory's own code ran"


def test_share_warning_only_without_protection(capsys):
    for config, loud, ui_open in (
        (ServerConfig(share=True), True, False),  # the loud warning says it all
        (ServerConfig(share=True, api_key="k"), False, False),  # the key guards /v1 and, as its password, the UI
        (ServerConfig(share=True, auth=("alice", "s3cret")), False, False),
        (ServerConfig(share=True, auth=("alice", "s3cret"), api_key="k"), False, False),
        (ServerConfig(), False, False),
    ):
        warn_if_unprotected(config)
        err = capsys.readouterr().err
        assert ("WARNING" in err and "--auth" in err and "--api-key" in err) == loud, (config, err)
        assert ("UI" in err and "--auth" in err) == ui_open, (config, err)


@pytest.fixture(scope="module")
def ui_server(vlm_engine, tmp_path_factory):
    """The whole app (UI + API) with a 100 kB image limit, Gradio's temporary files in a directory of our own."""
    upload_dir = tmp_path_factory.mktemp("gradio-uploads")
    previous = os.environ.get("GRADIO_TEMP_DIR")
    os.environ["GRADIO_TEMP_DIR"] = str(upload_dir)
    media = MediaLimits(max_image_bytes=100_000)
    choice = ModelChoice(vlm_engine.config.model, "vlchat-demo", example_dirs=[EXAMPLES])
    server = start_server(vlm_engine, choice, media=media, max_request_bytes=UI_BODY_LIMIT)
    yield server, upload_dir
    server.stop()
    if previous is None:
        os.environ.pop("GRADIO_TEMP_DIR", None)
    else:
        os.environ["GRADIO_TEMP_DIR"] = previous


def test_ui_serves_only_the_example_images(ui_server):
    """Gradio's file route answers for the example images and nothing else on the machine."""
    server, _ = ui_server
    example = sorted(EXAMPLES.iterdir())[0]
    assert httpx.get(f"{server.url}/gradio_api/file={example}").content == example.read_bytes()
    for path in ("/etc/passwd", "/proc/self/environ", str(REPO / "pyproject.toml"), f"{EXAMPLES}/../../pyproject.toml",
                 str(REPO / "assets" / "demo-model" / "config.json"), "../../../../etc/passwd", tempfile.gettempdir()):  # fmt: skip
        response = httpx.get(f"{server.url}/gradio_api/file={path}")
        assert response.status_code in (403, 404), (path, response.status_code)


def test_ui_routes_have_a_body_limit_too(ui_server):
    """The UI's own JSON routes refuse bodies over the server's limit, like /v1 (no unbounded reads)."""
    server, _ = ui_server
    huge = b'{"data": ["' + b"a" * (2 * UI_BODY_LIMIT) + b'"], "fn_index": 0, "session_hash": "x"}'
    for path in ("/gradio_api/queue/join", "/gradio_api/run/predict"):
        response = httpx.post(f"{server.url}{path}", content=huge, headers={"Content-Type": "application/json"})
        assert response.status_code == 413, (path, response.status_code, response.text[:200])

    def chunked():  # no Content-Length: the limit holds while the body is read
        yield huge[: len(huge) // 2]
        yield huge[len(huge) // 2 :]

    response = httpx.post(f"{server.url}/gradio_api/queue/join", content=chunked(),
                          headers={"Content-Type": "application/json"})  # fmt: skip
    # Reading stops at the limit; Gradio's own handler reports the cut body as a 400.
    assert response.status_code in (400, 413), (response.status_code, response.text[:200])
    assert httpx.get(f"{server.url}/", timeout=30).status_code == 200


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def test_ui_upload_size_limit(ui_server):
    server, _ = ui_server
    big = os.urandom(150_000)
    response = httpx.post(f"{server.url}/gradio_api/upload", files={"files": ("big.png", big, "image/png")})
    assert response.status_code == 413, response.text[:300]
    small = httpx.post(f"{server.url}/gradio_api/upload", files={"files": ("ok.png", red_png(), "image/png")})
    assert small.status_code == 200, small.text[:300]


def test_api_images_leave_no_temporary_files(vlm_server, vlm_engine, tmp_path, monkeypatch):
    """Images sent to the API are decoded in memory: the process's temporary directory stays empty."""
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))  # every tempfile of this process lands here
    for _ in range(3):
        response = http.post(f"{vlm_server.url}/v1/chat/completions", json=image_request(data_url(red_png())),
                             headers=AUTH)  # fmt: skip
        assert response.status_code == 200
    assert files_under(private) == set()
    wait_idle(vlm_engine)


def test_ui_uploads_are_removed_when_the_server_stops(vlm_engine, tmp_path, monkeypatch):
    from gradio_client import Client, handle_file

    upload_dir = tmp_path / "uploads"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(upload_dir))
    (tmp_path / "cat.png").write_bytes(red_png())
    server = start_server(vlm_engine, ModelChoice(vlm_engine.config.model, "vlchat-demo"))
    try:
        client = Client(server.url, verbose=False)
        message = {"text": "What is this?", "files": [handle_file(str(tmp_path / "cat.png"))]}
        assert client.predict(message, "", 0.0, 1.0, 4, api_name="/chat")
        client.close()
        assert files_under(upload_dir), "the upload did not land in GRADIO_TEMP_DIR"
    finally:
        server.stop()
    assert files_under(upload_dir) == set(), "uploaded files outlived the server"
