"""`vlchat serve` as its own process (default limits, the demo model unless told), for figures that need the
server's own memory: its resident set now, and its peak since the last reset (/proc/PID/status VmRSS, VmHWM;
writing 5 to /proc/PID/clear_refs resets the peak)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


class ServedProcess:
    def __init__(self, cwd: Path, *args: str) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
        cmd = [sys.executable, "-m", "vlchat.app.cli", "serve", "--port", str(self.port), "--device", "cpu",
               "--num-blocks", "64", *args]  # fmt: skip
        self.log = open(cwd / "server.log", "w+")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while True:
            assert self.process.poll() is None, self.output()
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "vlchat serve did not come up:\n" + self.output()
            time.sleep(0.2)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def _status_kb(self, field: str) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.process.pid}/status")

    def rss_mb(self) -> float:
        return self._status_kb("VmRSS") / 1024

    def peak_mb(self) -> float:
        return self._status_kb("VmHWM") / 1024

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
