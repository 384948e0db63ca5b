"""`picoclaw onboard`'s model choice as plain functions: the probe of local servers (its ports given, never the real
11434/8080/8765/1234), the check of a choice, the questions driven by a script, and what reaches config.json.
The terminal itself is tested in test_onboard_terminal.py."""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import picoclaw.cli.model_choice
import picoclaw.cli.model_probe
from picoclaw.cli.model_choice import ModelChoice, apply_choice, choose_model, needs_a_choice
from picoclaw.cli.model_probe import (
    MAX_LIST_BYTES,
    LocalServer,
    check_endpoint,
    find_local_servers,
    model_ids,
)
from picoclaw.cli.onboard import run_onboard
from picoclaw.jsonio import read_json_object
from picoclaw.onboard import template_paths
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config
from tests.test_cli import run

RIGHT_KEY = "sk-right-0123456789abcdef"
WRONG_KEY = "sk-wrong-fedcba9876543210"


class Script:
    """A Prompter that answers from a script: a string, or an exception class to raise (Ctrl-D, Ctrl-C).
    It keeps everything shown and which questions were secret."""

    def __init__(self, *answers: str | type[BaseException]):
        self.answers = list(answers)
        self.shown: list[str] = []
        self.secrets: list[str] = []

    def say(self, text: str = "") -> None:
        self.shown.append(text)

    def ask(self, question: str) -> str:
        self.shown.append(question)
        return self._next()

    def secret(self, question: str) -> str:
        self.shown.append(question)
        self.secrets.append(question)
        return self._next()

    def _next(self) -> str:
        assert self.answers, f"asked more than the script answers:\n{self.text}"
        answer = self.answers.pop(0)
        if isinstance(answer, str):
            return answer
        raise answer()

    @property
    def text(self) -> str:
        return "\n".join(self.shown)


def port_of(server: FakeOpenAIServer) -> int:
    port = urlsplit(server.origin).port
    assert port is not None
    return port


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections (bound, not listening), held so nothing else takes it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def example() -> dict[str, Any]:
    """config.example.json's content: what a new config.json starts from."""
    return read_json_object(template_paths()[1])


def hosted_at(data: dict[str, Any], server: FakeOpenAIServer) -> dict[str, Any]:
    data["providers"]["openai"]["api_base"] = server.base_url  # "OpenAI" is the fake, on this machine
    return data


# -- the probe ----------------------------------------------------------------------------------------------


def test_the_probe_finds_the_servers_that_answer_with_a_model_list(
        fake_openai: FakeOpenAIServer, closed_port: int) -> None:
    fake_openai.models = ["qwen2.5:7b", "通义千问-7b"]
    with FakeOpenAIServer() as garbage, FakeOpenAIServer() as empty:
        garbage.reply_garbage(endpoint="models")  # another web app on a usual port
        empty.models = []  # Ollama before `ollama pull`
        empty_base = empty.base_url
        found = find_local_servers([LocalServer("Ollama", "ollama", port_of(fake_openai)),
                                    LocalServer("llama.cpp", "llamacpp", closed_port),
                                    LocalServer("llama.cpp", "llamacpp", port_of(garbage)),
                                    LocalServer("LM Studio", "lmstudio", port_of(empty))])
    assert [(each.server.label, each.api_base, each.models) for each in found] == [
        ("Ollama", fake_openai.base_url, ("qwen2.5:7b", "通义千问-7b")), ("LM Studio", empty_base, ())]
    assert {request.path for request in fake_openai.requests} == {"/v1/models"}


def test_the_probe_gives_up_on_a_port_that_never_answers() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        assert find_local_servers([LocalServer("Ollama", "ollama", silent.getsockname()[1])], timeout=0.2) == []


def test_model_ids_of_garbage_is_none_and_bad_names_are_left_out() -> None:
    assert model_ids(b'{"object": "list", "data": [{"id": "qwen2.5:7b"}, {"id": "\xe9\x80\x9a\xe4\xb9\x89"}]}') == (
        "qwen2.5:7b", "通义")
    for garbage in (b"", b"<html>502</html>", b"[]", b'{"data": "qwen"}', b'{"models": []}', b"\xff\xfe",
                    b'{"data": [1, 2]', b"null"):
        assert model_ids(garbage) in (None, ()), garbage
    assert model_ids(b'{"data": [1, null, {"id": 7}, {"id": ""}, {"id": "\\u001b[31mred"}, {"id": "ok"}]}') == ("ok",)
    assert model_ids(json.dumps({"data": [{"id": "x" * 201}, {"id": "a"}, {"id": "a"}]}).encode()) == ("a",)


# -- the check of a choice --------------------------------------------------------------------------------


def test_the_check_says_plainly_what_is_wrong(closed_port: int) -> None:
    with FakeOpenAIServer(api_key=RIGHT_KEY) as server:
        server.models = ["gpt-4o-mini", "gpt-4o"]
        assert check_endpoint(server.base_url, RIGHT_KEY, "gpt-4o-mini").ok
        refused = check_endpoint(server.base_url, WRONG_KEY, "gpt-4o-mini")
        assert refused.problem == "the server refused the API key (HTTP 401)"
        assert check_endpoint(server.base_url, RIGHT_KEY, "gpt-5-mini").problem == (
            "the server does not offer the model 'gpt-5-mini' (it has: gpt-4o-mini, gpt-4o)")
        server.reply_garbage(endpoint="models")
        assert check_endpoint(server.base_url, RIGHT_KEY, "gpt-4o-mini").problem == (
            f"{server.base_url} did not answer with an OpenAI-compatible model list: is the address right?")
        server.reply_raw({"data": [{"id": "m" * 100}] * (MAX_LIST_BYTES // 100)}, endpoint="models")  # endless
        assert "did not answer with an OpenAI-compatible model list" in check_endpoint(
            server.base_url, RIGHT_KEY, "gpt-4o-mini").problem
        server.reply_error(500, f"内部错误 / internal error, key {RIGHT_KEY}", endpoint="models")
        failed = check_endpoint(server.base_url, RIGHT_KEY, "gpt-4o-mini")
        assert failed.problem == "the server answered HTTP 500: 内部错误 / internal error, key ***"
        assert "404" in check_endpoint(server.origin + "/wrong", RIGHT_KEY, "gpt-4o-mini").problem
    unreachable = check_endpoint(f"http://127.0.0.1:{closed_port}/v1", RIGHT_KEY, "gpt-4o-mini")
    assert unreachable.problem.startswith(f"cannot reach http://127.0.0.1:{closed_port}/v1 (")
    assert not any(RIGHT_KEY in check.problem for check in (refused, failed, unreachable))


@pytest.mark.parametrize(("api_base", "proxied"), [
    ("http://gpu-box:8000/v1", False),  # a single-label name: the local network's
    ("http://llama.lan:8080/v1", False),
    ("http://100.101.102.103:8080/v1", False),  # a Tailscale address
    ("http://192.168.1.20:1234/v1", False),
    ("http://llm.example.com/v1", True),  # the internet: through the environment's proxy
])
def test_the_check_reaches_the_local_network_without_the_proxy(monkeypatch: pytest.MonkeyPatch, api_base: str,
                                                               proxied: bool) -> None:
    with FakeOpenAIServer(api_key=RIGHT_KEY) as proxy:  # answers a proxied GET as it would a direct one
        proxy.models = ["qwen2.5:7b"]
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "https_proxy", "all_proxy", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("http_proxy", proxy.origin)
        check = check_endpoint(api_base, RIGHT_KEY, "qwen2.5:7b", timeout=5)
        assert bool(proxy.requests) is proxied
        assert check.ok is proxied  # the network guard stops the direct attempt: "cannot reach …"


# -- the questions ----------------------------------------------------------------------------------------


def test_a_local_server_found_is_offered_first_and_chosen(
        fake_openai: FakeOpenAIServer, closed_port: int, example: dict[str, Any]) -> None:
    fake_openai.models = ["nomic-embed-text", "qwen2.5:7b", "通义千问-7b"]
    script = Script("abc", "99", "２")  # nonsense, out of range, then a full-width 2 from a Chinese input method
    choice = choose_model(example, script, servers=[LocalServer("LM Studio", "lmstudio", closed_port),
                                                    LocalServer("Ollama", "ollama", port_of(fake_openai))],
                          environ={})
    assert script.shown[:10] == [
        "picoclaw needs a language model. Looking for a model server on this machine …",
        f"Found Ollama at {fake_openai.base_url} (3 models).",
        "",
        "Which model should picoclaw use?",
        "  1) qwen2.5:7b on Ollama (this machine, no key needed)",
        "  2) 通义千问-7b on Ollama (this machine, no key needed)",
        "  3) nomic-embed-text on Ollama (this machine, no key needed)",  # embeddings cannot chat: last
        "  4) gpt-4o-mini on OpenAI (needs an API key)",
        "  5) deepseek-chat on DeepSeek (needs an API key)",
        "  6) skip: keep openai, gpt-4o-mini (a key or a server can go into config.json later)"]
    assert script.shown.count("Please answer with a number from 1 to 6.") == 2
    assert script.shown[-2:] == [f"Checking 通义千问-7b at {fake_openai.base_url} …",
                                 f"OK: {fake_openai.base_url} answered and offers 通义千问-7b."]
    assert script.secrets == []  # a local server needs no key
    assert choice == ModelChoice("ollama", "通义千问-7b", fake_openai.base_url,
                                 {"api_key": "ollama", "api_base": fake_openai.base_url, "timeout": 600,
                                  "max_retries": 0}, "none needed")
    data = apply_choice(example, choice)
    assert data["agents"]["defaults"]["provider"] == "ollama" and data["agents"]["defaults"]["model"] == "通义千问-7b"
    assert data["providers"]["ollama"]["text_tool_calls"] == "auto"  # the entry's other settings stay


def test_none_found_then_openai_with_a_key_typed(closed_port: int, example: dict[str, Any]) -> None:
    with FakeOpenAIServer(api_key=RIGHT_KEY) as openai:
        script = Script("", RIGHT_KEY + "\n")  # Enter takes the first offer; a pasted key may bring a newline
        choice = choose_model(hosted_at(example, openai), script,
                              servers=[LocalServer("Ollama", "ollama", closed_port)], environ={})
        [request] = openai.requests
    assert script.shown[1] == f"No model server answers on this machine (looked for Ollama on port {closed_port})."
    assert script.secrets == ["API key for OpenAI (not shown as you type): "]
    assert request.headers["authorization"] == f"Bearer {RIGHT_KEY}"
    assert choice is not None and choice.settings == {"api_key": RIGHT_KEY} and choice.key_source == "typed"
    assert (choice.provider, choice.model, choice.problem) == ("openai", "gpt-4o-mini", "")
    assert RIGHT_KEY not in script.text  # asked for, never shown


def test_a_refused_key_says_so_and_offers_to_keep_it_or_choose_again(
        closed_port: int, example: dict[str, Any]) -> None:
    servers = [LocalServer("Ollama", "ollama", closed_port)]
    with FakeOpenAIServer(api_key=RIGHT_KEY) as openai:
        data = hosted_at(example, openai)
        again = Script("1", WRONG_KEY, "n", "1", "我的 key", RIGHT_KEY)
        choice = choose_model(data, again, servers=servers, environ={})
        kept = Script("1", WRONG_KEY, "是")  # "yes" in Chinese keeps it too
        anyway = choose_model(data, kept, servers=servers, environ={})
    assert "That did not work: the server refused the API key (HTTP 401)." in again.shown
    assert "Keep this choice anyway? [y/N] " in again.shown and "Then choose again." in again.shown
    assert again.shown.count("Which model should picoclaw use?") == 2
    assert "That is not an API key (one word of letters, digits and punctuation); try again." in again.shown
    assert choice is not None and choice.settings == {"api_key": RIGHT_KEY} and choice.problem == ""
    assert anyway is not None and anyway.settings == {"api_key": WRONG_KEY}
    assert anyway.problem == "the server refused the API key (HTTP 401)"
    assert not any(key in again.text + kept.text for key in (RIGHT_KEY, WRONG_KEY))


def test_no_key_goes_back_to_the_menu_and_skip_changes_nothing(closed_port: int, example: dict[str, Any]) -> None:
    script = Script("1", "", "3")
    assert choose_model(example, script, servers=[LocalServer("Ollama", "ollama", closed_port)], environ={}) is None
    assert "No key given; openai cannot be used without one." in script.shown


def test_a_key_in_the_environment_is_offered_and_not_written(closed_port: int, example: dict[str, Any]) -> None:
    with FakeOpenAIServer(api_key=RIGHT_KEY) as openai:
        script = Script("1", "")
        choice = choose_model(hosted_at(example, openai), script, servers=[], environ={"OPENAI_API_KEY": RIGHT_KEY})
    assert script.secrets == ["API key for OpenAI (not shown as you type; Enter keeps OPENAI_API_KEY): "]
    assert choice is not None and "api_key" not in choice.settings  # the environment keeps it, not config.json
    assert choice.key_source == "the environment (OPENAI_API_KEY)"


def test_only_a_config_whose_provider_has_no_key_is_asked_again(example: dict[str, Any]) -> None:
    assert needs_a_choice(example, {}) and not needs_a_choice(example, {"OPENAI_API_KEY": "sk-x"})
    example["agents"]["defaults"]["provider"] = "ollama"  # its placeholder key counts: that choice was made
    assert not needs_a_choice(example, {})
    example["agents"]["defaults"]["provider"] = "dashscope"  # a provider with no entry at all
    assert needs_a_choice(example, {}) and not needs_a_choice(example, {"DASHSCOPE_API_KEY": "sk-x"})


# -- onboarding with the questions ------------------------------------------------------------------------


def test_onboarding_a_new_home_writes_the_choice_and_the_chat_works(
        tmp_path: Path, fake_openai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "新家"
    monkeypatch.setenv("PICOCLAW_HOME", str(home))
    fake_openai.models = ["qwen2.5:7b"]
    assert run_onboard(home, Script("1"), servers=[LocalServer("Ollama", "ollama", port_of(fake_openai))]) == 0
    out = capsys.readouterr().out
    config = json.loads((home / "config.json").read_text(encoding="utf-8"))
    assert stat.S_IMODE((home / "config.json").stat().st_mode) == 0o600
    assert (config["agents"]["defaults"]["provider"], config["agents"]["defaults"]["model"]) == ("ollama", "qwen2.5:7b")
    assert config["providers"]["ollama"]["api_base"] == fake_openai.base_url
    assert out.splitlines()[-1] == (f"Done. picoclaw will use qwen2.5:7b on ollama ({fake_openai.base_url}); "
                                    "run `picoclaw chat`.")
    fake_openai.reply_text("你好！我是 picoclaw。Hello!")
    code, out, err = run(capsys, "chat", "-m", "你好")
    assert (code, err) == (0, "") and "你好！我是 picoclaw。Hello!" in out


def test_onboarding_an_existing_home_without_a_key_updates_only_the_model(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = home / "config.json"
    with FakeOpenAIServer(api_key=RIGHT_KEY) as openai:
        with edit_config(home) as data:
            hosted_at(data, openai)
        assert run_onboard(home, Script("1", RIGHT_KEY), servers=[]) == 0
        base = openai.base_url
    *steps, last = capsys.readouterr().out.splitlines()
    after = json.loads(path.read_text(encoding="utf-8"))
    assert after == {**data, "providers": {**data["providers"], "openai": {**data["providers"]["openai"],
                                                                           "api_key": RIGHT_KEY}}}
    assert after["timezone"] == "Asia/Shanghai"  # everything else as the user had it
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert steps[0] == f"{'updated with your choice':34} {path}"
    assert last == f"Done. picoclaw will use gpt-4o-mini on openai ({base}); run `picoclaw chat`."
    assert RIGHT_KEY not in last


def test_a_choice_kept_despite_its_check_says_so_last(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    with FakeOpenAIServer() as server:
        server.reply_raw({"data": [{"id": "qwen2.5-7b-instruct"}]}, endpoint="models")  # the probe's answer
        server.reply_error(503, "模型加载中 / loading model", endpoint="models")  # the check's
        script = Script("1", "y")
        assert run_onboard(home, script, servers=[LocalServer("LM Studio", "lmstudio", port_of(server))]) == 0
        base = server.base_url
    problem = "the server answered HTTP 503: 模型加载中 / loading model"
    assert f"That did not work: {problem}." in script.shown
    config = json.loads((home / "config.json").read_text(encoding="utf-8"))
    assert config["providers"]["lmstudio"] == {"api_key": "lm-studio", "api_base": base, "timeout": 600,
                                               "max_retries": 0}  # a new entry, with a local server's settings
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"Done. picoclaw will use qwen2.5-7b-instruct on lmstudio ({base}), which failed the check "
        f"({problem}): fix it in {home / 'config.json'}, then run `picoclaw chat`.")


@pytest.mark.parametrize("stop", [KeyboardInterrupt, EOFError], ids=["ctrl-c", "ctrl-d"])
@pytest.mark.parametrize("at", ["menu", "key", "keep"])
def test_stopping_at_a_question_leaves_config_json_untouched(
        tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], stop: type[BaseException], at: str) -> None:
    answers: list[str | type[BaseException]] = {"menu": [stop], "key": ["1", stop], "keep": ["1", WRONG_KEY, stop]}[at]
    with FakeOpenAIServer(api_key=RIGHT_KEY) as openai:
        path = home / "config.json"
        with edit_config(home) as config:
            hosted_at(config, openai)
        before = path.read_bytes(), path.stat().st_mtime_ns
        fresh = tmp_path / "fresh"
        codes = [run_onboard(home, Script(*answers), servers=[]),
                 run_onboard(fresh, Script(*answers[:1]), servers=[]) if at == "menu" else None]
    out, err = capsys.readouterr()
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before  # untouched: not even rewritten the same
    assert codes[0] == (130 if stop is KeyboardInterrupt else 1)
    assert "picoclaw: onboarding stopped at a question; config.json was not changed\n" in err
    assert "Traceback" not in err and "updated" not in out
    if at == "menu":  # a new home: nothing at all was written
        assert codes[1] == codes[0] and not fresh.exists()
        assert err.endswith("picoclaw: onboarding stopped at a question; nothing was written\n")


def test_without_a_terminal_nothing_is_asked_nor_probed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no terminal: onboarding must not ask or look for servers")

    monkeypatch.setattr(picoclaw.cli.model_probe, "find_local_servers", forbidden)
    monkeypatch.setattr(picoclaw.cli.model_choice, "choose_model", forbidden)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)  # stdin a terminal, stdout a pipe: still no questions
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    home = tmp_path / "home"
    monkeypatch.setenv("PICOCLAW_HOME", str(home))
    code, out, err = run(capsys, "onboard")
    assert (code, err) == (0, "")
    expected = read_json_object(template_paths()[1])
    expected["workspace"] = str(home / "workspace")
    assert json.loads((home / "config.json").read_text(encoding="utf-8")) == expected  # the example, as ever
    assert out.splitlines()[-1] == (
        f"Done. Add an API key to {home / 'config.json'} (or set OPENAI_API_KEY), or run `picoclaw onboard` in a "
        "terminal to choose a local server (Ollama, llama.cpp, LM Studio); then run `picoclaw chat`.")
    monkeypatch.setenv("OPENAI_API_KEY", RIGHT_KEY)
    (home / "config.json").unlink()
    assert run(capsys, "onboard")[1].splitlines()[-1] == (
        "Done. picoclaw will use gpt-4o-mini on openai (https://api.openai.com/v1); run `picoclaw chat`.")
    assert os.environ["OPENAI_API_KEY"] == RIGHT_KEY
