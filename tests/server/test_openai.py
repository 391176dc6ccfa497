"""qhx_server through the official `openai` client, on the emulator's SmolLM2 bundle: every
greedy reply must equal qhx_generate's for the same request (the CLI is the reference)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import jsonschema
import openai
import pytest

from conftest import Server, cli_chat, cli_chat_json, cli_text

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
N = 24


def test_models_lists_the_bundle(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]
    assert client.models.retrieve("smollm2").id == "smollm2"


def test_greedy_chat_equals_the_cli(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=N, temperature=0)
    want = cli_chat(QUESTION, N)
    assert r.choices[0].message.content == want
    assert want.strip(), "the reference reply is empty"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_chat_adds_up_to_the_same_text(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="smollm2",
        messages=QUESTION,
        max_tokens=N,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage, roles = [], None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        if d.content:
            pieces.append(d.content)
        finish = chunk.choices[0].finish_reason or finish
    assert roles == ["assistant"]
    assert "".join(pieces) == cli_chat(QUESTION, N)
    assert len(pieces) > 1, "the reply came in one piece: not streamed"
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0


def test_a_system_message_and_history_render_as_the_cli_renders_them(client: openai.OpenAI) -> None:
    msgs = [
        {"role": "system", "content": "You are a terse geography tutor."},
        {"role": "user", "content": "Name a large river."},
        {"role": "assistant", "content": "The Nile."},
        {"role": "user", "content": "Where is it?"},
    ]
    r = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=N, temperature=0)
    assert r.choices[0].message.content == cli_chat(msgs, N)


def test_the_next_turn_reuses_the_cached_prefix_and_still_equals_the_cli(server: Server) -> None:
    # A server of one session: both turns land on it.
    s = Server("--parallel", "1")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        first = c.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=N, temperature=0)
        turn2 = [
            *QUESTION,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And of Italy?"},
        ]
        second = c.chat.completions.create(model="smollm2", messages=turn2, max_tokens=N, temperature=0)
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached >= first.usage.prompt_tokens - 1, (cached, first.usage)
        assert second.choices[0].message.content == cli_chat(turn2, N)
    finally:
        assert s.stop() == 0


def test_a_seeded_sampled_reply_repeats_and_matches_the_cli(client: openai.OpenAI) -> None:
    kw = dict(model="smollm2", messages=QUESTION, max_tokens=N, temperature=0.8, top_p=0.9, seed=1234)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b
    assert a == cli_chat(QUESTION, N, "--temp", "0.8", "--top-p", "0.9", "--seed", "1234")


def test_stop_strings_end_the_reply(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=N, temperature=0, stop=["Paris"]
    )
    full = cli_chat(QUESTION, N)
    assert "Paris" in full
    assert r.choices[0].message.content == full[: full.index("Paris")]
    assert r.choices[0].finish_reason == "stop"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _tools_file(tmp_path: Path) -> str:
    p = tmp_path / "tools.json"
    p.write_text(json.dumps(TOOLS))
    return str(p)


def test_tool_choice_required_gives_a_call_the_cli_gives(client: openai.OpenAI, tmp_path: Path) -> None:
    r = client.chat.completions.create(
        model="smollm2", messages=WEATHER, tools=TOOLS, tool_choice="required", max_tokens=64, temperature=0
    )
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    calls = ch.message.tool_calls
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].id
    assert calls[0].function.name in ("get_weather", "get_time")
    schema = next(
        t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == calls[0].function.name
    )
    jsonschema.validate(json.loads(calls[0].function.arguments), schema)
    cli = cli_chat_json(WEATHER, 64, "--tools", _tools_file(tmp_path), "--tool-choice", "required")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in cli["tool_calls"]] == [
        (calls[0].function.name, json.loads(calls[0].function.arguments))
    ]


def test_a_named_tool_choice_calls_that_tool(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=WEATHER,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=64,
        temperature=0,
    )
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_time"]


def test_tool_choice_auto_answers_as_the_cli_does(client: openai.OpenAI, tmp_path: Path) -> None:
    r = client.chat.completions.create(
        model="smollm2", messages=WEATHER, tools=TOOLS, tool_choice="auto", max_tokens=64, temperature=0
    )
    cli = cli_chat_json(WEATHER, 64, "--tools", _tools_file(tmp_path), "--tool-choice", "auto")
    ch = r.choices[0]
    if cli.get("tool_calls"):
        assert ch.finish_reason == "tool_calls"
        assert [c.function.name for c in ch.message.tool_calls] == [
            c["function"]["name"] for c in cli["tool_calls"]
        ]
    else:
        assert ch.message.content == cli["text"]
    # Streamed, the same call (or text) arrives.
    stream = client.chat.completions.create(
        model="smollm2",
        messages=WEATHER,
        tools=TOOLS,
        tool_choice="auto",
        max_tokens=64,
        temperature=0,
        stream=True,
    )
    names, text, finish = [], "", None
    for chunk in stream:
        d = chunk.choices[0].delta
        text += d.content or ""
        names += [c.function.name for c in d.tool_calls or []]
        finish = chunk.choices[0].finish_reason or finish
    if cli.get("tool_calls"):
        assert finish == "tool_calls" and names == [c["function"]["name"] for c in cli["tool_calls"]]
    else:
        assert text == cli["text"]


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_json_schema_strict_output_validates_and_equals_the_cli(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    r = client.chat.completions.create(
        model="smollm2",
        messages=msgs,
        max_tokens=64,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), PERSON)
    assert text == cli_chat(msgs, 64, "--json-schema", json.dumps(PERSON))


def test_json_object_mode_gives_an_object(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "Give me a JSON object about Paris."}]
    r = client.chat.completions.create(
        model="smollm2", messages=msgs, max_tokens=48, temperature=0, response_format={"type": "json_object"}
    )
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    assert text.lstrip().startswith("{")


def test_completions_equal_the_cli_raw_prompt(client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
    assert r.choices[0].text == cli_text(8, prompt)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="smollm2", prompt=prompt, max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == r.choices[0].text


def test_unsupported_fields_are_refused_by_name(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, logprobs=True)
    assert e.value.body["param"] == "logprobs"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert e.value.body["code"] == "model_not_found"


def test_health_and_metrics(server: Server) -> None:
    with urllib.request.urlopen(server.url + "/health") as r:
        h = json.load(r)
    assert h["status"] == "ok" and h["sessions"] == 2
    with urllib.request.urlopen(server.url + "/metrics") as r:
        assert r.headers["content-type"].startswith("text/plain")
        text = r.read().decode()
    for name in (
        "qhx_requests_total",
        "qhx_completion_tokens_total",
        "qhx_ttft_seconds_count",
        "qhx_queue_depth",
    ):
        assert name in text


def test_speculation_and_a_context_cap_keep_the_cli_text() -> None:
    # Prompt lookup has something to draft: the reply repeats the prompt's words.
    msgs = [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog."}]
    s = Server("--spec", "lookup", "--ctx", "128")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        r = c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=N, temperature=0)
        assert r.choices[0].message.content == cli_chat(msgs, N)
        t = r.model_extra["timings"]
        assert t["draft_n"] > 0 and t["draft_n_accepted"] > 0, t
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "word " * 150}])
        assert e.value.body["code"] == "context_length_exceeded"
        assert "context is 128" in e.value.body["message"]
        assert c.models.retrieve("smollm2").model_extra["context_length"] == 128
    finally:
        assert s.stop() == 0
