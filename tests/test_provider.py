"""OpenAICompatProvider against a real local OpenAI-compatible server, through the real `openai` client."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from picoclaw.config import AgentDefaults, Config, ProviderConfig, parse_config
from picoclaw.errors import ConfigError
from picoclaw.providers.base import ChatReply, ProviderError, ToolCall, Usage
from picoclaw.providers.openai_compat import OpenAICompatProvider, from_config
from tests.fakes import FakeOpenAIServer

KEY = "sk-test-0123456789abcdef"
# The provider honours retry-after-ms (up to 60 s), so scripted failures cost milliseconds, not the
# 0.5 s, 1 s, 2 s … of its own backoff.
FAST_RETRY = {"retry-after-ms": "5"}
# A timeout within which the fake server's answer (or first streamed piece) comes even on a busy machine, for
# tests where one request must time out and another must not; a stall the server is scripted with outlasts it
# (and is cut short when the server stops).
IN_TIME = 1.0
STALL = 30.0
HELLO = [{"role": "user", "content": "hello"}]
MEMORY_TOOL = {"type": "function", "function": {
    "name": "memory_append", "description": "Store a fact in long-term memory.",
    "parameters": {"type": "object", "properties": {"content": {"type": "string"}, "slot": {"type": "string"}},
                   "required": ["content"]}}}

T = TypeVar("T")


def make_provider(server: FakeOpenAIServer, *, timeout: float = 5.0, max_retries: int = 2,
                  name: str = "openai", api_key: str = KEY, retry_timeouts: bool = False,
                  **defaults: Any) -> OpenAICompatProvider:
    return OpenAICompatProvider(name=name, api_base=server.base_url, api_key=api_key,
                                defaults=AgentDefaults(**defaults), timeout=timeout, max_retries=max_retries,
                                retry_timeouts=retry_timeouts)


def run(provider: OpenAICompatProvider, call: Callable[[OpenAICompatProvider], Awaitable[T]]) -> T:
    """Run one provider call in a fresh event loop and close the client in the same loop."""
    async def main() -> T:
        async with provider:
            return await call(provider)
    return asyncio.run(main())


def chat(provider: OpenAICompatProvider, messages: list[dict[str, Any]] = HELLO,
         tools: list[dict[str, Any]] | None = None) -> Any:
    return run(provider, lambda p: p.chat(messages, tools))


def failure(provider: OpenAICompatProvider, messages: list[dict[str, Any]] = HELLO) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        chat(provider, messages)
    return caught.value


def streamed(provider: OpenAICompatProvider, messages: list[dict[str, Any]] = HELLO,
             tools: list[dict[str, Any]] | None = None) -> tuple[ChatReply, list[str]]:
    """One streamed call: the reply and the pieces `on_text` received, in order."""
    pieces: list[str] = []

    async def sink(piece: str) -> None:
        pieces.append(piece)

    reply = run(provider, lambda p: p.chat(messages, tools, on_text=sink))
    return reply, pieces


# -- replies -----------------------------------------------------------------------------------------


def test_text_reply_and_usage(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_text("Hello there.", usage={"prompt_tokens": 12, "completion_tokens": 3})
    provider = make_provider(fake_openai)
    reply = chat(provider)
    assert reply.content == "Hello there."
    assert reply.tool_calls == []
    assert reply.finish_reason == "stop"
    assert reply.usage == Usage(12, 3)
    assert provider.last_usage == Usage(12, 3)


def test_usage_totals_add_up_over_calls(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_text("one", usage={"prompt_tokens": 10, "completion_tokens": 1})
    fake_openai.reply_text("two", usage={"prompt_tokens": 20, "completion_tokens": 2})
    fake_openai.reply_text("three", usage=False)  # some compatible servers send no usage at all
    provider = make_provider(fake_openai)

    async def three_calls(p: OpenAICompatProvider) -> list[str | None]:
        return [(await p.chat(HELLO)).content for _ in range(3)]

    assert run(provider, three_calls) == ["one", "two", "three"]
    assert provider.last_usage is None
    assert provider.total_usage == Usage(30, 3)
    assert provider.calls == 3


def test_tool_calls_are_parsed_with_raw_arguments(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_tool_calls([
        ("memory_append", {"content": "用户喜欢绿茶", "slot": "long_term"}),
        ("memory_append", '{"content": "unterminated'),  # malformed JSON must reach the loop unchanged
    ])
    reply = chat(make_provider(fake_openai), tools=[MEMORY_TOOL])
    assert reply.finish_reason == "tool_calls"
    assert [c.name for c in reply.tool_calls] == ["memory_append", "memory_append"]
    assert json.loads(reply.tool_calls[0].arguments) == {"content": "用户喜欢绿茶", "slot": "long_term"}
    assert reply.tool_calls[1].arguments == '{"content": "unterminated'
    assert len({c.id for c in reply.tool_calls}) == 2 and all(c.id for c in reply.tool_calls)
    assert reply.as_message()["tool_calls"][1]["function"]["arguments"] == '{"content": "unterminated'


def test_tool_call_arguments_sent_as_an_object_become_json_text(fake_openai: FakeOpenAIServer) -> None:
    # Older Ollama versions send `arguments` as an object instead of a JSON string.
    fake_openai.reply_raw({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "llama3",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "",
            "tool_calls": [{"id": "call_a", "type": "function",
                            "function": {"name": "memory_search", "arguments": {"query": "茶"}}}]}}],
    })
    reply = chat(make_provider(fake_openai), tools=[MEMORY_TOOL])
    assert reply.tool_calls == [ToolCall("call_a", "memory_search", '{"query": "茶"}')]
    assert reply.usage is None


def test_chinese_round_trips(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda body: "你说的是：" + body["messages"][-1]["content"]
    reply = chat(make_provider(fake_openai), [{"role": "user", "content": "我住在杭州，喜欢龙井茶 🍵"}])
    assert reply.content == "你说的是：我住在杭州，喜欢龙井茶 🍵"
    assert fake_openai.chat_requests()[0]["messages"][0]["content"] == "我住在杭州，喜欢龙井茶 🍵"


def test_default_reply_is_ok(fake_openai: FakeOpenAIServer) -> None:
    assert chat(make_provider(fake_openai)).content == "ok"


# -- what is sent ------------------------------------------------------------------------------------


def test_request_carries_model_temperature_max_tokens_and_tools(fake_openai: FakeOpenAIServer) -> None:
    provider = make_provider(fake_openai, model="qwen-plus", temperature=0.3, max_tokens=777)

    async def two_calls(p: OpenAICompatProvider) -> None:
        await p.chat(HELLO, [MEMORY_TOOL])
        await p.chat(HELLO, max_tokens=50)

    run(provider, two_calls)
    with_tools, plain = fake_openai.chat_requests()
    assert with_tools["model"] == "qwen-plus"
    assert with_tools["temperature"] == 0.3
    assert with_tools["max_tokens"] == 777
    assert with_tools["messages"] == HELLO
    assert with_tools["tools"] == [MEMORY_TOOL]
    assert with_tools["tool_choice"] == "auto"
    # Without tools neither key is sent: OpenAI rejects tool_choice without tools.
    assert "tools" not in plain and "tool_choice" not in plain
    assert plain["max_tokens"] == 50
    assert fake_openai.requests[0].headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_the_body_is_compact_utf8_json_as_the_client_would_send_it(fake_openai: FakeOpenAIServer,
                                                                     stream: bool) -> None:
    """The provider encodes the body itself (orjson); the bytes are the client's own encoding's: compact, UTF-8,
    keys in order; a number orjson refuses (past 64 bits, in a tool's schema) is sent all the same."""
    huge: dict[str, Any] = json.loads(json.dumps(MEMORY_TOOL))
    huge["function"]["parameters"] = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 2**64}}}
    said = [{"role": "user", "content": "我住在杭州 🍵"}, {"role": "assistant", "content": "Noted: Hangzhou."},
            {"role": "user", "content": "And the tea?"}]
    provider = make_provider(fake_openai, temperature=0.25)

    async def calls(p: OpenAICompatProvider) -> None:
        for tools in ([MEMORY_TOOL], [huge]):
            if stream:
                await p.chat(said, tools, on_text=lambda piece: asyncio.sleep(0))
            else:
                await p.chat(said, tools)

    run(provider, calls)
    chats = [request for request in fake_openai.requests if request.path.endswith("/chat/completions")]
    assert len(chats) == 2
    for request, tools in zip(chats, ([MEMORY_TOOL], [huge])):
        sent = json.loads(request.raw)
        assert request.raw == json.dumps(sent, ensure_ascii=False, separators=(",", ":")).encode()
        assert "杭州 🍵".encode() in request.raw
        assert list(sent)[-1] == "messages" and sent["messages"] == said and sent["tools"] == tools
        assert sent["temperature"] == 0.25 and sent.get("stream", False) is stream
        assert request.headers["content-type"] == "application/json"


def test_a_tool_round_trip_is_accepted_by_a_strict_server(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_tool_calls([("memory_append", {"content": "likes tea"})])
    fake_openai.reply_text("Noted.")
    provider = make_provider(fake_openai)

    async def turn(p: OpenAICompatProvider) -> str | None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "remember: I like tea"}]
        first = await p.chat(messages, [MEMORY_TOOL])
        messages.append(first.as_message())
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "stored"} for c in first.tool_calls]
        return (await p.chat(messages, [MEMORY_TOOL])).content

    assert run(provider, turn) == "Noted."
    assert fake_openai.chat_requests()[1]["messages"][2]["role"] == "tool"


def test_a_tool_message_without_its_call_is_refused_like_openai(fake_openai: FakeOpenAIServer) -> None:
    orphan = [{"role": "tool", "tool_call_id": "call_x", "content": "stored"}, *HELLO]
    error = failure(make_provider(fake_openai), orphan)
    assert error.kind == "bad_response"
    assert "(HTTP 400)" in str(error) and "tool" in str(error)


# -- retries and errors ------------------------------------------------------------------------------


def test_429_with_retry_after_ms_is_retried(fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    fake_openai.reply_error(429, "Rate limit reached for requests", headers=FAST_RETRY)
    fake_openai.reply_text("after the wait")
    with caplog.at_level(logging.INFO, logger="picoclaw.providers"):
        assert chat(make_provider(fake_openai)).content == "after the wait"
    assert len(fake_openai.chat_requests()) == 2
    # The 5 ms hint was used, not the 0.5 s default backoff (the log says the wait: no clock to race).
    assert [r.getMessage() for r in caplog.records] == ["provider openai: RateLimitError; retry 1 of 2 in 0.01 s"]


def test_500_twice_then_success(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_error(500, "The server had an error", headers=FAST_RETRY)
    fake_openai.reply_error(502, "Bad gateway", headers=FAST_RETRY)
    fake_openai.reply_text("finally")
    assert chat(make_provider(fake_openai, max_retries=2)).content == "finally"
    assert len(fake_openai.chat_requests()) == 3


def test_persistent_500_is_unavailable(fake_openai: FakeOpenAIServer) -> None:
    for _ in range(3):
        fake_openai.reply_error(500, "The server had an error while processing your request", headers=FAST_RETRY)
    error = failure(make_provider(fake_openai, max_retries=2))
    assert error.kind == "unavailable"
    assert str(error) == ("the model provider 'openai' is unavailable (HTTP 500): "
                          "The server had an error while processing your request")
    assert len(fake_openai.chat_requests()) == 3  # first try + 2 retries
    assert fake_openai.pending() == 0


def test_persistent_429_is_rate_limit(fake_openai: FakeOpenAIServer) -> None:
    for _ in range(2):
        fake_openai.reply_error(429, "Rate limit reached", code="rate_limit_exceeded", headers=FAST_RETRY)
    error = failure(make_provider(fake_openai, max_retries=1))
    assert error.kind == "rate_limit"
    assert "429" in str(error)
    assert len(fake_openai.chat_requests()) == 2


def test_401_is_auth_and_never_shows_the_key() -> None:
    with FakeOpenAIServer(api_key="sk-the-right-one") as server:
        wrong = "sk-wrong-key-9876543210"
        error = failure(make_provider(server, api_key=wrong, name="deepseek"))
        assert error.kind == "auth"
        assert str(error) == ("the model provider 'deepseek' refused the API key (401); "
                              "check providers.deepseek.api_key or DEEPSEEK_API_KEY")
        assert wrong not in str(error) and wrong[-4:] not in str(error)
        assert len(server.chat_requests()) == 1  # a bad key is not retried


def test_403_is_auth(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_error(403, "Project does not have access to model")
    assert failure(make_provider(fake_openai)).kind == "auth"


def test_key_echoed_by_the_server_is_redacted(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_error(404, f"The model `x` does not exist or key {KEY} lacks access")
    error = failure(make_provider(fake_openai))
    assert error.kind == "bad_response"
    assert KEY not in str(error) and "***" in str(error)


def leaked(text: str, secret: str, run: int = 4) -> list[str]:
    """Every run of `run` characters of `secret` that appears in `text`."""
    return [secret[i:i + run] for i in range(len(secret) - run + 1) if secret[i:i + run] in text]


@pytest.mark.parametrize("padding", ["The model `gpt-x` does not exist. ", "模型不存在，请检查名称。"],
                         ids=["english", "chinese"])
def test_a_key_quoted_where_the_server_message_is_cut_shows_none_of_it(fake_openai: FakeOpenAIServer,
                                                                       padding: str) -> None:
    key = "sk-proj-Q7vX9kLm2NpR4tZ8wB3yC6dFhJ"
    for before in range(160, 215, 6):  # the key ends before, straddles, or starts after the 200-character cut
        fake_openai.reply_error(404, (padding * 20)[:before] + f" key={key} lacks access")
        error = failure(make_provider(fake_openai, api_key=key, max_retries=0))
        assert error.kind == "bad_response" and len(str(error)) < 300 and leaked(str(error), key) == [], str(error)
    # A proxy's page that echoes the request headers, the key among them.
    fake_openai.reply_raw(f"<html><body><h1>502 Bad Gateway</h1><pre>{padding * 6}\nAuthorization: Bearer {key}"
                          "</pre></body></html>", status=502, content_type="text/html")
    error = failure(make_provider(fake_openai, api_key=key, max_retries=0))
    assert error.kind == "unavailable" and "\n" not in str(error) and leaked(str(error), key) == [], str(error)


@pytest.mark.parametrize(("status", "message", "code"), [
    (400, "This model's maximum context length is 128000 tokens. However, your messages resulted in "
          "130000 tokens.", "context_length_exceeded"),
    (400, "This model's maximum context length is 65536 tokens.", None),  # DeepSeek: no code
    (400, "prompt is too long: 210000 tokens > 200000 maximum", "invalid_request_error"),
    (413, "Request too large: too many tokens", None),
])
def test_context_too_long(fake_openai: FakeOpenAIServer, status: int, message: str, code: str | None) -> None:
    fake_openai.reply_error(status, message, code=code)
    error = failure(make_provider(fake_openai))
    assert error.kind == "context_too_long"
    assert "too long for model 'gpt-4o-mini'" in str(error)
    assert len(fake_openai.chat_requests()) == 1


def test_other_400_is_bad_response(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_error(400, "Invalid value for 'temperature'", code="invalid_value")
    error = failure(make_provider(fake_openai))
    assert error.kind == "bad_response"
    assert "Invalid value for 'temperature'" in str(error)


def test_garbage_body_is_bad_response(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_garbage()
    error = failure(make_provider(fake_openai))
    assert error.kind == "bad_response"
    assert "'openai'" in str(error) and "\n" not in str(error)


@pytest.mark.parametrize("body", [
    {"id": "x", "object": "chat.completion", "choices": []},
    {"error": None, "result": "hello"},
    '{"choices": [{"message": ',  # claims to be JSON, is not
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": ["not", "text"]}}]},
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": None,
                                          "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}}]},
])
def test_a_200_that_is_not_a_completion_is_bad_response(fake_openai: FakeOpenAIServer, body: Any) -> None:
    fake_openai.reply_raw(body)
    error = failure(make_provider(fake_openai))
    assert error.kind == "bad_response"
    assert len(fake_openai.chat_requests()) == 1  # a bad body is not retried


def test_slow_server_times_out_as_unavailable(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_text("too late", delay=STALL)
    started = time.monotonic()
    error = failure(make_provider(fake_openai, timeout=0.2, max_retries=0))
    assert error.kind == "unavailable"
    assert str(error) == "the model provider 'openai' did not answer within 0.2 s"
    assert time.monotonic() - started < STALL / 2  # the timeout ended the call, not the reply


def test_nothing_listening_is_unavailable() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = OpenAICompatProvider(name="ollama", api_base=f"http://127.0.0.1:{port}/v1", api_key="ollama",
                                    defaults=AgentDefaults(), timeout=2.0, max_retries=0)
    error = failure(provider)
    assert error.kind == "unavailable"
    assert str(error) == f"could not connect to the model provider 'ollama' at http://127.0.0.1:{port}/v1"


# -- embeddings --------------------------------------------------------------------------------------


def test_embeddings_have_the_requested_dimensions(fake_openai: FakeOpenAIServer) -> None:
    texts = ["I like green tea", "我喜欢绿茶", "green tea is nice"]
    vectors = run(make_provider(fake_openai), lambda p: p.embed(texts, "text-embedding-3-small", 64))
    assert [len(v) for v in vectors] == [64, 64, 64]
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-6) for v in vectors)
    sent = fake_openai.embedding_requests()[0]
    assert sent["input"] == texts and sent["dimensions"] == 64 and sent["model"] == "text-embedding-3-small"
    cosine = sum(a * b for a, b in zip(vectors[0], vectors[2]))
    assert cosine > sum(a * b for a, b in zip(vectors[0], vectors[1]))  # shared words → closer vectors


def test_embeddings_are_deterministic_and_base64_works(fake_openai: FakeOpenAIServer) -> None:
    # The client's own default is base64; the provider asks for floats. Both must give the same vector.
    first = run(make_provider(fake_openai), lambda p: p.embed(["同一句话"], "m", None))

    async def base64_call(p: OpenAICompatProvider) -> list[float]:
        result = await p._client.embeddings.create(input=["同一句话"], model="m")
        return list(result.data[0].embedding)

    second = run(make_provider(fake_openai), base64_call)
    assert len(first[0]) == fake_openai.default_dimensions
    assert second == pytest.approx(first[0], rel=1e-6)
    assert fake_openai.embedding_requests()[1]["encoding_format"] == "base64"


def test_embedding_errors_are_sorted_too(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_error(401, "bad key", endpoint="embeddings")
    with pytest.raises(ProviderError) as caught:
        run(make_provider(fake_openai), lambda p: p.embed(["x"], "m", 8))
    assert caught.value.kind == "auth"
    assert fake_openai.pending() == 0 and fake_openai.pending("embeddings") == 0


def test_no_texts_means_no_request(fake_openai: FakeOpenAIServer) -> None:
    assert run(make_provider(fake_openai), lambda p: p.embed([], "m", 8)) == []
    assert fake_openai.requests == []


# -- from_config -------------------------------------------------------------------------------------


def config_with(provider: str, **providers: ProviderConfig) -> Config:
    return Config.model_validate({"agents": {"defaults": {"provider": provider, "model": "qwen-max"}},
                                  "providers": providers})


def test_from_config_uses_the_default_provider(fake_openai: FakeOpenAIServer) -> None:
    config = config_with("local", local=ProviderConfig(api_key="sk-local", api_base=fake_openai.base_url))
    provider = from_config(config, timeout=3, max_retries=0)
    assert (provider.name, provider.model) == ("local", "qwen-max")
    assert chat(provider).content == "ok"
    assert fake_openai.requests[0].headers["authorization"] == "Bearer sk-local"


def test_from_config_unknown_provider() -> None:
    config = config_with("openai", openai=ProviderConfig(api_key="k", api_base="http://127.0.0.1:9/v1"),
                         deepseek=ProviderConfig(api_key="k", api_base="http://127.0.0.1:9/v1"))
    with pytest.raises(ConfigError) as caught:
        from_config(config, "qwen")
    assert str(caught.value) == "provider 'qwen' is not in config.json providers (known: deepseek, openai)"


def test_from_config_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QWEN_API_KEY", raising=False)
    config = config_with("qwen", qwen=ProviderConfig(api_base="http://127.0.0.1:9/v1"))
    with pytest.raises(ConfigError) as caught:
        from_config(config)
    assert "providers.qwen.api_key" in str(caught.value) and "QWEN_API_KEY" in str(caught.value)


def test_from_config_takes_the_key_from_the_environment(fake_openai: FakeOpenAIServer,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWEN_API_KEY", "sk-from-env")
    config = config_with("qwen", qwen=ProviderConfig(api_base=fake_openai.base_url))
    chat(from_config(config, timeout=3, max_retries=0))
    assert fake_openai.requests[0].headers["authorization"] == "Bearer sk-from-env"


def test_from_config_takes_the_base_url_from_the_environment(fake_openai: FakeOpenAIServer,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_VLLM_API_BASE", fake_openai.base_url)
    config = config_with("my-vllm", **{"my-vllm": ProviderConfig(api_key="sk-local")})
    assert chat(from_config(config, timeout=3, max_retries=0)).content == "ok"
    assert [r.path for r in fake_openai.requests] == ["/v1/chat/completions"]


def test_from_config_missing_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QWEN_API_BASE", raising=False)
    with pytest.raises(ConfigError) as caught:
        from_config(config_with("qwen", qwen=ProviderConfig(api_key="k")))
    assert str(caught.value) == ("provider 'qwen' has no api_base: set providers.qwen.api_base in config.json "
                                 "or the QWEN_API_BASE environment variable")


def test_out_of_quota_says_so(fake_openai: FakeOpenAIServer) -> None:
    # OpenAI's billing limit is a 429 too, but waiting will not fix it: the message must say which it is.
    fake_openai.reply_error(429, "You exceeded your current quota", code="insufficient_quota",
                            headers={"x-should-retry": "false"})
    error = failure(make_provider(fake_openai))
    assert error.kind == "rate_limit"
    assert "out of quota" in str(error)


# -- the fake itself ---------------------------------------------------------------------------------


def test_concurrent_calls_each_take_one_scripted_reply(fake_openai: FakeOpenAIServer) -> None:
    answers = [f"answer {i} / 回答 {i}" for i in range(6)]
    for i, answer in enumerate(answers):
        fake_openai.reply_text(answer, delay=0.01 * (i % 3))

    async def together(p: OpenAICompatProvider) -> list[str | None]:
        replies = await asyncio.gather(*(p.chat([{"role": "user", "content": f"q{i}"}]) for i in range(6)))
        return [r.content for r in replies]

    assert sorted(run(make_provider(fake_openai), together)) == sorted(answers)
    assert sorted(r["messages"][0]["content"] for r in fake_openai.chat_requests()) == [f"q{i}" for i in range(6)]
    assert fake_openai.pending() == 0


def test_sync_client_works_and_stop_does_not_wait_for_a_delayed_reply() -> None:
    import openai

    server = FakeOpenAIServer().start()
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, timeout=IN_TIME, max_retries=0)
    server.reply_text("同步 sync")
    assert client.chat.completions.create(model="m", messages=HELLO).choices[0].message.content == "同步 sync"
    server.reply_text("never seen", delay=STALL)
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.2).chat.completions.create(model="m", messages=HELLO)
    client.close()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < STALL / 2  # the delayed reply was cut short, not waited for


# -- streaming ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["Hello there, this answer arrives piece by piece.",
                                  "你好！这个回答是一段一段到达的。"])
def test_streamed_text_arrives_in_pieces_and_equals_the_plain_reply(fake_openai: FakeOpenAIServer,
                                                                     text: str) -> None:
    usage = {"prompt_tokens": 21, "completion_tokens": 9}
    fake_openai.reply_text(text, usage=usage)
    fake_openai.reply_text(text, usage=usage)
    provider = make_provider(fake_openai)

    reply, pieces = streamed(provider)
    plain = chat(make_provider(fake_openai))

    assert len(pieces) > 1 and "".join(pieces) == text
    assert reply == plain == ChatReply(text, [], Usage(21, 9), "stop")
    assert provider.last_usage == Usage(21, 9) and provider.calls == 1
    stream_request, plain_request = fake_openai.chat_requests()
    assert stream_request["stream"] is True and stream_request["stream_options"] == {"include_usage": True}
    assert "stream" not in plain_request and "stream_options" not in plain_request
    assert {k: v for k, v in stream_request.items() if not k.startswith("stream")} == plain_request


def test_streamed_tool_calls_are_assembled(fake_openai: FakeOpenAIServer) -> None:
    calls = [("memory_append", {"content": "用户喜欢龙井茶，住在杭州", "slot": "long_term"}),
             ("list_dir", {"path": "笔记/notes"})]
    fake_openai.reply_tool_calls(calls, content="我记一下 / noting it")
    fake_openai.reply_tool_calls(calls, content="我记一下 / noting it")

    reply, pieces = streamed(make_provider(fake_openai), tools=[MEMORY_TOOL])
    plain = chat(make_provider(fake_openai), tools=[MEMORY_TOOL])

    assert "".join(pieces) == reply.content == "我记一下 / noting it"
    assert reply.finish_reason == plain.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [(n, a) for n, a in calls]
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [(c.name, c.arguments) for c in plain.tool_calls]
    assert len({c.id for c in reply.tool_calls}) == 2 and all(c.id.startswith("call_") for c in reply.tool_calls)
    assert reply.usage == plain.usage


def test_streamed_tool_calls_without_text_give_no_piece_and_no_content(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_tool_calls([("memory_search", {"query": "茶"})])
    reply, pieces = streamed(make_provider(fake_openai), tools=[MEMORY_TOOL])
    assert pieces == []
    assert reply.content is None
    assert reply.tool_calls[0].name == "memory_search" and json.loads(reply.tool_calls[0].arguments) == {"query": "茶"}


def test_a_server_that_refuses_streaming_gets_one_plain_request() -> None:
    with FakeOpenAIServer(streaming=False) as server:
        server.reply_text("完整的回答，一次到达 / the whole answer at once", usage={"prompt_tokens": 5,
                                                                              "completion_tokens": 7})
        server.reply_text("第二次 / second")
        provider = make_provider(server)

        async def two_calls(p: OpenAICompatProvider) -> tuple[list[ChatReply], list[str]]:
            pieces: list[str] = []

            async def sink(piece: str) -> None:
                pieces.append(piece)

            return [await p.chat(HELLO, on_text=sink), await p.chat(HELLO, on_text=sink)], pieces

        (first, second), pieces = run(provider, two_calls)
        assert pieces == ["完整的回答，一次到达 / the whole answer at once", "第二次 / second"]
        assert first == ChatReply("完整的回答，一次到达 / the whole answer at once", [], Usage(5, 7), "stop")
        # The streamed attempt, the plain one; then the provider remembers and asks plainly straight away.
        assert [r.get("stream", False) for r in server.chat_requests()] == [True, False, False]
        assert server.pending() == 0


def test_a_server_that_ignores_stream_is_asked_only_once(fake_openai: FakeOpenAIServer) -> None:
    # Some servers answer a streamed request with a whole completion: it is used, not requested again.
    fake_openai.reply_raw({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "local",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "整段回答 whole reply"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    })
    reply, pieces = streamed(make_provider(fake_openai))
    assert pieces == ["整段回答 whole reply"]
    assert reply == ChatReply("整段回答 whole reply", [], Usage(3, 4), "stop")
    assert len(fake_openai.chat_requests()) == 1


def test_a_streamed_request_is_retried_before_any_text(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_error(503, "overloaded, 请稍后再试", headers=FAST_RETRY)
    fake_openai.reply_text("after the wait / 等了一下")
    reply, pieces = streamed(make_provider(fake_openai))
    assert "".join(pieces) == reply.content == "after the wait / 等了一下"
    assert [r["stream"] for r in fake_openai.chat_requests()] == [True, True]


def test_streaming_errors_are_sorted_like_plain_ones(fake_openai: FakeOpenAIServer) -> None:
    # A 401 or 429 is not "this server cannot stream": no plain request follows.
    fake_openai.reply_error(401, "Incorrect API key provided")
    with pytest.raises(ProviderError) as caught:
        streamed(make_provider(fake_openai))
    assert caught.value.kind == "auth"
    for _ in range(2):
        fake_openai.reply_error(429, "Rate limit reached", headers=FAST_RETRY)
    with pytest.raises(ProviderError) as caught:
        streamed(make_provider(fake_openai, max_retries=1))
    assert caught.value.kind == "rate_limit"
    assert [r["stream"] for r in fake_openai.chat_requests()] == [True, True, True]


def test_a_slow_stream_is_fine_while_every_piece_comes_within_the_timeout(fake_openai: FakeOpenAIServer) -> None:
    # Like llama.cpp on a small CPU: the whole answer takes longer than the timeout, each token does not (by a
    # margin a busy machine does not eat: 0.4 s a chunk, 1.2 s allowed).
    fake_openai.reply_text("慢慢地写 slowly", chunk_delay=0.4)
    started = time.monotonic()
    reply, pieces = streamed(make_provider(fake_openai, timeout=1.2, max_retries=0))
    # 0.4 s before each chunk after the first piece (three pieces, the finish, the usage): 2 s in all.
    assert reply.content == "慢慢地写 slowly" and len(pieces) == 4
    assert time.monotonic() - started > 1.2


def test_text_already_shown_is_never_sent_again(fake_openai: FakeOpenAIServer) -> None:
    # The server stalls after the first piece; even with timeouts retried, a retry would show it twice.
    fake_openai.reply_text("你好，然后就没有然后了", chunk_delay=STALL)
    with pytest.raises(ProviderError) as caught:
        streamed(make_provider(fake_openai, timeout=IN_TIME, max_retries=2, retry_timeouts=True))
    assert caught.value.kind == "unavailable" and f"{IN_TIME:g} s" in str(caught.value)
    assert len(fake_openai.chat_requests()) == 1


def test_an_error_in_on_text_propagates_unchanged(fake_openai: FakeOpenAIServer) -> None:
    class Closed(Exception):
        pass

    async def sink(piece: str) -> None:
        raise Closed(f"the chat window closed at {piece!r}")

    fake_openai.reply_text("有人在吗 anyone there")
    with pytest.raises(Closed):
        run(make_provider(fake_openai), lambda p: p.chat(HELLO, on_text=sink))
    assert len(fake_openai.chat_requests()) == 1


# -- retries: the provider's, not the client's -------------------------------------------------------


def test_a_timed_out_request_is_not_sent_again_by_default(fake_openai: FakeOpenAIServer) -> None:
    # A slow local server is still working on the first request; a second copy would queue behind it.
    config = config_with("local", local=ProviderConfig(api_key="sk-local", api_base=fake_openai.base_url,
                                                       timeout=0.2))
    fake_openai.reply_text("太晚了 too late", delay=2.0)
    provider = from_config(config)
    assert (provider.max_retries, provider.retry_timeouts) == (3, False)
    error = failure(provider)
    assert error.kind == "unavailable"
    assert str(error) == "the model provider 'local' did not answer within 0.2 s"
    assert len(fake_openai.chat_requests()) == 1


def test_a_timed_out_request_is_sent_again_when_max_retries_is_in_config(fake_openai: FakeOpenAIServer) -> None:
    config = parse_config({"agents": {"defaults": {"provider": "local"}}, "providers": {"local": {
        "api_key": "sk-local", "api_base": fake_openai.base_url, "timeout": IN_TIME, "max_retries": 1}}},
        "config.json")
    fake_openai.reply_text("太晚了 too late", delay=STALL)
    fake_openai.reply_text("这次及时 in time")
    provider = from_config(config)
    assert (provider.max_retries, provider.retry_timeouts) == (1, True)
    assert chat(provider).content == "这次及时 in time"
    assert len(fake_openai.chat_requests()) == 2


@pytest.mark.parametrize("headers", [FAST_RETRY, {"retry-after": "0.005"}])
def test_500_then_success_is_retried(fake_openai: FakeOpenAIServer, headers: dict[str, str]) -> None:
    fake_openai.reply_error(500, "internal error / 内部错误", headers=headers)
    fake_openai.reply_text("好了 fine now")
    assert chat(make_provider(fake_openai, max_retries=1)).content == "好了 fine now"
    first, second = fake_openai.chat_requests()
    assert first == second


@pytest.mark.parametrize(("status", "kind"), [(400, "bad_response"), (404, "bad_response"), (422, "bad_response"),
                                              (501, "unavailable")])
def test_statuses_that_will_not_change_are_not_retried(fake_openai: FakeOpenAIServer, status: int, kind: str) -> None:
    fake_openai.reply_error(status, "will not change / 不会变", headers=FAST_RETRY)
    error = failure(make_provider(fake_openai, max_retries=3))
    assert error.kind == kind and f"HTTP {status}" in str(error)
    assert len(fake_openai.chat_requests()) == 1


def test_the_client_itself_never_retries(fake_openai: FakeOpenAIServer) -> None:
    # max_retries=0 is the provider's own count; the client underneath must not add any retries.
    fake_openai.reply_error(503, "overloaded", headers=FAST_RETRY)
    assert failure(make_provider(fake_openai, max_retries=0)).kind == "unavailable"
    assert len(fake_openai.chat_requests()) == 1
    assert make_provider(fake_openai)._client.max_retries == 0


def test_embeddings_are_retried_too(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_error(502, "bad gateway", headers=FAST_RETRY, endpoint="embeddings")
    vectors = run(make_provider(fake_openai, max_retries=1), lambda p: p.embed(["绿茶 green tea"], "m", 8))
    assert len(vectors) == 1 and len(vectors[0]) == 8
    assert len(fake_openai.embedding_requests()) == 2


# -- per-provider settings in config.json ------------------------------------------------------------


def provider_entry(**settings: Any) -> dict[str, Any]:
    return {"providers": {"llamacpp": {"api_key": "sk-local", "api_base": "http://127.0.0.1:8765/v1", **settings}}}


def test_provider_settings_parse_and_reach_the_provider() -> None:
    config = parse_config({**provider_entry(timeout=600, max_retries=0, text_tool_calls="off"),
                           "agents": {"defaults": {"provider": "llamacpp", "model": "qwen2.5-7b"}}}, "config.json")
    entry = config.providers["llamacpp"]
    assert (entry.timeout, entry.max_retries, entry.text_tool_calls) == (600.0, 0, "off")
    provider = from_config(config)
    assert (provider.timeout, provider.max_retries, provider.text_tool_calls) == (600.0, 0, "off")
    # Arguments win over the entry (the index's embedder brings its own short timeout).
    override = from_config(config, timeout=20, max_retries=1)
    assert (override.timeout, override.max_retries) == (20, 1)


def test_provider_settings_have_defaults() -> None:
    config = parse_config(provider_entry(), "config.json")
    entry = config.providers["llamacpp"]
    assert (entry.timeout, entry.max_retries, entry.text_tool_calls) == (60.0, 3, "auto")
    provider = from_config(config, "llamacpp")
    assert (provider.timeout, provider.max_retries, provider.retry_timeouts, provider.text_tool_calls) == (
        60.0, 3, False, "auto")
    assert from_config(Config(), "ollama").timeout == 60.0  # the built-in entries too


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("timeout", 0, "must be more than 0 and at most 3600 seconds (got 0)"),
    ("timeout", -5, "must be more than 0 and at most 3600 seconds (got -5)"),
    ("timeout", 3601, "must be more than 0 and at most 3600 seconds (got 3601)"),
    ("timeout", "600", "Input should be a valid number (got '600')"),
    ("max_retries", 11, "must be from 0 to 10 (got 11)"),
    ("max_retries", -1, "must be from 0 to 10 (got -1)"),
    ("max_retries", 1.5, "Input should be a valid integer (got 1.5)"),
    ("max_retries", True, "Input should be a valid integer (got True)"),
    ("text_tool_calls", "on", "Input should be 'auto' or 'off' (got 'on')"),
    ("retries", 2, "unknown key (check the spelling)"),
])
def test_bad_provider_settings_name_the_key_and_the_range(key: str, value: Any, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(provider_entry(**{key: value}), "config.json")
    assert str(caught.value) == f"config.json: providers.llamacpp.{key}: {expected}"


# -- cached prompt tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_cached_tokens_from_prompt_tokens_details(fake_openai: FakeOpenAIServer, stream: bool) -> None:
    fake_openai.reply_text("缓存命中 cache hit", usage={"prompt_tokens": 1200, "completion_tokens": 6},
                           cached_tokens=1024)
    provider = make_provider(fake_openai)
    reply = streamed(provider)[0] if stream else chat(provider)
    assert reply.usage == Usage(1200, 6, cached_tokens=1024)
    assert provider.total_usage == Usage(1200, 6, 1024)


@pytest.mark.parametrize("stream", [False, True])
def test_cached_tokens_from_deepseek(fake_openai: FakeOpenAIServer, stream: bool) -> None:
    fake_openai.reply_text("深度求索 DeepSeek", usage={"prompt_tokens": 300, "completion_tokens": 4,
                                                       "prompt_cache_hit_tokens": 256, "prompt_cache_miss_tokens": 44})
    provider = make_provider(fake_openai, name="deepseek")
    reply = streamed(provider)[0] if stream else chat(provider)
    assert reply.usage == Usage(300, 4, 256)


def test_cached_tokens_from_llama_cpp_timings(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_raw({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "qwen2.5-7b",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "本地 local"}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 3, "total_tokens": 903},
        "timings": {"cache_n": 850, "prompt_n": 50, "predicted_n": 3, "predicted_per_second": 19.7},
    })
    assert chat(make_provider(fake_openai)).usage == Usage(900, 3, 850)


def test_cached_tokens_are_none_when_not_reported(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_text("one", usage={"prompt_tokens": 10, "completion_tokens": 1}, cached_tokens=8)
    fake_openai.reply_text("two", usage={"prompt_tokens": 20, "completion_tokens": 2})
    provider = make_provider(fake_openai)

    async def two_calls(p: OpenAICompatProvider) -> list[Usage | None]:
        return [(await p.chat(HELLO)).usage for _ in range(2)]

    assert run(provider, two_calls) == [Usage(10, 1, 8), Usage(20, 2, None)]
    assert provider.total_usage == Usage(30, 3, 8)


# -- llama.cpp compatibility -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_turn_goes_back_with_empty_content(stream: bool) -> None:
    # llama.cpp's server answers 500 to `content: null` beside tool_calls; OpenAI accepts "".
    with FakeOpenAIServer(strict_content=True) as server:
        server.reply_tool_calls([("memory_append", {"content": "喜欢龙井 likes Longjing"})])
        server.reply_text("记住了 / noted")
        provider = make_provider(server, max_retries=0)

        async def sink(piece: str) -> None:
            pass

        async def turn(p: OpenAICompatProvider) -> str | None:
            messages: list[dict[str, Any]] = [{"role": "user", "content": "记住：我喜欢龙井"}]
            first = await p.chat(messages, [MEMORY_TOOL], on_text=sink if stream else None)
            assert first.content is None
            messages.append(first.as_message())
            messages += [{"role": "tool", "tool_call_id": c.id, "content": "stored"} for c in first.tool_calls]
            return (await p.chat(messages, [MEMORY_TOOL], on_text=sink if stream else None)).content

        assert run(provider, turn) == "记住了 / noted"
        assert server.chat_requests()[1]["messages"][1]["content"] == ""


def test_a_strict_content_server_refuses_null_content() -> None:
    with FakeOpenAIServer(strict_content=True) as server:
        call = {"id": "call_1", "type": "function", "function": {"name": "memory_append", "arguments": "{}"}}
        messages: list[dict[str, Any]] = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [call]},
                                          {"role": "tool", "tool_call_id": "call_1", "content": "stored"}]
        error = failure(make_provider(server, max_retries=0), messages)
        assert error.kind == "unavailable" and "HTTP 500" in str(error)


def test_a_validation_dump_from_the_server_is_one_readable_line() -> None:
    # llama-cpp-python answers an assistant message with content null by pydantic's dump of 7 errors.
    with FakeOpenAIServer(strict_content=True) as server:
        messages: list[dict[str, Any]] = [*HELLO, {"role": "assistant", "content": None},
                                          {"role": "user", "content": "还在吗？ still there?"}]
        error = failure(make_provider(server, max_retries=0), messages)
    assert str(error) == ("the model provider 'openai' is unavailable (HTTP 500): the request did not validate "
                          "(7 errors; messages.2.content: Input should be a valid string)")
    assert "{'type'" not in str(error) and "\n" not in str(error)


def test_as_message_keeps_text_and_never_gives_null() -> None:
    call = ToolCall("call_1", "memory_append", "{}")
    assert ChatReply(None, [call]).as_message()["content"] == ""
    assert ChatReply("我来记 / noting", [call]).as_message()["content"] == "我来记 / noting"
    assert ChatReply(None).as_message() == {"role": "assistant", "content": ""}
