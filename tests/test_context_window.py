"""The context window found: each server kind's way of telling it, bad answers, config against server, cloud
defaults, one probe per process, and the windows that overflow answers teach."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any

import pytest

from picoclaw.config import CLOUD_DEFAULT_WINDOW, LOCAL_DEFAULT_WINDOW, AgentDefaults
from picoclaw.hosts import is_local_host
from picoclaw.providers import ContextWindow, OpenAICompatProvider, ProviderError
from picoclaw.providers.context_window import (
    CUT_BY_THE_WINDOW,
    OLLAMA_DEFAULT_NUM_CTX,
    PROBE_DEADLINE,
    ServerWindows,
    fallback_window,
    server_root,
)
from tests.fakes.openai_server import GARBAGE, HOLD_LIMIT, FakeOpenAIServer, Raw, ServerKind

MODEL = "qwen2.5-coder-1.5b"
LOGGER = "picoclaw.providers.context_window"


def windows(server: FakeOpenAIServer | None, *, configured: int | None = None, api_base: str | None = None,
            deadline: float = PROBE_DEADLINE) -> ServerWindows:
    base = api_base if api_base is not None else (server.base_url if server else "")
    return ServerWindows(provider="local", api_base=base, api_key="sk-local", model=MODEL, configured=configured,
                         deadline=deadline)


def found(server: FakeOpenAIServer | None, **kwargs: Any) -> ContextWindow:
    return asyncio.run(windows(server, **kwargs).current())


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= level]


@pytest.fixture
def server() -> Any:
    with FakeOpenAIServer() as fake:
        fake.models = [MODEL]
        yield fake


# -- each server's way of telling it ------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "detail"), [
    ("llama.cpp", "llama.cpp /props"),
    ("vllm", "vLLM /v1/models"),
    ("ollama", "Ollama /api/show"),
    ("lm-studio", "LM Studio /api/v0/models"),
])
def test_each_server_kind_tells_its_window(server: FakeOpenAIServer, kind: ServerKind, detail: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    server.kind, server.window = kind, 4096
    caplog.set_level(logging.INFO, logger=LOGGER)
    window = found(server)
    assert (window.tokens, window.source) == (4096, "server")
    assert window.detail.startswith(detail)
    [line] = lines(caplog)
    assert "4,096" in line and detail in line


def test_llama_cpp_props_is_asked_at_the_server_root_not_under_v1(server: FakeOpenAIServer) -> None:
    server.kind, server.window = "llama.cpp", 4096
    found(server)
    paths = {r.path for r in server.requests}
    assert "/props" in paths and "/v1/props" not in paths
    assert server.requests[0].headers["authorization"] == "Bearer sk-local"


def test_ollama_is_asked_for_the_configured_model(server: FakeOpenAIServer) -> None:
    server.kind, server.window = "ollama", 4096
    found(server)
    [show] = [r for r in server.requests if r.path == "/api/show"]
    assert show.json == {"model": MODEL}


@pytest.mark.parametrize(("parameters", "context_length", "expected"), [
    ("num_ctx 4096", 32768, 4096),  # the model could hold more: num_ctx is what it runs with
    ("num_ctx 65536", 32768, 32768),  # num_ctx beyond what the model was trained for: the model's
    ('stop "<|im_end|>"', 32768, OLLAMA_DEFAULT_NUM_CTX),  # no num_ctx: Ollama's own default
    ("num_ctx 2048", None, 2048),
])
def test_ollama_the_smaller_of_model_and_num_ctx_wins(server: FakeOpenAIServer, parameters: str,
                                                      context_length: int | None, expected: int) -> None:
    info: dict[str, Any] = {"general.architecture": "qwen2"}
    if context_length is not None:
        info["qwen2.context_length"] = context_length
    server.reply_raw({"parameters": parameters, "model_info": info}, endpoint="show")
    window = found(server)
    assert (window.tokens, window.source) == (expected, "server")
    assert "Ollama /api/show" in window.detail


def test_vllm_takes_the_configured_models_entry(server: FakeOpenAIServer) -> None:
    server.reply_raw({"object": "list", "data": [
        {"id": "other-model", "max_model_len": 131072},
        {"id": MODEL, "max_model_len": 16384},
    ]}, endpoint="models")
    window = found(server)
    assert (window.tokens, window.detail) == (16384, "vLLM /v1/models")


@pytest.mark.parametrize(("entries", "expected"), [
    # Only one model served, under another name (vLLM's --served-model-name): its window is the server's.
    ([{"id": "Qwen/Qwen2.5-7B-Instruct", "max_model_len": 16384}], (16384, "server")),
    # Other models listed, ours not: none of their windows is ours, even when only one tells.
    ([{"id": "big-model", "max_model_len": 131072}, {"id": "small-model"}], (LOCAL_DEFAULT_WINDOW, "default")),
])
def test_vllm_takes_another_models_entry_only_when_it_is_the_only_one(
        server: FakeOpenAIServer, entries: list[dict[str, Any]], expected: tuple[int, str]) -> None:
    server.reply_raw({"object": "list", "data": entries}, endpoint="models")
    window = found(server)
    assert (window.tokens, window.source) == expected


def test_lm_studio_takes_the_loaded_context_not_the_maximum(server: FakeOpenAIServer) -> None:
    server.kind, server.window = "lm-studio", 6000
    window = found(server)
    assert window.tokens == 6000  # the fake's max_context_length is 32768


# -- nothing told, or told badly: the fallback, one log line, no crash -------------------------------


def test_a_server_that_tells_nothing_leaves_the_local_default_with_one_line(
        server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    window = found(server)
    assert (window.tokens, window.source) == (LOCAL_DEFAULT_WINDOW, "default")
    assert "local server" in window.detail
    [line] = lines(caplog, logging.DEBUG)
    assert "HTTP 404" in line and "8,192" in line


def _absurd_models() -> dict[str, Any]:
    return {"data": [{"id": MODEL, "max_model_len": 10 ** 12}]}


@pytest.mark.parametrize(("endpoint", "reply", "said"), [
    ("props", Raw(GARBAGE, content_type="text/html"), "not JSON (text/html)"),
    ("props", Raw({"default_generation_settings": {"n_ctx": -4096}}), "n_ctx is -4096"),
    ("props", Raw({"default_generation_settings": {"n_ctx": 10 ** 12}}), "not a believable window"),
    ("props", Raw({"default_generation_settings": {"n_ctx": "4096"}}), "not a whole number"),
    ("props", Raw({"default_generation_settings": {"n_ctx": 4096.5}}), "not a whole number"),
    ("props", Raw([1, 2, 3]), "llama.cpp /props: not reported"),
    ("props", Raw('{"default_generation_settings": {"n_ctx": 40', status=200), "not JSON"),
    ("props", Raw({"error": "internal"}, status=500), "HTTP 500"),
    ("models", Raw(_absurd_models()), "not a believable window"),
    ("models", Raw("<html>500</html>", content_type="text/html", status=502), "HTTP 502"),
    ("show", Raw({"model_info": {"qwen2.context_length": 32768}, "parameters": "num_ctx lots"}),
     "num_ctx is not a number"),
    ("show", Raw({"model_info": {"qwen2.context_length": 0}}), "qwen2.context_length is 0"),
    ("lm_models", Raw({"data": [{"id": MODEL, "loaded_context_length": -5}]}), "loaded_context_length is -5"),
    ("lm_models", Raw({"data": "模型"}), "LM Studio /api/v0/models: not reported"),
])
def test_a_bad_answer_leaves_the_fallback_with_one_line(server: FakeOpenAIServer, endpoint: Any, reply: Raw,
                                                        said: str, caplog: pytest.LogCaptureFixture) -> None:
    server.enqueue(reply, endpoint)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    window = found(server)
    assert (window.tokens, window.source) == (LOCAL_DEFAULT_WINDOW, "default")
    [line] = lines(caplog, logging.DEBUG)
    assert said in line


def test_a_server_that_never_answers_costs_the_deadline_and_no_more(
        server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    for endpoint in ("props", "show", "lm_models", "models"):
        server.enqueue(Raw("{}", delay=HOLD_LIMIT), endpoint)  # held until the server stops
    caplog.set_level(logging.INFO, logger=LOGGER)
    window = found(server, deadline=0.2)
    assert (window.tokens, window.source) == (LOCAL_DEFAULT_WINDOW, "default")
    # Each request's own timeout is longer than the deadline: the deadline, and only it, ends every way.
    assert lines(caplog) == [
        f"provider local, model {MODEL}: the context window was not reported (llama.cpp /props: no answer within "
        "0.2 s; Ollama /api/show: no answer within 0.2 s; LM Studio /api/v0/models: no answer within 0.2 s; "
        "vLLM /v1/models: no answer within 0.2 s); using 8,192 tokens (the server did not report it: 8,192 assumed "
        "for a local server)"]
    # What a process pays at its first turn, whatever the server does: at most 2 s of probing.
    assert PROBE_DEADLINE <= 2.0
    assert windows(server).deadline == PROBE_DEADLINE


@pytest.mark.parametrize(("telling", "kind", "detail"), [
    ("props", "llama.cpp", "llama.cpp /props"), ("models", "vllm", "vLLM /v1/models"),
])
def test_the_first_way_to_tell_ends_the_probe_without_waiting_for_the_others(
        server: FakeOpenAIServer, telling: str, kind: ServerKind, detail: str) -> None:
    server.kind, server.window = kind, 4096
    for endpoint in {"props", "show", "lm_models", "models"} - {telling}:
        server.enqueue(Raw("{}", delay=HOLD_LIMIT), endpoint)  # held until the server stops
    asked = windows(server, deadline=4 * HOLD_LIMIT)

    async def first() -> ContextWindow:
        window = await asyncio.wait_for(asked.current(), timeout=HOLD_LIMIT / 2)  # fails, not hangs, if it waits
        assert asyncio.all_tasks() == {asyncio.current_task()}  # the held ways were cancelled, none left behind
        return window

    window = asyncio.run(first())
    assert (window.tokens, window.source, window.detail) == (4096, "server", detail)


def test_a_caller_cancelled_during_the_probe_leaves_no_probe_behind(server: FakeOpenAIServer) -> None:
    for endpoint in ("props", "show", "lm_models", "models"):
        server.enqueue(Raw("{}", delay=HOLD_LIMIT), endpoint)
    asked = windows(server, deadline=4 * HOLD_LIMIT)

    async def cancelled() -> set[asyncio.Task[Any]]:
        probing = asyncio.ensure_future(asked.current())
        for _ in range(2000):  # until the server holds all four requests (bounded: ~10 s at most)
            if len(server.requests) == 4:
                break
            await asyncio.sleep(0.005)
        assert len(server.requests) == 4
        probing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probing
        return asyncio.all_tasks() - {asyncio.current_task()}

    assert asyncio.run(cancelled()) == set()


def test_a_client_that_cannot_be_made_leaves_the_fallback_with_one_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A SOCKS proxy in the environment without the socksio package: httpx refuses to make the client at all.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    monkeypatch.setitem(sys.modules, "socksio", None)  # not installed, whatever this machine has
    caplog.set_level(logging.INFO, logger=LOGGER)
    asked = windows(None, api_base="https://llm.example.com/v1")  # on the internet: the proxy applies
    window = asyncio.run(asked.current())
    assert (window.tokens, window.source) == (CLOUD_DEFAULT_WINDOW, "default")
    [line] = lines(caplog)
    assert "the probe could not start (ImportError" in line and "socksio" in line


def test_connection_refused_leaves_the_fallback(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    caplog.set_level(logging.INFO, logger=LOGGER)
    window = found(None, api_base=f"http://127.0.0.1:{port}/v1")
    assert (window.tokens, window.source) == (LOCAL_DEFAULT_WINDOW, "default")
    [line] = lines(caplog)
    assert "ConnectError" in line


@pytest.mark.parametrize(("api_base", "tokens", "where"), [
    ("http://gpu-box:8000/v1", LOCAL_DEFAULT_WINDOW, "a local server"),
    ("http://llama.lan:8080/v1", LOCAL_DEFAULT_WINDOW, "a local server"),
    ("https://llm.example.com/v1", CLOUD_DEFAULT_WINDOW, "llm.example.com, on the internet"),
    ("https://api.某家模型.中国/v1", CLOUD_DEFAULT_WINDOW, "on the internet"),
])
def test_a_host_that_cannot_be_looked_up_is_still_asked_and_leaves_the_fallback(
        api_base: str, tokens: int, where: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    asked = windows(None, api_base=api_base)
    window = asyncio.run(asked.current())  # the network guard fails the lookup
    assert (window.tokens, window.source) == (tokens, "default")
    assert where in window.detail
    assert asked.probes == 1  # not a known cloud API: asked, in case it is a server that tells
    [line] = lines(caplog)
    assert f"{tokens:,}" in line


# -- config.json against the server ----------------------------------------------------------------


def test_a_smaller_server_window_beats_the_configured_one_with_one_line(
        server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    server.kind, server.window = "llama.cpp", 4096
    caplog.set_level(logging.INFO, logger=LOGGER)
    window = found(server, configured=128_000)
    assert (window.tokens, window.source) == (4096, "server")
    assert "config.json's 128,000" in window.detail
    [line] = lines(caplog)
    assert "config.json says" in line and "128,000" in line and "using 4,096" in line


def test_the_configured_window_wins_over_a_larger_server_one(server: FakeOpenAIServer) -> None:
    server.kind, server.window = "vllm", 32768
    window = found(server, configured=8000)
    assert (window.tokens, window.source) == (8000, "config")


def test_the_configured_window_stands_when_the_server_tells_nothing(
        server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    window = found(server, configured=16000)
    assert (window.tokens, window.source) == (16000, "config")
    assert lines(caplog) == []  # nothing to tell the user: they said the number


# -- cloud hosts and local ones --------------------------------------------------------------------


@pytest.mark.parametrize("api_base", [
    "https://api.openai.com/v1", "https://api.deepseek.com/v1", "https://openrouter.ai/api/v1",
    "https://dashscope.aliyuncs.com/compatible-mode/v1", "https://my-resource.openai.azure.com/openai/v1",
    "https://my-resource.cognitiveservices.azure.com/openai/v1", "https://my-project.services.ai.azure.com/models",
    "https://bedrock-runtime.us-east-1.amazonaws.com/openai/v1", "https://router.huggingface.co/v1",
    "https://models.github.ai/inference", "https://qianfan.baidubce.com/v2", "https://hunyuan.tencentcloudapi.com",
    "https://api.stepfun.com/v1", "https://api.z.ai/api/paas/v4", "https://open.bigmodel.cn/api/paas/v4",
    "https://api.moonshot.cn/v1", "https://api.moonshot.ai/v1", "https://API.OpenAI.com./v1",
])
def test_a_known_cloud_api_is_not_asked_and_gets_128000(api_base: str) -> None:
    asked = windows(None, api_base=api_base)
    window = asyncio.run(asked.current())  # the network guard would fail any request
    assert (window.tokens, window.source) == (CLOUD_DEFAULT_WINDOW, "default")
    assert "cloud API" in window.detail
    assert asked.probes == 0


@pytest.mark.parametrize("api_base", ["http://ec2-3-80-1-2.compute-1.amazonaws.com:8000/v1",
                                      "http://vllm-123.us-west-2.elb.amazonaws.com/v1", "https://notopenai.com/v1"])
def test_a_server_on_a_clouds_rented_machine_is_asked(api_base: str) -> None:
    asked = windows(None, api_base=api_base)
    window = asyncio.run(asked.current())
    assert asked.probes == 1
    assert (window.tokens, window.source) == (CLOUD_DEFAULT_WINDOW, "default")  # a name on the internet


def test_a_cloud_api_with_a_configured_window_uses_it() -> None:
    window = found(None, api_base="https://api.openai.com/v1", configured=32000)
    assert (window.tokens, window.source) == (32000, "config")


@pytest.mark.parametrize(("api_base", "tokens", "local"), [
    *[(url, LOCAL_DEFAULT_WINDOW, True) for url in (
        "http://localhost:11434/v1", "http://127.0.0.1:8080/v1", "http://[::1]:8000/v1", "http://192.168.1.20:1234/v1",
        "http://10.0.0.5:8000/v1", "http://172.16.3.4/v1", "http://100.101.102.103:8080/v1", "http://gpu-box:8000/v1",
        "http://llama.local:8080/v1")],
    ("http://8.8.8.8:8000/v1", LOCAL_DEFAULT_WINDOW, False),  # a bare address: a machine someone runs a server on
    ("https://llm.example.com/v1", CLOUD_DEFAULT_WINDOW, False),  # a name on the internet: a hosted API, likely
])
def test_the_fallback_is_small_on_the_local_network_and_large_on_the_internet(api_base: str, tokens: int,
                                                                              local: bool) -> None:
    assert is_local_host(api_base) is local
    window = fallback_window(api_base)
    assert (window.tokens, window.source) == (tokens, "default")
    assert ("local server" in window.detail) is local


@pytest.mark.parametrize(("api_base", "root"), [
    ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"), ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080"),
    ("http://host/llama/v1", "http://host/llama"), ("http://host:1234", "http://host:1234"),
])
def test_server_root_drops_the_v1(api_base: str, root: str) -> None:
    assert server_root(api_base) == root


# -- once per process --------------------------------------------------------------------------------


def test_concurrent_first_callers_share_one_probe(server: FakeOpenAIServer) -> None:
    server.kind, server.window = "llama.cpp", 4096
    server.enqueue(Raw({"default_generation_settings": {"n_ctx": 4096}}, delay=0.05), "props")
    asked = windows(server)

    async def many() -> list[ContextWindow]:
        return await asyncio.gather(*(asked.current() for _ in range(8)))

    results = asyncio.run(many())
    assert {w.tokens for w in results} == {4096}
    assert asked.probes == 1
    assert [r.path for r in server.requests].count("/props") == 1
    before = len(server.requests)
    assert asyncio.run(asked.current()).tokens == 4096  # kept: the server is not asked again
    assert len(server.requests) == before


# -- overflow answers teach the window ---------------------------------------------------------------


def test_learn_lowers_the_window_for_the_rest_of_the_process(server: FakeOpenAIServer) -> None:
    server.kind, server.window = "llama.cpp", 8192
    asked = windows(server)
    assert asyncio.run(asked.current()).tokens == 8192
    learnt = asked.learn(4096)
    assert (learnt.tokens, learnt.source) == (4096, "overflow")
    assert asked.learn(6000).tokens == 4096  # never raised by a later answer
    assert asked.learn(-1).tokens == 4096  # nor by nonsense
    assert asyncio.run(asked.current()) == learnt
    assert asked.probes == 1


def test_learn_before_any_probe_is_kept() -> None:
    asked = windows(None, api_base="http://127.0.0.1:9/v1")
    asked.learn(2048)
    assert asyncio.run(asked.current()).tokens == 2048  # no probe: the overflow already said it
    assert asked.probes == 0


@pytest.mark.parametrize(("configured", "learnt", "expected"), [
    (4096, 8192, (4096, "config")),  # the overflow says the server holds more: config.json's number still wins
    (8192, 4096, (4096, "overflow")),
    (None, 4096, (4096, "overflow")),
])
def test_learn_before_any_probe_does_not_beat_a_smaller_configured_window(
        configured: int | None, learnt: int, expected: tuple[int, str]) -> None:
    asked = windows(None, api_base="http://127.0.0.1:9/v1", configured=configured)
    assert (asked.learn(learnt).tokens, asked.learn(learnt).source) == expected
    window = asyncio.run(asked.current())
    assert (window.tokens, window.source) == expected
    assert asked.probes == 0  # the overflow was the server's own word: nothing left to ask


@pytest.mark.parametrize("style", ["llama.cpp", "llama-cpp-python"])
@pytest.mark.parametrize("probed_first", [False, True], ids=["before the probe", "after the probe"])
def test_any_call_that_overflows_teaches_the_providers_window(style: Any, probed_first: bool) -> None:
    """A summary or the memory flush meets the overflow as well as a turn does: the provider teaches the window
    it handed out, whoever called."""
    with FakeOpenAIServer(kind="none", window=400, overflow=style) as server:
        async def summarise() -> tuple[ContextWindow, ContextWindow, int]:
            async with OpenAICompatProvider(name="local", api_base=server.base_url, api_key="sk-local",
                                            defaults=AgentDefaults(model=MODEL), max_retries=0) as provider:
                asked = provider.context_windows(None)
                before = await asked.current() if probed_first else None
                with pytest.raises(ProviderError):
                    await provider.chat([{"role": "user", "content": "把下面的对话总结一下。Summarise: " + "话" * 600}])
                after = await asked.current()
                return before or after, after, asked.probes

        before, after, probes = asyncio.run(summarise())
    assert (after.tokens, after.source) == (400, "overflow")
    assert before.tokens == (LOCAL_DEFAULT_WINDOW if probed_first else 400)
    assert probes == (1 if probed_first else 0)


def test_an_absurd_window_in_an_overflow_answer_is_not_learnt() -> None:
    with FakeOpenAIServer() as server:
        server.reply_error(400, "This model's maximum context length is 99999999999 tokens.",
                           code="context_length_exceeded")

        async def ask() -> ContextWindow:
            async with OpenAICompatProvider(name="local", api_base=server.base_url, api_key="sk-local",
                                            defaults=AgentDefaults(model=MODEL), max_retries=0) as provider:
                asked = provider.context_windows(16000)
                with pytest.raises(ProviderError) as info:
                    await provider.chat([{"role": "user", "content": "hello 你好"}])
                assert (info.value.kind, info.value.window) == ("context_too_long", None)
                return await asked.current()

        window = asyncio.run(ask())
    assert (window.tokens, window.source) == (16000, "config")


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("style", ["llama.cpp", "llama-cpp-python"])
@pytest.mark.parametrize("text", ["The weather report for tomorrow, in detail. " * 40,
                                  "明天的天气预报，非常详细。" * 40])
def test_an_overflow_answer_is_sorted_with_its_window(style: Any, text: str, streamed: bool) -> None:
    pieces: list[str] = []

    async def sink(piece: str) -> None:
        pieces.append(piece)

    with FakeOpenAIServer(window=400, overflow=style) as server:
        async def ask() -> None:
            async with OpenAICompatProvider(name="local", api_base=server.base_url, api_key="sk-local",
                                            defaults=AgentDefaults(model=MODEL), max_retries=0) as provider:
                await provider.chat([{"role": "user", "content": text}], on_text=sink if streamed else None)

        with pytest.raises(ProviderError) as info:
            asyncio.run(ask())
        assert info.value.kind == "context_too_long"
        assert info.value.window == 400
        assert server.prompt_counts[0] > 400
        assert len(server.chat_requests()) == 1 and pieces == []  # not retried, nor asked again without streaming


@pytest.mark.parametrize(("message", "code", "window"), [
    # OpenAI's wording, which llama-cpp-python's server, vLLM and DeepSeek send as well.
    ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (5000 in the "
     "messages, None in the completion). Please reduce the length of the messages or completion.",
     "context_length_exceeded", 4096),
    ("This model's maximum context length is 32768 tokens. However, you requested 33000 tokens in the messages, "
     "Please reduce the length of the messages.", None, 32768),
    ("This model's maximum context length is 65536 tokens. However, you requested 70000 tokens (70000 in the "
     "messages, 0 in the completion). Please reduce the length of the messages or completion.",
     "invalid_request_error", 65536),
    # llama-cpp-python's library text, passed through by a server that wraps it differently.
    ("Requested tokens (5000) exceed context window of 4096", None, 4096),
    ("prompt is too long: 提示太长了", None, None),  # too long, but no window named
])
def test_each_overflow_wording_names_its_window(message: str, code: str | None, window: int | None) -> None:
    with FakeOpenAIServer() as server:
        server.reply_error(400, message, code=code)

        async def ask() -> None:
            async with OpenAICompatProvider(name="cloud", api_base=server.base_url, api_key="sk-local",
                                            defaults=AgentDefaults(model=MODEL), max_retries=0) as provider:
                await provider.chat([{"role": "user", "content": "你好, hello"}])

        with pytest.raises(ProviderError) as info:
            asyncio.run(ask())
    assert (info.value.kind, info.value.window) == ("context_too_long", window)


# -- a reply cut short where the context was full teaches the window -----------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize(("finish", "prompt", "completion", "guessed", "learnt"), [
    ("length", 4095, 1, True, 4096),  # llama-cpp-python lowered max_tokens to what the prompt left: one token
    ("length", 3096, 1000, True, None),  # cut at the max_tokens asked for: no word about the window
    ("stop", 4095, 1, True, None),  # a short answer that simply ended
    ("length", 1500, 512, True, None),  # a server's own cap on output (llama.cpp --n-predict 512): no window size
    ("length", 4095, 1, False, None),  # the window was configured (or reported): not second-guessed
])
def test_a_reply_cut_short_by_the_servers_context_teaches_its_window(
        streamed: bool, finish: str, prompt: int, completion: int, guessed: bool, learnt: int | None) -> None:
    """Seen from llama-cpp-python (--n_ctx 4096, which reports no window): a Chinese question after a long history
    was answered "Your", one token, where the prompt filled the context and the server cut max_tokens without a
    word; picoclaw still assumed the local default of 8,192."""
    async def sink(piece: str) -> None:
        pass

    with FakeOpenAIServer() as server:
        server.reply_text("Your", finish_reason=finish,
                          usage={"prompt_tokens": prompt, "completion_tokens": completion})

        async def ask() -> ContextWindow:
            async with OpenAICompatProvider(name="local", api_base=server.base_url, api_key="sk-local",
                                            defaults=AgentDefaults(model=MODEL, max_tokens=1000),
                                            max_retries=0) as provider:
                found = provider.context_windows(None if guessed else 8192)
                assert (await found.current()).source == ("default" if guessed else "config")  # nothing reported
                await provider.chat([{"role": "user", "content": "我女儿对什么过敏？"}],
                                    on_text=sink if streamed else None)
                return await found.current()

        window = asyncio.run(ask())
    assert window.tokens == (learnt or 8192)
    if learnt is not None:
        assert (window.source, window.detail) == ("overflow", CUT_BY_THE_WINDOW)
