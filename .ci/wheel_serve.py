"""Run by .ci/wheel_check inside the fresh virtual environment: the installed wheel serves the demo model
and answers a question about a packaged example image over HTTP and in the terminal chat, beside the `llm`
CLI, Hugging Face's `kernels` and the newest transformers."""

import base64
import importlib
import importlib.metadata as metadata
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import transformers.activations  # noqa: F401  (imports Hugging Face's kernels from 5.25 on)

import vlchat.app

# the other distributions that own these import names
kernels = importlib.import_module("kernels")
llm = importlib.import_module("llm")

site = Path(vlchat.app.__file__).resolve().parents[2]
assert Path(llm.__file__).resolve().is_relative_to(site) and "vlchat" not in llm.__file__, llm.__file__
assert hasattr(kernels, "get_kernel"), kernels.__file__  # Hugging Face's, not vlchat's
print("transformers", metadata.version("transformers"), "| llm", metadata.version("llm"),
      "| kernels", metadata.version("kernels"))  # fmt: skip

bin_dir = Path(sys.executable).parent
image = Path(vlchat.app.__file__).parent.parent / "assets" / "examples" / "three-shapes.png"
assert image.is_file(), image
env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server = subprocess.Popen([bin_dir / "vlchat", "serve", "--device", "cpu", "--port", str(port)], env=env)
try:
    deadline = time.monotonic() + 300
    while True:
        assert server.poll() is None, "vlchat serve exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "vlchat serve did not become healthy in 300 s"
        time.sleep(1)
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    body = {"model": "vlchat-demo", "max_tokens": 32, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "How many shapes are there?"}]}]}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as r:
        answer = json.load(r)["choices"][0]["message"]["content"]
    print("serve answered:", answer)
    assert answer == "There are three shapes.", answer
finally:
    server.terminate()
    server.wait(30)

typed = f"/image {image}\nHow many shapes are there?\n/exit\n"
chat = subprocess.run([bin_dir / "vlchat", "chat", "--device", "cpu", "--temperature", "0"], env=env, text=True,
                      input=typed, capture_output=True, timeout=300)  # fmt: skip
print("chat printed:", chat.stdout[-300:])
assert chat.returncode == 0 and "There are three shapes." in chat.stdout, chat.stdout + chat.stderr
print("wheel check passed")
