"""Fixtures of the qhx_server tests: the binaries, the emulator demo bundle, servers on free
ports (each read from the server's own "listening on" line), and qhx_generate as the
reference every greedy reply is compared with.

Environment (set by scripts/test-server.sh): QHX_BUNDLE, the SmolLM2 emulator bundle
directory; QHX_TARGET, the cargo release directory holding qhx_server, qhx_generate and
libqnn_emu.so.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("QHX_TARGET", ROOT / "target" / "release"))
BUNDLE = Path(os.environ.get("QHX_BUNDLE", ROOT / "target" / "bundles" / "smollm2"))
MANIFEST = BUNDLE / "smollm2.json"
LIB = TARGET / "libqnn_emu.so"
SERVER = TARGET / "qhx_server"
GENERATE = TARGET / "qhx_generate"


class Server:
    """One qhx_server process; its stderr is kept for the assertions."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None) -> None:
        for p in (SERVER, GENERATE, LIB, MANIFEST):
            if not p.exists():
                raise FileNotFoundError(f"{p} is missing (run scripts/test-server.sh)")
        cmd = [str(SERVER), str(MANIFEST), str(LIB), str(LIB), str(BUNDLE), "--port", "0", *flags]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self.url = ""
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"qhx_server exited: {''.join(self.lines)}")
            self.lines.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        if not self.url:
            raise RuntimeError("qhx_server did not start within 60 s")
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()
        self.host, port = self.url.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)

    def _read_rest(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def stop(self) -> int:
        """SIGTERM, then the exit code (the drain must end on its own)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        self._drain.join(timeout=5)
        return rc

    def stdout(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.read()


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = Server("--parallel", "2", "--queue", "64")
    yield s
    rc = s.stop()
    assert rc == 0, "".join(s.lines)
    assert s.stdout() == "", "qhx_server wrote to stdout"


@pytest.fixture(scope="session")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def generate(n: int, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(GENERATE), str(MANIFEST), str(LIB), str(LIB), str(BUNDLE), str(n), "-q", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)


_cli_cache: dict[str, str] = {}


def cli_text(n: int, *args: str) -> str:
    """qhx_generate's text for the same request (its trailing newline removed)."""
    key = json.dumps([n, *args])
    if key not in _cli_cache:
        out = generate(n, *args).stdout
        _cli_cache[key] = out[:-1] if out.endswith("\n") else out
    return _cli_cache[key]


def cli_chat(messages: list[dict[str, str]], n: int, *extra: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(messages, f)
    try:
        return cli_text(n, "--chat", "--messages", f.name, *extra)
    finally:
        os.unlink(f.name)


def cli_chat_json(messages: list[dict[str, str]], n: int, *extra: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(messages, f)
    try:
        return json.loads(generate(n, "--chat", "--messages", f.name, "--json", *extra).stdout)
    finally:
        os.unlink(f.name)
