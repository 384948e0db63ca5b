"""OpenAICompatProvider against a real local OpenAI-compatible server, through the real `openai` client."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from picoclaw.config import AgentDefaults, Config, ProviderConfig
from picoclaw.errors import ConfigError
from picoclaw.providers.base import ProviderError, ToolCall, Usage
from picoclaw.providers.openai_compat import OpenAICompatProvider, from_config
from tests.fakes import FakeOpenAIServer

KEY = "sk-test-0123456789abcdef"
# The client honours retry-after-ms (up to 2 minutes), so scripted failures cost milliseconds, not the
# 0.5 s, 1 s, 2 s … of its own backoff.
FAST_RETRY = {"retry-after-ms": "5"}
HELLO = [{"role": "user", "content": "hello"}]
MEMORY_TOOL = {"type": "function", "function": {
    "name": "memory_append", "description": "Store a fact in long-term memory.",
    "parameters": {"type": "object", "properties": {"content": {"type": "string"}, "slot": {"type": "string"}},
                   "required": ["content"]}}}

T = TypeVar("T")


def make_provider(server: FakeOpenAIServer, *, timeout: float = 5.0, max_retries: int = 2,
                  name: str = "openai", api_key: str = KEY, **defaults: Any) -> OpenAICompatProvider:
    return OpenAICompatProvider(name=name, api_base=server.base_url, api_key=api_key,
                                defaults=AgentDefaults(**defaults), timeout=timeout, max_retries=max_retries)


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


def test_429_with_retry_after_ms_is_retried(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_error(429, "Rate limit reached for requests", headers=FAST_RETRY)
    fake_openai.reply_text("after the wait")
    started = time.monotonic()
    assert chat(make_provider(fake_openai)).content == "after the wait"
    assert len(fake_openai.chat_requests()) == 2
    assert time.monotonic() - started < 0.4  # the 5 ms hint was used, not the 0.5 s default backoff


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
    fake_openai.reply_text("too late", delay=1.0)
    started = time.monotonic()
    error = failure(make_provider(fake_openai, timeout=0.2, max_retries=0))
    assert error.kind == "unavailable"
    assert str(error) == "the model provider 'openai' did not answer within 0.2 s"
    assert time.monotonic() - started < 0.9


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
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, timeout=0.2, max_retries=0)
    server.reply_text("同步 sync")
    assert client.chat.completions.create(model="m", messages=HELLO).choices[0].message.content == "同步 sync"
    server.reply_text("never seen", delay=30)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="m", messages=HELLO)
    client.close()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2
