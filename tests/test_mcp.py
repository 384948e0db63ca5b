"""MCP servers' tools (tools.mcp): config checks, and a real MCP server written with the official SDK
(tests/fakes/mcp_server.py) run over stdio and over streamable HTTP on 127.0.0.1, driven through the real
AgentLoop and the fake model: tools listed, calls and their results, failures contained, `mcp list`, /status."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from picoclaw.agent.slash_commands import Command
from picoclaw.app import App
from picoclaw.cli import main
from picoclaw.config import McpServerConfig, load_config, parse_config
from picoclaw.errors import ConfigError
from picoclaw.tools.base import ToolError
from picoclaw.tools.mcp import MIN_START_TIMEOUT, McpServer
from tests.agent_helpers import API_KEY, history, make_provider
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config
from tests.waiting import wait_until, wait_until_sync

T = TypeVar("T")

SERVER_SCRIPT = Path(__file__).parent / "fakes" / "mcp_server.py"
SERVER_TOOLS = ["add", "block", "crash", "echo", "fail", "fail_env", "picture", "pid", "queued", "release",
                "stubborn", "through_gateway"]  # what the fake server offers
SESSION = "cli:mcp"
HTTP_HEADER = ("X-Token", "s3cret-token")  # the HTTP server refuses requests without it
HTTP_SERVER = [sys.executable, str(SERVER_SCRIPT), "--http", "--header", "=".join(HTTP_HEADER)]
HTTP_START_TIMEOUT = 120.0  # seconds for the HTTP server to say its port: bounds a hang (a busy machine imports slowly)


def stdio(**settings: Any) -> dict[str, Any]:
    """A tools.mcp.servers entry that runs the fake server over stdio."""
    return {"command": [sys.executable, str(SERVER_SCRIPT)], **settings}


def configure(home: Path, servers: dict[str, Any], fake_openai: FakeOpenAIServer | None = None) -> None:
    """Write `servers` into config.json's tools.mcp (and point the provider at the fake model)."""
    with edit_config(home) as config:
        config.setdefault("tools", {})["mcp"] = {"servers": servers}
        if fake_openai is not None:
            config["providers"]["openai"] = {"api_key": API_KEY, "api_base": fake_openai.base_url}


def learning_off(home: Path) -> None:
    """No lesson reviews after a turn: the test scripts every model reply in order, and a review would take one."""
    with edit_config(home) as config:
        config["memory"]["learning_enabled"] = False


def with_app(home: Path, fake_openai: FakeOpenAIServer | None, body: Callable[[App], Awaitable[T]]) -> T:
    """Run `body(app)` with the MCP servers started the way chat and the bot start them, then close the app."""
    async def run() -> T:
        app = App(load_config(home), home, make_provider=lambda config: make_provider(app.workspace, fake_openai))
        async with app:
            await app.start_mcp()
            return await body(app)
    return asyncio.run(run())


def tool_names(app: App) -> list[str]:
    return [schema["function"]["name"] for schema in app.agent().tools.schemas()]


def mcp_names(app: App) -> list[str]:
    return [name for name in tool_names(app) if name.startswith("mcp__")]


def tool_results(body: dict[str, Any]) -> list[str]:
    """The tool results at the end of a request, in call order."""
    results = []
    for message in reversed(history(body)):
        if message["role"] != "tool":
            break
        results.insert(0, message["content"])
    return results


async def server_of(app: App, name: str) -> McpServer:
    servers = await app.start_mcp()  # started already: the same servers again
    return next(server for server in servers.servers if server.name == name)


async def kill_server(server: McpServer) -> None:
    """End a stdio server's process at once, between calls, as a crash or the OOM killer would."""
    pid = next(tool for tool in server.tools if tool.remote_name == "pid")
    os.kill(int(await server.call(pid, {})), signal.SIGKILL)


def start_http_server(command: list[str], timeout: float = HTTP_START_TIMEOUT) -> tuple[subprocess.Popen[str], str]:
    """Start an HTTP MCP server and return it with its URL, once it has printed `PORT <n>`; a server that does
    not say so within `timeout` seconds is ended and fails the test, instead of hanging the run."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, encoding="utf-8")
    stdout = process.stdout
    assert stdout is not None
    lines: list[str] = []
    # readline() has no timeout: a thread reads, the test waits for it on a deadline.
    threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True).start()
    try:
        wait_until_sync(lambda: lines or process.poll() is not None, timeout=timeout,
                        what="the HTTP MCP server's PORT line")
        wait_until_sync(lambda: lines, timeout=30, what="the output of the HTTP MCP server that ended")
        assert lines[0].startswith("PORT "), f"the HTTP MCP server did not start: {lines[0]!r}"
    except BaseException:
        end_process(process)
        raise
    return process, f"http://127.0.0.1:{int(lines[0].split()[1])}/mcp"


def end_process(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -- config ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("entry", "expected"), [
    ({"command": ["x"], "url": "http://127.0.0.1:1/mcp"}, "give exactly one of \"command\""),
    ({"enabled": True}, "give exactly one of \"command\""),
    ({"command": []}, "command"),
    ({"command": [" "]}, "the first item must name the program"),
    ({"url": "127.0.0.1:8080/mcp"}, "must start with http:// or https://"),
    ({"command": ["x"], "headers": {"A": "b"}}, "\"headers\" applies to a \"url\" server only"),
    ({"url": "http://127.0.0.1:1/mcp", "env": {"A": "b"}}, "\"env\" applies to a \"command\" server only"),
    ({"command": ["x"], "timeout": 0}, "timeout"),
    ({"url": "http://127.0.0.1:1/mcp", "headers": {"X-Token": "令牌"}}, "must be ASCII"),
    ({"command": ["x"], "args": ["y"]}, "args"),  # unknown keys stay an error
])
def test_a_bad_server_entry_is_a_clear_config_error(entry: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"tools": {"mcp": {"servers": {"files": entry}}}}, "config.json")
    assert "tools.mcp.servers.files" in str(caught.value) and expected in str(caught.value), str(caught.value)


@pytest.mark.parametrize("name", ["my files", "a.b", "", "x" * 33, "文件"])
def test_a_server_name_that_cannot_be_part_of_a_tool_name_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="letters, digits"):
        parse_config({"tools": {"mcp": {"servers": {name: {"command": ["x"]}}}}}, "config.json")


@pytest.mark.parametrize("name", ["a__b", "files_", "__x"])
def test_a_server_name_that_could_give_two_tools_one_name_is_refused(name: str) -> None:
    # Server a's tool b__c and server a__b's tool c would both be mcp__a__b__c (and a_'s _c, a's __c alike).
    with pytest.raises(ConfigError) as caught:
        parse_config({"tools": {"mcp": {"servers": {"a": {"command": ["x"]}, name: {"command": ["y"]}}}}},
                     "config.json")
    message = str(caught.value)
    assert "tools.mcp.servers" in message and f"server name {name!r}" in message, message
    assert "must not contain '__' or end with '_'" in message, message


def test_a_good_entry_has_the_documented_defaults() -> None:
    config = parse_config({"tools": {"mcp": {"servers": {"web-1": {"url": "https://example.com/mcp"}}}}}, "c.json")
    server = config.tools.mcp.servers["web-1"]
    assert (server.enabled, server.tools, server.timeout, server.headers) == (True, None, 30.0, {})


# -- stdio: listing and calling ----------------------------------------------------------------------------


@pytest.mark.slow
def test_tools_are_listed_sorted_with_the_servers_schema(home: Path) -> None:
    configure(home, {"files": stdio()})

    async def body(app: App) -> tuple[list[str], list[str], dict[str, Any], bool]:
        schemas = app.agent().tools.schemas()
        echo = next(s for s in schemas if s["function"]["name"] == "mcp__files__echo")
        # A per-user agent gets the same MCP tools, and the list is built once (the prompt prefix stays put).
        return (tool_names(app), [s["function"]["name"] for s in app.agent("42").tools.schemas()], echo,
                schemas is app.agent().tools.schemas())

    names, per_user, echo, same = with_app(home, None, body)

    assert names[:2] == ["memory_search", "memory_append"]  # the built-in tools first, as before
    assert [n for n in names if n.startswith("mcp__")] == [f"mcp__files__{tool}" for tool in SERVER_TOOLS]
    assert per_user == names and same
    assert echo["function"]["description"] == "Say the text back, `times` times."
    parameters = echo["function"]["parameters"]
    assert parameters["properties"]["text"]["type"] == "string"
    assert parameters["properties"]["times"] == {"default": 1, "title": "Times", "type": "integer"}
    assert parameters["required"] == ["text"]


@pytest.mark.slow
def test_a_call_through_the_model_reaches_the_server_and_its_result_the_next_request(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, {"files": stdio()})
    fake_openai.reply_tool_calls([("mcp__files__echo", {"text": "你好，世界", "times": 2}),
                                  ("mcp__files__picture", {"caption": "一只猫"}),
                                  ("mcp__files__fail", {"reason": "磁盘已满"}),
                                  ("mcp__files__add", {"a": "not a number", "b": 2})])
    fake_openai.reply_text("完成了。")

    async def body(app: App) -> str:
        return (await app.agent().handle(SESSION, "说两遍你好")).text

    assert with_app(home, fake_openai, body) == "完成了。"
    first, second = fake_openai.chat_requests()
    assert "mcp__files__echo" in [tool["function"]["name"] for tool in first["tools"]]
    echo, picture, fail, add = tool_results(second)
    assert echo == "你好，世界 你好，世界"
    assert picture == "一只猫\n[image content not shown]"
    assert fail.startswith("error: ") and "磁盘已满" in fail  # isError: an error the model sees
    assert add.startswith("error: ") and "validation error" in add  # the server checks its own schema


@pytest.mark.slow
def test_a_server_that_exits_mid_session_gives_tool_errors_and_the_turn_completes(
        home: Path, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    configure(home, {"files": stdio()})
    learning_off(home)
    fake_openai.reply_tool_calls([("mcp__files__crash", {})])
    fake_openai.reply_tool_calls([("mcp__files__echo", {"text": "still there?"}), ("list_dir", {"path": "."})])
    fake_openai.reply_text("The file server is gone; the rest works.")
    fake_openai.reply_text("Second turn fine.")

    async def body(app: App) -> tuple[list[str], str]:
        agent = app.agent()
        replies = [(await agent.handle(SESSION, "crash it")).text, (await agent.handle(SESSION, "and now?")).text]
        return replies, await agent.command(SESSION, Command("/status", ""))

    with caplog.at_level(logging.WARNING, logger="picoclaw.tools.mcp"):
        replies, status = with_app(home, fake_openai, body)

    assert replies == ["The file server is gone; the rest works.", "Second turn fine."]
    _, second, third, _ = fake_openai.chat_requests()
    [crash] = tool_results(second)
    assert crash.startswith("error: MCP server files stopped during the call")
    echo, listing = tool_results(third)
    assert echo.startswith("error: MCP server files is not available (failed: the server closed the connection")
    assert not listing.startswith("error")  # the built-in tools keep working
    assert "MCP files: failed: the server closed the connection" in status
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failures == ["MCP server files failed: the server closed the connection (it exited; its own output "
                        "may say why)"]


@pytest.mark.slow
def test_a_server_that_dies_between_calls_is_failed_at_once_without_a_call(
        home: Path, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    configure(home, {"files": stdio()})
    fake_openai.reply_tool_calls([("mcp__files__echo", {"text": "still there?"})])
    fake_openai.reply_text("The file server is gone.")
    closed = "the server closed the connection (it exited; its own output may say why)"

    async def body(app: App) -> tuple[str, str]:
        server = await server_of(app, "files")
        await kill_server(server)
        # Nothing calls it: the end of its stdout alone must make it failed, well before any call.
        await wait_until(lambda: server.state == "failed", what="the idle server's death to be noticed")
        agent = app.agent()
        return await agent.command(SESSION, Command("/status", "")), (await agent.handle(SESSION, "echo")).text

    with caplog.at_level(logging.WARNING, logger="picoclaw.tools.mcp"):
        status, reply = with_app(home, fake_openai, body)

    assert f"MCP files: failed: {closed}" in status.splitlines()
    assert reply == "The file server is gone."
    assert tool_results(fake_openai.chat_requests()[1]) == [
        f"error: MCP server files is not available (failed: {closed}); mcp__files__echo cannot run now"]
    assert [r.getMessage() for r in caplog.records] == [f"MCP server files failed: {closed}"]


@pytest.mark.slow
def test_a_server_that_never_starts_is_one_log_line_and_the_others_work(
        home: Path, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    configure(home, {"broken": {"command": [str(home / "no-such-server"), "--stdio"]}, "files": stdio()})
    fake_openai.reply_tool_calls([("mcp__files__add", {"a": 2, "b": 3}), ("memory_search", {"query": "tea"})])
    fake_openai.reply_text("5")

    async def body(app: App) -> tuple[list[str], str, str]:
        agent = app.agent()
        return mcp_names(app), (await agent.handle(SESSION, "2+3?")).text, await agent.command(
            SESSION, Command("/status", ""))

    with caplog.at_level(logging.WARNING, logger="picoclaw.tools.mcp"):
        names, reply, status = with_app(home, fake_openai, body)

    assert reply == "5"
    assert names == [f"mcp__files__{tool}" for tool in SERVER_TOOLS]
    add, search = tool_results(fake_openai.chat_requests()[1])
    assert add == "5" and not search.startswith("error")
    assert [r.getMessage() for r in caplog.records] == [
        f"MCP server broken failed: cannot run '{home / 'no-such-server'}': program not found"]
    assert f"MCP broken: failed: cannot run '{home / 'no-such-server'}': program not found" in status.splitlines()
    assert f"MCP files: ready, {len(SERVER_TOOLS)} tools" in status.splitlines()


@pytest.mark.slow
def test_a_server_that_does_not_answer_at_start_times_out(caplog: pytest.LogCaptureFixture) -> None:
    # A program that reads nothing and says nothing: the handshake never completes. (A start-up limit this
    # short is for the test: from config.json a server gets at least MIN_START_TIMEOUT.)
    config = McpServerConfig(command=[sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)

    async def run() -> tuple[list[str], str]:
        server = McpServer("mute", config, start_timeout=0.5)
        try:
            await server.start()
            return [tool.name for tool in server.tools], server.status()
        finally:
            await server.stop()

    with caplog.at_level(logging.WARNING, logger="picoclaw.tools.mcp"):
        names, status = asyncio.run(run())

    assert names == [] and status == "failed: no answer within 0.5 s while starting"
    assert [r.getMessage() for r in caplog.records] == ["MCP server mute failed: no answer within 0.5 s while starting"]


@pytest.mark.slow
def test_a_short_call_timeout_leaves_the_server_its_start_up_time(caplog: pytest.LogCaptureFixture) -> None:
    # The server reads nothing for 1.5 s, longer than its calls may take: it still starts, and its calls keep
    # their own limit (`block` never answers by itself).
    config = McpServerConfig(command=[sys.executable, str(SERVER_SCRIPT), "--start-delay", "1.5"],
                             tools=["block"], timeout=0.5)

    async def run() -> tuple[float, str, str]:
        server = McpServer("slow", config)
        try:
            await server.start()
            status = server.status()
            with pytest.raises(ToolError) as caught:
                await server.call(server.tools[0], {})
            return server.start_timeout, status, str(caught.value)
        finally:
            await server.stop()

    with caplog.at_level(logging.WARNING, logger="picoclaw.tools.mcp"):
        start_timeout, status, error = asyncio.run(run())

    assert (start_timeout, status) == (MIN_START_TIMEOUT, "ready, 1 tool")
    assert error == "mcp__slow__block timed out after 0.5 s; the call was cancelled (the server was asked to stop it)"
    assert [r.getMessage() for r in caplog.records] == ["MCP server slow: block timed out after 0.5 s; the call was "
                                                        "cancelled"]


@pytest.mark.parametrize(("timeout", "expected"), [(0.5, MIN_START_TIMEOUT), (MIN_START_TIMEOUT, MIN_START_TIMEOUT),
                                                   (600.0, 600.0)])
def test_the_start_up_limit_is_the_timeout_but_never_less_than_the_minimum(timeout: float, expected: float) -> None:
    assert McpServer("x", McpServerConfig(command=["x"], timeout=timeout)).start_timeout == expected


CANCELLED = "timed out after 1 s; the call was cancelled (the server was asked to stop it)"


@pytest.mark.slow
def test_a_call_that_times_out_is_cancelled_and_the_next_call_finds_the_server_free(
        home: Path, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    # `block` holds the server's one worker until it is cancelled; `queued` needs that worker.
    configure(home, {"files": stdio(tools=["block", "queued"], timeout=1)})
    learning_off(home)
    fake_openai.reply_tool_calls([("mcp__files__block", {})])
    fake_openai.reply_tool_calls([("mcp__files__queued", {"text": "还在吗 still there?"})])
    fake_openai.reply_text("ok")

    async def body(app: App) -> str:
        return (await app.agent().handle(SESSION, "block, then ask again")).text

    with caplog.at_level(logging.WARNING, logger="picoclaw.tools.mcp"):
        assert with_app(home, fake_openai, body) == "ok"
    _, second, third = fake_openai.chat_requests()
    assert tool_results(second) == [f"error: mcp__files__block {CANCELLED}"]
    assert tool_results(third) == ["还在吗 still there? (cancelled before: block)"]  # the worker was let go
    assert [r.getMessage() for r in caplog.records] == [
        "MCP server files: block timed out after 1 s; the call was cancelled"]


@pytest.mark.slow
def test_a_server_that_ignores_cancellation_is_named_as_the_likely_cause_of_the_next_timeout() -> None:
    config = McpServerConfig(command=[sys.executable, str(SERVER_SCRIPT)], tools=["stubborn", "queued", "release"],
                             timeout=1)

    async def run() -> list[str]:
        server = McpServer("files", config)
        await server.start()
        tools = {tool.remote_name: tool for tool in server.tools}
        said = []
        try:
            for name, arguments in [("stubborn", {}), ("queued", {"text": "一"}), ("release", {}),
                                    ("queued", {"text": "二 two"})]:
                try:
                    said.append(await server.call(tools[name], arguments))
                except ToolError as exc:
                    said.append(f"error: {exc}")
        finally:
            await server.stop()
        return said

    stubborn, first, release, second = asyncio.run(run())
    assert stubborn == f"error: mcp__files__stubborn {CANCELLED}"
    assert first == (f"error: mcp__files__queued {CANCELLED}; the server may still be busy with mcp__files__stubborn, "
                     "which timed out before it (the server may not stop cancelled calls)")
    assert (release, second) == ("released", "二 two (cancelled before: none)")


@pytest.mark.slow
def test_an_allow_list_registers_only_the_listed_tools(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    configure(home, {"files": stdio(tools=["echo", "add", "rm"])})

    async def body(app: App) -> tuple[list[str], str]:
        return mcp_names(app), (await server_of(app, "files")).status()

    with caplog.at_level(logging.WARNING, logger="picoclaw.tools.mcp"):
        names, status = with_app(home, None, body)

    assert names == ["mcp__files__add", "mcp__files__echo"]
    # A listed tool the server lacks is said, not silently ignored.
    assert status == "ready, 2 tools (not offered by the server: rm)"
    assert [r.getMessage() for r in caplog.records] == [
        "MCP server files: tools in its allow-list that it does not offer: rm"]


def test_a_disabled_server_is_not_started(home: Path) -> None:
    configure(home, {"files": stdio(enabled=False)})

    async def body(app: App) -> tuple[list[str], str]:
        return mcp_names(app), await app.agent().command(SESSION, Command("/status", ""))

    names, status = with_app(home, None, body)
    assert names == [] and "MCP files: disabled" in status.splitlines()


def test_an_agent_without_its_configured_mcp_servers_is_refused(home: Path) -> None:
    configure(home, {"files": stdio()})
    app = App.open(home)
    try:
        with pytest.raises(RuntimeError, match="start_mcp"):
            app.agent()
    finally:
        app.close()


# -- streamable HTTP ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The fake server over streamable HTTP on 127.0.0.1 (a free port it binds itself), once per module."""
    process, url = start_http_server(HTTP_SERVER)
    try:
        yield url
    finally:
        end_process(process)


@pytest.mark.slow
def test_an_http_server_that_never_says_its_port_fails_the_test_in_time() -> None:
    mute = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(AssertionError, match="timed out after 0.5 s waiting for the HTTP MCP server's PORT line"):
        start_http_server(mute, timeout=0.5)


@pytest.mark.slow
def test_a_streamable_http_server_with_headers_works_like_a_stdio_one(
        home: Path, fake_openai: FakeOpenAIServer, http_url: str, caplog: pytest.LogCaptureFixture) -> None:
    configure(home, {"remote": {"url": http_url, "headers": dict([HTTP_HEADER]), "tools": ["echo", "picture"]},
                     "nokey": {"url": http_url},
                     "wrongpath": {"url": http_url.removesuffix("/mcp") + "/nope", "headers": dict([HTTP_HEADER])}})
    fake_openai.reply_tool_calls([("mcp__remote__echo", {"text": "远程 echo"}),
                                  ("mcp__remote__picture", {"caption": "图"})])
    fake_openai.reply_text("done")

    async def body(app: App) -> tuple[list[str], str, str]:
        agent = app.agent()
        return mcp_names(app), (await agent.handle(SESSION, "echo remotely")).text, await agent.command(
            SESSION, Command("/status", ""))

    with caplog.at_level(logging.WARNING, logger="picoclaw.tools.mcp"):
        names, reply, status = with_app(home, fake_openai, body)

    assert names == ["mcp__remote__echo", "mcp__remote__picture"] and reply == "done"
    assert tool_results(fake_openai.chat_requests()[1]) == ["远程 echo", "图\n[image content not shown]"]
    assert "MCP remote: ready, 2 tools" in status.splitlines()
    # Without the header the server answers 401, at a wrong path 404: those fail, visibly, alone, with the status.
    assert "MCP nokey: failed: the server answered HTTP 401 Unauthorized (check its headers)" in status.splitlines()
    assert "MCP wrongpath: failed: the server answered HTTP 404 Not Found (check its url)" in status.splitlines()
    assert sorted(r.getMessage() for r in caplog.records) == [  # the servers start side by side: any order
        "MCP server nokey failed: the server answered HTTP 401 Unauthorized (check its headers)",
        "MCP server wrongpath failed: the server answered HTTP 404 Not Found (check its url)"]


@pytest.mark.slow
def test_an_http_call_that_times_out_is_cancelled_too(http_url: str) -> None:
    config = McpServerConfig(url=http_url, headers=dict([HTTP_HEADER]), tools=["block", "queued"], timeout=1)

    async def run() -> tuple[str, str]:
        server = McpServer("remote", config)
        await server.start()
        block, queued = server.tools
        try:
            with pytest.raises(ToolError) as caught:
                await server.call(block, {})
            return str(caught.value), await server.call(queued, {"text": "next 下一个"})
        finally:
            await server.stop()

    error, answer = asyncio.run(run())
    assert error == f"mcp__remote__block {CANCELLED}"
    assert answer.startswith("next 下一个 (cancelled before: block")  # the HTTP server is shared by the module


# A token that quotes nothing else: a run of 4 of its characters found in any output is a leak.
GATEWAY_TOKEN = "Zq8vXw3RkLp2WmR4sYb6NcJ8hFd3KeA5uGt1PxV0oBi7ZrS2yMq4Hn6Lc8Dw3EjTu9G"
URL_PASSWORD, URL_KEY = "Pw7Jx2Nq9VbL5mKc", "Ky4Hs8Dt1RwZ6fGp3Qe"


def leaked(text: str, *secrets: str) -> list[str]:
    """The runs of 4 characters of `secrets` found in `text`."""
    return [secret[i:i + 4] for secret in secrets for i in range(len(secret) - 3) if secret[i:i + 4] in text]


@pytest.mark.slow
def test_credentials_quoted_by_an_http_error_page_are_redacted_before_the_error_is_cut(
        home: Path, fake_openai: FakeOpenAIServer, http_url: str, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    # A gateway in front of the server answers 502 with a page quoting the request's Authorization header and
    # query, the token well into the text: a cut made before redacting would leave most of it.
    broken = http_url.replace("://", f"://me:{URL_PASSWORD}@").removesuffix("/mcp") + f"/broken-gateway?key={URL_KEY}"
    configure(home, {"gateway": {"url": http_url, "tools": ["through_gateway", "echo"],
                                 "headers": {**dict([HTTP_HEADER]), "Authorization": f"Bearer {GATEWAY_TOKEN}"}},
                     "broken": {"url": broken}})
    fake_openai.reply_tool_calls([("mcp__gateway__through_gateway", {}), ("mcp__gateway__echo", {"text": "网关 ok"})])
    fake_openai.reply_text("done")

    async def body(app: App) -> tuple[str, str]:
        agent = app.agent()
        return (await agent.handle(SESSION, "call through the gateway")).text, await agent.command(
            SESSION, Command("/status", ""))

    with caplog.at_level(logging.WARNING):
        reply, status = with_app(home, fake_openai, body)
        assert main(["mcp", "list"]) == 1
    listing = capsys.readouterr().out

    assert reply == "done"
    gateway_error, echo = tool_results(fake_openai.chat_requests()[1])
    assert gateway_error.startswith("error: mcp__gateway__through_gateway: the server refused the call: the server "
                                    "answered HTTP 502 Bad Gateway: Bad gateway: upstream")
    assert "Authorization: ***" in gateway_error
    assert echo == "网关 ok"  # the server itself is fine
    [broken_status] = [line for line in status.splitlines() if line.startswith("MCP broken:")]
    assert broken_status.startswith("MCP broken: failed: the server answered HTTP 502 Bad Gateway")
    assert "key=***" in broken_status and "Basic ***" in broken_status
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "MCP server broken failed: the server answered HTTP 502" in logged
    for shown in (gateway_error, status, logged, listing):
        assert leaked(shown, GATEWAY_TOKEN, URL_PASSWORD, URL_KEY) == [], shown


@pytest.mark.slow
def test_a_tool_error_quoting_the_servers_env_is_redacted(home: Path, fake_openai: FakeOpenAIServer) -> None:
    secret = "env-Mn5Rt8Wq2Lk7Vx4Zc9Hb"
    configure(home, {"files": stdio(env={"SERVICE_KEY": secret}, tools=["fail_env"])})
    fake_openai.reply_tool_calls([("mcp__files__fail_env", {"name": "SERVICE_KEY"})])
    fake_openai.reply_text("好的")

    async def body(app: App) -> str:
        return (await app.agent().handle(SESSION, "log in 登录")).text

    assert with_app(home, fake_openai, body) == "好的"
    [error] = tool_results(fake_openai.chat_requests()[1])
    assert error.startswith("error: ") and "the upstream refused the key '***'; check SERVICE_KEY" in error
    assert leaked(error, secret) == []


@pytest.mark.slow
def test_an_http_server_that_is_not_there_fails_at_start(home: Path) -> None:
    configure(home, {"gone": {"url": "http://127.0.0.1:9/mcp", "timeout": 5}})

    async def body(app: App) -> str:
        return (await server_of(app, "gone")).status()

    assert with_app(home, None, body) == "failed: cannot reach the server: All connection attempts failed"


@pytest.mark.slow
def test_an_http_server_that_dies_mid_session_is_failed_in_http_words(caplog: pytest.LogCaptureFixture) -> None:
    process, url = start_http_server(HTTP_SERVER)  # a server of its own: this test ends it
    config = McpServerConfig(url=url, headers=dict([HTTP_HEADER]), tools=["echo"])
    gone = "cannot reach the server: All connection attempts failed"

    async def run() -> tuple[str, str, str]:
        # An HTTP server holds nothing open between requests: "checked" asks it for its tools every 0.05 s,
        # "unchecked" (every 30 s, the default) learns of the death from a call.
        checked, unchecked = McpServer("checked", config, probe_interval=0.05), McpServer("unchecked", config)
        await asyncio.gather(checked.start(), unchecked.start())
        try:
            assert [checked.status(), unchecked.status()] == ["ready, 1 tool", "ready, 1 tool"]
            await asyncio.sleep(0.3)  # a few checks answered: a live server stays ready
            assert checked.state == "ready" and await checked.call(checked.tools[0], {"text": "hi"}) == "hi"
            process.kill()
            process.wait()
            await wait_until(lambda: checked.state == "failed", what="the check to find the HTTP server gone")
            assert unchecked.state == "ready"
            with pytest.raises(ToolError) as caught:
                await unchecked.call(unchecked.tools[0], {"text": "hi"})
            return checked.status(), unchecked.status(), str(caught.value)
        finally:
            await asyncio.gather(checked.stop(), unchecked.stop())

    try:
        with caplog.at_level(logging.WARNING, logger="picoclaw.tools.mcp"):
            checked, unchecked, error = asyncio.run(run())
    finally:
        end_process(process)

    assert checked == unchecked == f"failed: {gone}"
    assert error == f"MCP server unchecked stopped during the call: {gone}"
    assert [r.getMessage() for r in caplog.records] == [f"MCP server checked failed: {gone}",
                                                        f"MCP server unchecked failed: {gone}"]


# -- the command line: mcp list, chat, telegram -------------------------------------------------------------


@pytest.mark.slow
def test_mcp_list_shows_each_server_its_state_and_its_tools(
        home: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    # Arguments, credentials in a URL and its query may carry tokens: mcp list does not print them.
    configure(home, {"files": stdio(tools=["echo", "add"]),
                     "broken": {"command": ["no-such-mcp-server-xyz", "--token", "s3cret"]},
                     "off": {"url": "http://me:s3cret@127.0.0.1:9/mcp?key=s3cret", "enabled": False}})

    with caplog.at_level(logging.WARNING, logger="picoclaw.tools.mcp"):
        code = main(["mcp", "list"])

    out = capsys.readouterr().out
    assert code == 1  # a server failed
    assert out.splitlines() == [
        "broken: failed: cannot run 'no-such-mcp-server-xyz': program not found  "
        "[stdio: no-such-mcp-server-xyz + 2 arguments]",
        f"files: ready, 2 tools  [stdio: {sys.executable} + 1 argument]",
        "  mcp__files__add  Add two whole numbers.",
        "  mcp__files__echo  Say the text back, `times` times.",
        "off: disabled  [http: http://127.0.0.1:9/mcp?…]",
    ]
    assert "s3cret" not in out
    assert [r.getMessage() for r in caplog.records] == [
        "MCP server broken failed: cannot run 'no-such-mcp-server-xyz': program not found"]


def test_mcp_list_without_servers_says_where_to_add_them(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp", "list"]) == 0
    assert capsys.readouterr().out == (f"no MCP servers configured (add them under tools.mcp.servers in "
                                       f"{home / 'config.json'})\n")


@pytest.mark.slow
def test_chat_offers_the_mcp_tools(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, {"files": stdio(tools=["echo"])}, fake_openai)
    fake_openai.reply_tool_calls([("mcp__files__echo", {"text": "from chat"})])
    fake_openai.reply_text("echoed")

    assert main(["chat", "-m", "echo from chat"]) == 0

    first, second = fake_openai.chat_requests()
    assert [t["function"]["name"] for t in first["tools"]][-1] == "mcp__files__echo"
    assert tool_results(second) == ["from chat"]


@pytest.mark.slow
def test_telegram_offers_the_same_mcp_tools(home: Path, fake_openai: FakeOpenAIServer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from picoclaw.channels.telegram import TelegramChannel

    configure(home, {"files": stdio(tools=["echo"])}, fake_openai)
    with edit_config(home) as config:
        config["channels"]["telegram"].update({"enabled": True, "token": "123456:TEST-token", "api_base":
                                               "http://127.0.0.1:9", "memory_scope": "per_user"})
    seen: list[list[str]] = []

    async def run(self: TelegramChannel, **kwargs: Any) -> None:  # instead of polling: look at the agents
        for user in (None, "42"):
            seen.append([s["function"]["name"] for s in self.agent_for(user).tools.schemas()
                         if s["function"]["name"].startswith("mcp__")])

    monkeypatch.setattr(TelegramChannel, "run", run)
    assert main(["telegram"]) == 0
    assert seen == [["mcp__files__echo"], ["mcp__files__echo"]]
