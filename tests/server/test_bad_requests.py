"""The bad-request catalogue: each case is sent over a raw connection and must get its
status and OpenAI's error shape ({"error": {"message", "type", "param", "code"}}) naming the
field at fault; after all of them the server still answers. Slow-loris headers and a
broken request line are sent over a bare socket."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import pytest

from conftest import Server

KEY = "sk-test-0123456789"
MSG = [{"role": "user", "content": "Hi"}]


def chat(**kw: object) -> bytes:
    return json.dumps({"model": "smollm2", "messages": MSG, "max_tokens": 2, **kw}).encode()


def schema_fmt(schema: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}


TOOL = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"

# (name, method, path, body, headers, status, param, message fragment)
CASES: list[tuple[str, str, str, bytes | None, dict[str, str], int, str | None, str]] = [
    ("malformed JSON", "POST", CHAT, b'{"messages": [', {}, 400, None, "not valid JSON"),
    ("body is an array", "POST", CHAT, b"[1, 2]", {}, 400, None, "expected an object"),
    ("empty body", "POST", CHAT, b"", {}, 400, None, "empty"),
    ("invalid UTF-8", "POST", CHAT, b'{"messages": "\xff\xfe"}', {}, 400, None, "UTF-8"),
    ("messages missing", "POST", CHAT, b'{"model": "smollm2"}', {}, 400, "messages", "required"),
    ("messages empty", "POST", CHAT, chat(messages=[]), {}, 400, "messages", "empty"),
    ("messages not an array", "POST", CHAT, chat(messages="hi"), {}, 400, "messages", "an array"),
    ("message not an object", "POST", CHAT, chat(messages=["hi"]), {}, 400, "messages[0]", "an object"),
    (
        "role missing",
        "POST",
        CHAT,
        chat(messages=[{"content": "x"}]),
        {},
        400,
        "messages[0].role",
        "required",
    ),
    (
        "unknown role",
        "POST",
        CHAT,
        chat(messages=[{"role": "wizard", "content": "x"}]),
        {},
        400,
        "messages[0].role",
        "wizard",
    ),
    (
        "content a number",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": 5}]),
        {},
        400,
        "messages[0].content",
        "a number",
    ),
    (
        "image part",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        {},
        400,
        "messages[0].content[0].type",
        "image_url",
    ),
    ("n = 2", "POST", CHAT, chat(n=2), {}, 400, "n", "n = 1"),
    ("logprobs", "POST", CHAT, chat(logprobs=True), {}, 400, "logprobs", "not supported"),
    ("top_logprobs", "POST", CHAT, chat(top_logprobs=3), {}, 400, "top_logprobs", "not supported"),
    ("temperature a string", "POST", CHAT, chat(temperature="hot"), {}, 400, "temperature", "a number"),
    ("temperature too high", "POST", CHAT, chat(temperature=5), {}, 400, "temperature", "[0, 2]"),
    ("top_p zero", "POST", CHAT, chat(top_p=0), {}, 400, "top_p", "(0, 1]"),
    ("max_tokens zero", "POST", CHAT, chat(max_tokens=0), {}, 400, "max_tokens", "[1,"),
    ("max_tokens negative", "POST", CHAT, chat(max_tokens=-5), {}, 400, "max_tokens", "whole number"),
    ("max_tokens fractional", "POST", CHAT, chat(max_tokens=1.5), {}, 400, "max_tokens", "whole number"),
    (
        "both token limits",
        "POST",
        CHAT,
        chat(max_completion_tokens=3),
        {},
        400,
        "max_completion_tokens",
        "not both",
    ),
    ("five stop strings", "POST", CHAT, chat(stop=["a", "b", "c", "d", "e"]), {}, 400, "stop", "at most 4"),
    ("stop a number", "POST", CHAT, chat(stop=3), {}, 400, "stop", "a string"),
    ("stream not a boolean", "POST", CHAT, chat(stream="yes"), {}, 400, "stream", "a boolean"),
    (
        "stream_options without stream",
        "POST",
        CHAT,
        chat(stream_options={"include_usage": True}),
        {},
        400,
        "stream_options",
        "stream: true",
    ),
    ("unknown field", "POST", CHAT, chat(frobnicate=1), {}, 400, "frobnicate", "unknown"),
    ("frequency_penalty", "POST", CHAT, chat(frequency_penalty=0.5), {}, 400, "frequency_penalty", "only 0"),
    ("logit_bias", "POST", CHAT, chat(logit_bias={"1": 5}), {}, 400, "logit_bias", "not supported"),
    ("seed a string", "POST", CHAT, chat(seed="abc"), {}, 400, "seed", "an integer"),
    ("unknown model", "POST", CHAT, chat(model="gpt-4o"), {}, 404, None, "does not exist"),
    ("tools not an array", "POST", CHAT, chat(tools={"a": 1}), {}, 400, "tools", "an array"),
    (
        "tool without a name",
        "POST",
        CHAT,
        chat(tools=[{"type": "function", "function": {}}]),
        {},
        400,
        "tools",
        "name",
    ),
    (
        "tool_choice without tools",
        "POST",
        CHAT,
        chat(tool_choice="auto"),
        {},
        400,
        "tool_choice",
        "needs `tools`",
    ),
    (
        "tool_choice of an absent tool",
        "POST",
        CHAT,
        chat(tools=TOOL, tool_choice={"type": "function", "function": {"name": "g"}}),
        {},
        400,
        "tool_choice",
        "not in `tools`",
    ),
    (
        "bad response_format type",
        "POST",
        CHAT,
        chat(response_format={"type": "yaml"}),
        {},
        400,
        "response_format.type",
        "yaml",
    ),
    (
        "json_schema without a name",
        "POST",
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
        {},
        400,
        "response_format.json_schema.name",
        "name",
    ),
    (
        "bad schema regex",
        "POST",
        CHAT,
        chat(response_format=schema_fmt({"type": "string", "pattern": "a(b"})),
        {},
        400,
        "response_format",
        "a(b",
    ),
    (
        "prompt beyond the context",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": "word " * 2000}]),
        {},
        400,
        "messages",
        "context",
    ),
    ("completion prompt missing", "POST", COMP, b'{"max_tokens": 2}', {}, 400, "prompt", "required"),
    ("completion prompt batch", "POST", COMP, b'{"prompt": ["a", "b"]}', {}, 400, "prompt", "batch"),
    ("completion echo", "POST", COMP, b'{"prompt": "a", "echo": true}', {}, 400, "echo", "not supported"),
    (
        "completion token out of range",
        "POST",
        COMP,
        b'{"prompt": [99999999]}',
        {},
        400,
        "prompt",
        "vocabulary",
    ),
    (
        "chat field on completions",
        "POST",
        COMP,
        b'{"prompt": "a", "messages": []}',
        {},
        400,
        "messages",
        "unknown",
    ),
    ("oversized body", "POST", CHAT, b'{"messages": "' + b"x" * 70000 + b'"}', {}, 413, None, "exceeds"),
    ("wrong API key", "POST", CHAT, chat(), {"Authorization": "Bearer nope"}, 401, None, "API key"),
    ("no API key", "POST", CHAT, chat(), {"Authorization": ""}, 401, None, "API key"),
    ("GET on a POST endpoint", "GET", CHAT, None, {}, 405, None, "not allowed"),
    ("unknown endpoint", "POST", "/v1/embeddings", chat(), {}, 404, None, "no such endpoint"),
    ("unknown model by id", "GET", "/v1/models/gpt-4o", None, {}, 404, None, "does not exist"),
]


@pytest.fixture(scope="module")
def guarded() -> Iterator[Server]:
    s = Server("--api-key", KEY, "--max-body", "65536", "--header-timeout", "2", "--body-timeout", "2")
    yield s
    assert s.stop() == 0


def send(
    s: Server, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, dict, dict]:
    c = http.client.HTTPConnection(s.host, s.port, timeout=30)
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **headers}
    h = {k: v for k, v in h.items() if v}
    c.request(method, path, body, h)
    r = c.getresponse()
    raw = r.read()
    c.close()
    return r.status, json.loads(raw), dict(r.getheaders())


def test_the_catalogue_is_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request(guarded: Server, case: tuple) -> None:
    name, method, path, body, headers, status, param, fragment = case
    got, payload, hdrs = send(guarded, method, path, body, headers)
    assert got == status, (name, payload)
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert fragment in err["message"], (name, err)
    if param is not None:
        assert err["param"] == param, (name, err)
    assert err["type"] in ("invalid_request_error", "authentication_error", "server_error")
    if status == 401:
        assert hdrs.get("www-authenticate") == "Bearer"


def slow_headers_cut_within(s: Server, limit: float) -> float | None:
    """Dribble header lines; the seconds until the server cut the connection (None: not
    within `limit`)."""
    sock = socket.create_connection((s.host, s.port), timeout=1)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < limit:
            sock.sendall(b"X-Slow: 1\r\n")
            try:
                data = sock.recv(4096)
            except TimeoutError:
                continue
            # closed (b"") or answered (a 408 before closing): cut off either way
            return time.monotonic() - t0 if data == b"" or data.startswith(b"HTTP/1.1 4") else None
    except (BrokenPipeError, ConnectionResetError):
        return time.monotonic() - t0
    finally:
        sock.close()
    return None


def test_slow_loris_headers_are_cut_off(guarded: Server) -> None:
    cut = slow_headers_cut_within(guarded, 8)
    assert cut is not None, "the server kept a connection whose headers never ended"
    assert cut < 4, f"cut after {cut:.1f} s; --header-timeout is 2 s"


def test_a_slow_body_gets_408(guarded: Server) -> None:
    sock = socket.create_connection((guarded.host, guarded.port), timeout=15)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + KEY.encode()
        + b"\r\nContent-Length: 100\r\n\r\n{"
    )
    data = sock.recv(4096)
    sock.close()
    assert data.startswith(b"HTTP/1.1 408"), data[:200]


def test_a_broken_request_line_is_refused_and_the_server_goes_on(guarded: Server) -> None:
    sock = socket.create_connection((guarded.host, guarded.port), timeout=10)
    sock.sendall(b"\x00\x01 garbage\r\n\r\n")
    data = sock.recv(4096)
    sock.close()
    assert data == b"" or data.startswith(b"HTTP/1.1 400"), data[:200]
    got, payload, _ = send(guarded, "GET", "/v1/models", None, {})
    assert got == 200 and payload["data"][0]["id"] == "smollm2"


def test_health_needs_no_key(guarded: Server) -> None:
    c = http.client.HTTPConnection(guarded.host, guarded.port, timeout=10)
    c.request("GET", "/health")
    assert c.getresponse().status == 200


def test_an_idle_keep_alive_connection_is_closed(guarded: Server) -> None:
    sock = socket.create_connection((guarded.host, guarded.port), timeout=10)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    t0 = time.monotonic()
    assert sock.recv(16) == b"", "the idle connection was not closed"
    assert time.monotonic() - t0 < 4, "idle for longer than --header-timeout (2 s)"
    sock.close()


def test_connections_past_the_limit_get_503() -> None:
    s = Server("--max-connections", "2", "--header-timeout", "5")
    try:
        held = [socket.create_connection((s.host, s.port), timeout=10) for _ in range(2)]
        time.sleep(0.2)
        c = http.client.HTTPConnection(s.host, s.port, timeout=10)
        c.request("GET", "/v1/models")
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 503 and "too many open connections" in body["error"]["message"], body
        for h in held:
            h.close()
        time.sleep(0.2)
        c = http.client.HTTPConnection(s.host, s.port, timeout=10)
        c.request("GET", "/v1/models")
        assert c.getresponse().status == 200
    finally:
        assert s.stop() == 0
