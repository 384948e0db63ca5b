"""config.json (picoclaw/config.py): defaults, the example file, paths, env secrets, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from picoclaw.app import App
from picoclaw.config import (
    AgentDefaults,
    Config,
    EmbeddingsConfig,
    IndexConfig,
    MediaConfig,
    MemoryConfig,
    ProviderConfig,
    TelegramConfig,
    WebSearchConfig,
    home_dir,
    load_config,
    parse_config,
    workspace_dir,
)
from picoclaw.errors import ConfigError
from picoclaw.onboard import onboard, template_paths
from picoclaw.policy_schema import POLICY_KEYS, MemoryPolicy

REPO = Path(__file__).resolve().parent.parent


def write_config(home: Path, data: object | str) -> Path:
    """Write config.json under `home` (a str is written verbatim, to test malformed JSON)."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def config_error(home: Path, data: object | str) -> str:
    """The ConfigError message load_config gives for `data`, checked to be a single line."""
    write_config(home, data)
    with pytest.raises(ConfigError) as info:
        load_config(home)
    message = str(info.value)
    assert "\n" not in message, message
    assert str(home / "config.json") in message, message
    return message


# -- defaults and the example ----------------------------------------------------------------------


def test_empty_config_gives_documented_defaults(tmp_path: Path) -> None:
    config = parse_config({}, tmp_path / "config.json")
    assert config.workspace is None
    assert config.timezone == "local"
    defaults = config.agents.defaults
    assert (defaults.provider, defaults.model, defaults.max_tokens) == ("openai", "gpt-4o-mini", 4096)
    # context_window None: found from the server (picoclaw/providers/context_window.py).
    assert (defaults.temperature, defaults.context_window, defaults.max_tool_iterations) == (0.7, None, 20)
    assert set(config.providers) == {"openai", "deepseek", "ollama"}
    assert config.providers["openai"].api_base == "https://api.openai.com/v1"
    assert config.providers["ollama"].api_key == "ollama"
    telegram = config.channels.telegram
    assert (telegram.enabled, telegram.token, telegram.allow_from) == (False, "", [])
    assert (telegram.memory_scope, telegram.group_trigger, telegram.api_base) == ("shared", "mention", None)
    # Every policy key has its default (picoclaw/policy_schema.py), and none counts as written by the user.
    assert {key: getattr(config.memory, key) for key in POLICY_KEYS} == MemoryPolicy().model_dump()
    assert config.memory.retrieve_limit == 10 and config.memory.memory_token_budget == 2000
    assert config.memory.policy_values() == {}
    assert config.memory.backup_keep == 50
    assert config.memory.index.enabled is False and config.memory.index.sources == ["memory", "notes"]


def test_example_config_parses_and_shows_every_policy_key() -> None:
    example = REPO / "config.example.json"
    data = json.loads(example.read_text(encoding="utf-8"))
    config = parse_config(data, example)
    assert config.timezone == "local"  # the machine's zone: a new user's dates follow their own clock
    assert config.workspace == "~/.picoclaw/workspace"
    assert set(config.providers) >= {"openai", "deepseek", "ollama"}
    # "config.example.json shows all of it": every policy key is spelled out in its memory block.
    assert set(config.memory.policy_values()) == set(POLICY_KEYS)
    # onboard copies the same file, so it must be the one onboarding uses.
    assert template_paths()[1].resolve() == example.resolve()


def test_example_config_shows_the_media_settings_and_no_transcriber() -> None:
    # A new install transcribes nothing until the user names an endpoint; every media key is spelled out.
    data = json.loads((REPO / "config.example.json").read_text(encoding="utf-8"))
    config = parse_config(data, "config.example.json")
    assert "transcription" in data and config.transcription is None
    assert set(data["media"]) == set(MediaConfig.model_fields)
    assert data["agents"]["defaults"]["vision"] == "auto"


def test_example_config_shows_the_tool_settings_switched_off() -> None:
    # Users tune by editing the JSON, so the example spells out a search backend's keys, but a new install
    # must not call a search API (or start anything) until the user turns it on.
    example = REPO / "config.example.json"
    data = json.loads(example.read_text(encoding="utf-8"))
    config = parse_config(data, example)
    search = data["tools"]["web"]["search"]
    assert set(search) == set(WebSearchConfig.model_fields)  # every key, so a new one must be shown too
    assert config.tools.web.search is not None and config.tools.web.search.enabled is False
    assert config.tools.exec.enabled is False
    assert not any(server.enabled for server in config.tools.mcp.servers.values())


def test_user_values_are_kept_including_chinese_text(tmp_path: Path) -> None:
    config = parse_config(
        {
            "timezone": "UTC",
            "agents": {"defaults": {"provider": "qwen", "model": "通义千问-max", "temperature": 0.2}},
            "providers": {"qwen": {"api_key": "", "api_base": "https://dashscope.example/v1"}},
            "channels": {"telegram": {"allow_from": [12345, "alice_bob"], "memory_scope": "per_user"}},
            "memory": {"retrieve_limit": 3, "recent_days": 1, "backup_keep": 7},
        },
        tmp_path / "config.json",
    )
    assert config.agents.defaults.model == "通义千问-max"
    assert config.agents.defaults.max_tokens == 4096  # untouched keys keep their defaults
    # Writing a providers block replaces the built-in list: only what the user wrote exists.
    assert set(config.providers) == {"qwen"}
    assert config.channels.telegram.allow_from == [12345, "alice_bob"]
    assert config.memory.policy_values() == {"retrieve_limit": 3, "recent_days": 1}
    assert config.memory.backup_keep == 7


# -- where things live -------------------------------------------------------------------------------


def test_home_defaults_to_dot_picoclaw_under_the_user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PICOCLAW_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert home_dir() == tmp_path / "user" / ".picoclaw"


def test_picoclaw_home_env_with_tilde_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("PICOCLAW_HOME", "~/我的助手")
    assert home_dir() == tmp_path / "user" / "我的助手"


def test_relative_picoclaw_home_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: onboard writes `<home>/workspace` into config.json and relative workspaces resolve
    # against home, so a relative home used to put the workspace at <home>/<home>/workspace.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PICOCLAW_HOME", "rel-home")
    home = home_dir()
    assert home == tmp_path / "rel-home" and home.is_absolute()
    onboard(home)
    workspace = App.open().workspace
    assert workspace.root == tmp_path / "rel-home" / "workspace"
    assert workspace.store.long_term_path.is_file()
    assert not (tmp_path / "rel-home" / "rel-home").exists()
    # The workspace written into config.json is absolute, so it does not depend on the current folder.
    assert Path(load_config(home).workspace).is_absolute()


def test_workspace_default_is_home_slash_workspace(tmp_path: Path) -> None:
    config = parse_config({}, tmp_path / "config.json")
    assert workspace_dir(config, tmp_path / "home") == tmp_path / "home" / "workspace"


def test_workspace_tilde_relative_and_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    home = tmp_path / "home"
    tilde = parse_config({"workspace": "~/笔记/ws"}, home / "config.json")
    assert workspace_dir(tilde, home) == tmp_path / "user" / "笔记" / "ws"
    relative = parse_config({"workspace": "elsewhere"}, home / "config.json")
    assert workspace_dir(relative, home) == home / "elsewhere"
    absolute = parse_config({"workspace": str(tmp_path / "abs")}, home / "config.json")
    assert workspace_dir(absolute, home) == tmp_path / "abs"


def test_load_config_reads_from_picoclaw_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "家"
    write_config(home, {"timezone": "Europe/Berlin", "memory": {"recent_days": 7}})
    monkeypatch.setenv("PICOCLAW_HOME", str(home))
    config = load_config()
    assert config.timezone == "Europe/Berlin" and config.memory.recent_days == 7


# -- secrets from the environment --------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("OPENAI_API_KEY", "QWEN_API_KEY", "MY_LLM_API_KEY", "OLLAMA_API_KEY", "TELEGRAM_BOT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_openai_key_from_env_only_when_config_is_empty(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    empty = parse_config({}, tmp_path / "config.json")
    assert empty.api_key_for("openai") == ""
    clean_env.setenv("OPENAI_API_KEY", "sk-from-env")
    assert empty.api_key_for("openai") == "sk-from-env"
    written = parse_config(
        {"providers": {"openai": {"api_key": "sk-from-file", "api_base": "https://api.openai.com/v1"}}},
        tmp_path / "config.json",
    )
    assert written.api_key_for("openai") == "sk-from-file"


def test_custom_provider_key_from_name_api_key(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    config = parse_config(
        {"providers": {"qwen": {"api_key": "", "api_base": "https://dashscope.example/v1"},
                       "my-llm": {"api_base": "http://localhost:8000/v1"},
                       "ollama": {"api_key": "ollama", "api_base": "http://localhost:11434/v1"}}},
        tmp_path / "config.json",
    )
    clean_env.setenv("QWEN_API_KEY", "qwen-secret")
    clean_env.setenv("MY_LLM_API_KEY", "dash-secret")
    clean_env.setenv("OLLAMA_API_KEY", "must-not-win")
    clean_env.setenv("OPENAI_API_KEY", "sk-openai")
    assert config.api_key_for("qwen") == "qwen-secret"
    assert config.api_key_for("my-llm") == "dash-secret"  # "-" is not allowed in env names
    assert config.api_key_for("ollama") == "ollama"  # the config value wins over the env
    assert config.api_key_for("qwen") != config.api_key_for("openai")


def test_telegram_token_from_env_only_when_config_is_empty(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TELEGRAM_BOT_TOKEN", "123:env")
    empty = parse_config({}, tmp_path / "config.json")
    assert empty.telegram_token() == "123:env"
    written = parse_config({"channels": {"telegram": {"token": "456:file"}}}, tmp_path / "config.json")
    assert written.telegram_token() == "456:file"
    clean_env.delenv("TELEGRAM_BOT_TOKEN")
    assert empty.telegram_token() == ""


# -- errors: one line naming the file, the key and what was expected ---------------------------------


def test_missing_config_file_says_run_onboard(tmp_path: Path) -> None:
    home = tmp_path / "nowhere"
    with pytest.raises(ConfigError) as info:
        load_config(home)
    message = str(info.value)
    assert str(home / "config.json") in message
    assert "picoclaw onboard" in message and "\n" not in message


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    # A trailing comma on line 3, the classic hand-editing mistake.
    raw = '{\n  "timezone": "Asia/Shanghai",\n  "memory": {"retrieve_limit": 5,}\n}\n'
    message = config_error(tmp_path / "home", raw)
    assert "not valid JSON" in message
    assert "line 3 column" in message


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    # Notepad on Windows saves UTF-8 with a BOM; the file is still the user's valid JSON.
    path = write_config(tmp_path / "home", "")
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"timezone": "Asia/Shanghai", "workspace": "工作区"},
                                                     ensure_ascii=False).encode("utf-8"))
    config = load_config(tmp_path / "home")
    assert config.timezone == "Asia/Shanghai" and config.workspace == "工作区"


def test_empty_file_is_malformed_json(tmp_path: Path) -> None:
    message = config_error(tmp_path / "home", "")
    assert "not valid JSON at line 1" in message


def test_top_level_array_is_rejected(tmp_path: Path) -> None:
    message = config_error(tmp_path / "home", [{"timezone": "UTC"}])
    assert "expected a JSON object at the top level" in message and "list" in message


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param({"memory": {"retrive_limit": 5}}, ["memory.retrive_limit", "unknown key"], id="typo-in-memory"),
        pytest.param({"workspce": "~/ws"}, ["workspce", "unknown key"], id="typo-top-level"),
        pytest.param({"channels": {"telegram": {"tokne": "x"}}}, ["channels.telegram.tokne", "unknown key"],
                     id="typo-nested"),
        pytest.param({"memory": {"retrieve_limit": 0}}, ["memory.retrieve_limit", "got 0", "allowed 1–50"],
                     id="below-range"),
        pytest.param({"memory": {"retrieve_limit": 51}}, ["memory.retrieve_limit", "got 51", "allowed 1–50"],
                     id="above-range"),
        pytest.param({"memory": {"recent_days": 31}}, ["memory.recent_days", "allowed 0–30"], id="recent-days"),
        pytest.param({"agents": {"defaults": {"temperature": 3}}},
                     ["agents.defaults.temperature", "got 3", "allowed 0.0–2.0"], id="float-range"),
        pytest.param({"memory": {"retrieve_limit": "5"}}, ["memory.retrieve_limit", "valid integer", "got '5'"],
                     id="string-for-int"),
        pytest.param({"memory": {"evolution_enabled": "是"}}, ["memory.evolution_enabled", "valid boolean", "'是'"],
                     id="chinese-string-for-bool"),
        pytest.param({"agents": {"defaults": {"max_tokens": "lots"}}},
                     ["agents.defaults.max_tokens", "valid integer", "got 'lots'"], id="word-for-int"),
        pytest.param({"memory": 10}, ["memory", "got 10"], id="number-for-block"),
        pytest.param({"channels": {"telegram": {"memory_scope": "everyone"}}},
                     ["channels.telegram.memory_scope", "'shared' or 'per_user'", "got 'everyone'"], id="enum"),
        pytest.param({"timezone": "Mars/Olympus"}, ["timezone", "unknown timezone 'Mars/Olympus'"], id="bad-tz"),
        pytest.param({"timezone": "亚洲/上海"}, ["timezone", "unknown timezone '亚洲/上海'"], id="bad-tz-chinese"),
        pytest.param({"providers": {"qwen": {"api_base": 8080}}}, ["providers.qwen.api_base", "string"],
                     id="provider-base-not-text"),
        pytest.param({"memory": {"session_summary_keep_count": 20}},
                     ["memory", "session_summary_keep_count must be smaller than session_summary_message_threshold",
                      "20 ≥ 20"], id="keep-equals-threshold"),
        pytest.param({"memory": {"session_summary_keep_count": 9, "session_summary_message_threshold": 8}},
                     ["session_summary_keep_count", "9 ≥ 8"], id="keep-above-threshold"),
        pytest.param({"memory": {"long_term_compress_char_threshold": 500}},
                     ["long_term_compress_char_threshold", "at least 1000"], id="compress-threshold"),
        pytest.param({"memory": {"backup_keep": 0}}, ["memory.backup_keep", "allowed 1–100000"], id="backup-keep"),
        pytest.param({"agents": {"defaults": {"context_window": 512}}},
                     ["agents.defaults.context_window", "from 1024 to 10000000", "got 512"], id="window-too-small"),
        pytest.param({"agents": {"defaults": {"context_window": 20_000_000}}},
                     ["agents.defaults.context_window", "from 1024 to 10000000", "got 20000000"], id="window-absurd"),
        pytest.param({"agents": {"defaults": {"context_window": "8192"}}},
                     ["agents.defaults.context_window", '"auto" or a whole number', "got '8192'"], id="window-text"),
        pytest.param({"agents": {"defaults": {"context_window": "自动"}}},
                     ["agents.defaults.context_window", '"auto" or a whole number', "got '自动'"],
                     id="window-chinese-word"),
        pytest.param({"agents": {"defaults": {"context_window": 8192.5}}},
                     ["agents.defaults.context_window", "whole number", "got 8192.5"], id="window-fraction"),
    ],
)
def test_invalid_values_give_one_line_naming_file_key_and_expectation(
    tmp_path: Path, data: dict, expected: list[str]
) -> None:
    message = config_error(tmp_path / "home", data)
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_every_problem_is_reported_on_the_same_line(tmp_path: Path) -> None:
    message = config_error(tmp_path / "home", {"memory": {"retrieve_limit": 99, "recent_days": -1}})
    assert "memory.retrieve_limit" in message and "memory.recent_days" in message


def test_parse_config_names_the_given_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^/some/where/配置\.json: memory\.retrive_limit: unknown key"):
        parse_config({"memory": {"retrive_limit": 5}}, "/some/where/配置.json")


def test_config_model_is_strict_about_unknown_keys_directly() -> None:
    # The model itself, not only load_config, refuses typos: other code builds Config objects too.
    with pytest.raises(Exception):
        Config.model_validate({"timezne": "UTC"})


@pytest.mark.parametrize(("data", "key"), [
    pytest.param({"timezone": "x" * 1_000_000}, "timezone", id="validator-quotes-the-value"),
    pytest.param({"agents": {"defaults": {"max_tokens": "9" * 1_000_000 + "x"}}}, "agents.defaults.max_tokens",
                 id="string-for-int"),
    # 900 KB of UTF-8: under the 1 MiB a config.json may hold (MAX_JSON_BYTES)
    pytest.param({"channels": {"telegram": {"memory_scope": "字" * 300_000}}}, "channels.telegram.memory_scope",
                 id="chinese-enum"),
])
def test_a_huge_value_is_quoted_short(tmp_path: Path, data: dict, key: str) -> None:
    message = config_error(tmp_path / "home", data)
    assert key in message and "…" in message and len(message) < 400 + len(str(tmp_path)), message[:1000]


def test_a_short_value_is_quoted_whole(tmp_path: Path) -> None:
    value = "Mars/" + "o" * 60  # 65 characters: under the cap, so nothing is cut
    message = config_error(tmp_path / "home", {"timezone": value})
    assert f"'{value}'" in message and "…" not in message


def _numeric_fields(model: type[BaseModel]) -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        text = str(field.annotation)
        if field.annotation is not bool and ("int" in text or "float" in text) and "str" not in text:
            names.append(name)
    return names


@pytest.mark.parametrize("model", [MemoryPolicy, MemoryConfig, AgentDefaults, IndexConfig, EmbeddingsConfig,
                                   ProviderConfig, TelegramConfig], ids=lambda m: m.__name__)
def test_every_numeric_key_has_an_upper_bound(model: type[BaseModel]) -> None:
    # Reflection and hand edits can write any number; none may be astronomically large.
    base = {"provider": "local"} if model is EmbeddingsConfig else {}
    for name in _numeric_fields(model):
        with pytest.raises(ValidationError) as info:
            model.model_validate({**base, name: 10 ** 15})
        assert any(err["loc"][:1] == (name,) for err in info.value.errors()), name


@pytest.mark.parametrize(("value", "expected"), [("auto", None), (None, None), (4096, 4096), (1024, 1024),
                                               (10_000_000, 10_000_000)])
def test_context_window_is_auto_or_a_number(tmp_path: Path, value: object, expected: int | None) -> None:
    config = parse_config({"agents": {"defaults": {"context_window": value}}}, tmp_path / "config.json")
    assert config.agents.defaults.context_window == expected


def test_compress_threshold_is_bounded(tmp_path: Path) -> None:
    message = config_error(tmp_path / "home", {"memory": {"long_term_compress_char_threshold": 999_999_999_999}})
    assert "memory.long_term_compress_char_threshold" in message and "0–10000000" in message, message
    assert MemoryPolicy(long_term_compress_char_threshold=10_000_000).long_term_compress_char_threshold == 10_000_000


@pytest.mark.parametrize("workspace", ["ws\x00evil", "\x00", "~/工作\x00区"])
def test_a_nul_byte_in_workspace_is_a_config_error(tmp_path: Path, workspace: str) -> None:
    message = config_error(tmp_path / "home", {"workspace": workspace})
    assert "workspace:" in message and "NUL" in message, message
    assert "\x00" not in message  # the terminal gets no raw NUL


# -- a config.json that is not what it should be: bounded reads --------------------------------------------

BOUNDED_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # an endless read fails fast, not the machine
from picoclaw.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _picoclaw_bounded(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-c", BOUNDED_CHILD, *argv], env=env, capture_output=True, text=True,
                          encoding="utf-8", timeout=60)


@pytest.mark.slow
def test_a_config_linked_to_dev_zero_is_refused_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    onboard(home)
    config = home / "config.json"
    config.unlink()
    config.symlink_to("/dev/zero")
    done = _picoclaw_bounded(home, "memory", "show")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"picoclaw: error: {config}: larger than 1 MiB; is it the right file?\n"
    assert os.readlink(config) == "/dev/zero"


def test_a_huge_config_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    message = config_error(home, {"timezone": "Asia/Shanghai", "agents": {"defaults": {"model": "模型" * 400_000}}})
    assert (home / "config.json").stat().st_size > 2 << 20
    assert message == f"{home / 'config.json'}: larger than 1 MiB; is it the right file?"


@pytest.mark.slow
def test_policy_overrides_linked_to_dev_zero_are_ignored_with_one_warning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    onboard(home)
    overrides = home / "workspace" / "memory" / "policy_overrides.json"
    overrides.parent.mkdir(parents=True, exist_ok=True)
    overrides.symlink_to("/dev/zero")
    done = _picoclaw_bounded(home, "policy", "show")
    assert done.returncode == 0 and "retrieve_limit" in done.stdout
    assert f"ignoring policy overrides: {overrides}: larger than 1 MiB; is it the right file?" in done.stderr
