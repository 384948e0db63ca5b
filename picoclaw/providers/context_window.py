"""The model's context window, found: config.json's number, what the server reports, or a default by host.

At the first `current()` of a process the endpoint is asked once (concurrent first callers share the one
probe), within `PROBE_DEADLINE` seconds whatever the server does, in each way a local server tells it:

- llama.cpp's server: `GET /props` at the server root → `default_generation_settings.n_ctx`;
- Ollama: `POST /api/show` → the model's `*.context_length` and the `num_ctx` it runs with (the smaller);
- LM Studio: `GET /api/v0/models` → the model's `loaded_context_length`;
- vLLM: `GET <api_base>/models` → the model's `max_model_len`.

Known cloud APIs are not asked (they report nothing there). config.json's number wins, unless the server runs
with a smaller one (then the smaller, with one log line); with nothing told, 8,192 tokens for a server on this
machine or its network (or at a bare IP address), 128,000 for a known cloud API or any other name on the
internet. An overflow answer that names the window (`learn`) lowers it for the rest of the process. A bad answer
never raises: it leaves the fallback, with one log line for the whole probe.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from picoclaw.config import CLOUD_DEFAULT_WINDOW, LOCAL_DEFAULT_WINDOW
from picoclaw.hosts import host_of, is_internet_name, is_local_host
from picoclaw.providers.base import ContextWindow, Usage

log = logging.getLogger(__name__)

# The whole probe's bound: every way is asked at once, the first to tell ends it, and a server that never
# answers costs this, no more.
PROBE_DEADLINE = 1.5
# A reported window outside this range is a misreading (or a broken server), not a window to budget against.
SANE_WINDOW = (256, 10_000_000)
# Ollama runs a model with this num_ctx unless its parameters (or the server's OLLAMA_CONTEXT_LENGTH) say
# otherwise, whatever the model itself could hold; over it, Ollama cuts the prompt's start without a word.
OLLAMA_DEFAULT_NUM_CTX = 4096

# Hosted APIs whose windows are large and who report none of the above: not asked, 128,000 assumed. A host
# matches when it is one of these or ends with "." + one of them.
CLOUD_HOSTS = (
    "openai.com", "openai.azure.com", "cognitiveservices.azure.com", "services.ai.azure.com",
    "inference.ai.azure.com", "amazonaws.com", "googleapis.com", "anthropic.com", "deepseek.com", "openrouter.ai",
    "groq.com", "mistral.ai", "together.xyz", "fireworks.ai", "x.ai", "perplexity.ai", "cohere.ai", "cohere.com",
    "huggingface.co", "github.ai", "ai21.com", "reka.ai", "upstage.ai", "nebius.ai", "nebius.com", "lambda.ai",
    "featherless.ai", "friendli.ai", "deepinfra.com", "cerebras.ai", "sambanova.ai", "novita.ai", "hyperbolic.xyz",
    "nvidia.com",
    "moonshot.cn", "moonshot.ai", "aliyuncs.com", "bigmodel.cn", "z.ai", "baidubce.com", "tencentcloudapi.com",
    "cloud.tencent.com", "volces.com", "stepfun.com", "siliconflow.cn", "siliconflow.com", "minimax.chat",
    "minimaxi.com", "minimax.io", "baichuan-ai.com", "lingyiwanwu.com", "sensenova.cn", "xf-yun.com",
)
# Under those, the names of machines people rent and run their own server on (EC2, its load balancers): asked.
SELF_HOSTED_UNDER_CLOUD = ("compute.amazonaws.com", "compute-1.amazonaws.com", "elb.amazonaws.com")


class BadAnswer(Exception):
    """An endpoint answered, but not with a window picoclaw can believe (HTML, a negative or absurd number)."""


@dataclass(frozen=True)
class Told:
    """A window one endpoint reported, and how to name that endpoint."""

    tokens: int
    detail: str


Probe = Callable[[Any, str, str], Awaitable["Told | None"]]  # (client, api_base, model) → told, or None: not there


def _under(host: str, domains: tuple[str, ...]) -> bool:
    return any(host == domain or host.endswith("." + domain) for domain in domains)


def is_cloud_host(api_base: str) -> bool:
    """Whether `api_base` is a known hosted API (not asked; 128,000 assumed)."""
    host = host_of(api_base)
    return _under(host, CLOUD_HOSTS) and not _under(host, SELF_HOSTED_UNDER_CLOUD)


def fallback_window(api_base: str) -> ContextWindow:
    """The window when nothing told it: 8,192 for a server on this machine or its network (or at a bare IP
    address), 128,000 for a known cloud API and any other name on the internet (an unknown hosted API, most
    likely; a self-hosted one that is smaller teaches its window with its first overflow)."""
    host = host_of(api_base)
    if is_cloud_host(api_base):
        return ContextWindow(CLOUD_DEFAULT_WINDOW, "default",
                             f"{host} is a cloud API: {CLOUD_DEFAULT_WINDOW:,} assumed")
    if is_internet_name(api_base):
        return ContextWindow(CLOUD_DEFAULT_WINDOW, "default",
                             f"the server did not report it: {CLOUD_DEFAULT_WINDOW:,} assumed for {host}, on the "
                             "internet")
    where = "a local server" if is_local_host(api_base) else "a server at a bare IP address"
    return ContextWindow(LOCAL_DEFAULT_WINDOW, "default",
                         f"the server did not report it: {LOCAL_DEFAULT_WINDOW:,} assumed for {where}")


def server_root(api_base: str) -> str:
    """The server's root URL: `api_base` without its trailing `/v1` (llama.cpp's /props and Ollama's /api live
    there)."""
    parts = urlsplit(api_base.rstrip("/"))
    path = re.sub(r"/v1$", "", parts.path)
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class ServerWindows:
    """The ContextWindows of one provider+model: asked of the server at the first `current()`, then kept.

    `configured`: config.json's explicit number, or None ("auto"). `deadline` bounds the probe (seconds).
    """

    def __init__(self, *, provider: str, api_base: str, api_key: str, model: str, configured: int | None,
                 deadline: float = PROBE_DEADLINE) -> None:
        self.provider = provider
        self.api_base = api_base
        self.model = model
        self.configured = configured
        self.deadline = deadline
        self._api_key = api_key
        self._window: ContextWindow | None = None
        self._lock: asyncio.Lock | None = None
        self.probes = 0  # times the server was asked (1 at most: tests check it)

    async def current(self) -> ContextWindow:
        if self._window is not None:
            return self._window
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # a second first caller waits for the first one's probe and takes its answer
            if self._window is None:
                self._window = await self._found()
        return self._window

    def learn(self, tokens: int, detail: str = "the server's answer to an over-long request") -> ContextWindow:
        """An overflow answer named the window (or a reply cut short by it, `detail` says which): lower the window to
        it (never raise it) for the rest of the process.

        Before any probe, the overflow is the server's own word: no probe follows, and config.json's number still
        wins when it is the smaller."""
        now = self._window or self._configured()
        if not SANE_WINDOW[0] <= tokens <= SANE_WINDOW[1]:
            log.warning("provider %s: an overflow answer named a context window of %d tokens; ignored", self.provider,
                        tokens)
            return now or fallback_window(self.api_base)
        if now is None or tokens < now.tokens:
            now = ContextWindow(tokens, "overflow", detail)
            log.info("provider %s, model %s: %s; context window %s tokens from now on", self.provider, self.model,
                     detail, f"{tokens:,}")
        self._window = now
        return now

    def learn_from_a_cut_reply(self, tokens: int) -> ContextWindow | None:
        """A reply the server stopped where its context was full (`window_of_a_cut_reply`): learnt only while the
        window is a guess. A server that reported its window, or config.json's number, is not second-guessed: a
        server may also stop a reply at its own cap on output (llama.cpp's --n-predict), which says nothing of it."""
        now = self._window or self._configured()
        if now is not None and now.source != "default":
            return None
        return self.learn(tokens, CUT_BY_THE_WINDOW)

    def _configured(self) -> ContextWindow | None:
        if self.configured is None:
            return None
        return ContextWindow(self.configured, "config", "config.json agents.defaults.context_window")

    async def _found(self) -> ContextWindow:
        configured = self._configured()
        if is_cloud_host(self.api_base):
            return configured or fallback_window(self.api_base)
        told, problems = await self._ask()
        if told is None:
            fallback = configured or fallback_window(self.api_base)
            # One line for the whole probe. A configured number makes the silence unremarkable.
            level = logging.DEBUG if configured else logging.INFO
            log.log(level, "provider %s, model %s: the context window was not reported (%s); using %s tokens (%s)",
                    self.provider, self.model, "; ".join(problems), f"{fallback.tokens:,}", fallback.detail)
            return fallback
        if configured is None:
            log.info("provider %s, model %s: context window %s tokens (%s)", self.provider, self.model,
                     f"{told.tokens:,}", told.detail)
            return ContextWindow(told.tokens, "server", told.detail)
        if told.tokens < configured.tokens:
            log.info("provider %s, model %s: config.json says a context window of %s tokens, but %s reports %s; "
                     "using %s", self.provider, self.model, f"{configured.tokens:,}", told.detail,
                     f"{told.tokens:,}", f"{told.tokens:,}")
            return ContextWindow(told.tokens, "server",
                                 f"{told.detail} (smaller than config.json's {configured.tokens:,})")
        return configured

    async def _ask(self) -> tuple[Told | None, list[str]]:
        """The first telling answer, and why each way told nothing when none did; never raises."""
        self.probes += 1
        try:
            return await self._asked()
        except Exception as exc:  # the client itself could not be made (a SOCKS proxy without socksio …)
            return None, [f"the probe could not start ({type(exc).__name__}: {str(exc)[:120]})"]

    async def _asked(self) -> tuple[Told | None, list[str]]:
        import httpx2  # here, not at import: `picoclaw memory show` never loads it

        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        # Each request may outlast the deadline: only the deadline ends a probe that is held, with one message.
        timeout = httpx2.Timeout(self.deadline + 1)
        # A proxy from the environment is for the internet, not for a server on this machine or network.
        async with httpx2.AsyncClient(timeout=timeout, headers=headers, follow_redirects=False,
                                      trust_env=not is_local_host(self.api_base)) as client:
            tasks = [asyncio.ensure_future(_outcome(probe(client, self.api_base, self.model)))
                     for _, probe in PROBES]
            try:
                told = await _first_told(tasks, self.deadline)
            finally:  # also when the caller is cancelled: no probe outlives the client
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        if told is not None:
            return told, []
        problems = []
        for (name, _), task in zip(PROBES, tasks, strict=True):
            why = f"no answer within {self.deadline:g} s" if task.cancelled() else task.result()[1]
            problems.append(f"{name}: {why}")
        return None, problems


async def _first_told(tasks: Sequence[asyncio.Future[tuple[Told | None, str]]], deadline: float) -> Told | None:
    """The window the first probe to tell reports (each server answers only its own way; among answers that
    arrive together, PROBES order), as soon as it does; None when none has by `deadline` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    pending: set[asyncio.Future[tuple[Told | None, str]]] = set(tasks)
    while pending and (left := end - loop.time()) > 0:
        done, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task in done and (told := task.result()[0]) is not None:
                return told
    # One that finished as the deadline came still counts.
    return next((told for task in tasks if task.done() and (told := task.result()[0]) is not None), None)


async def _outcome(asked: Awaitable[Told | None]) -> tuple[Told | None, str]:
    """What one probe found, or one short reason why not; never raises (a bug in a probe is still logged)."""
    import httpx2

    try:
        told = await asked
    except BadAnswer as exc:
        return None, str(exc)
    except httpx2.HTTPStatusError as exc:
        return None, f"HTTP {exc.response.status_code}"
    except httpx2.TimeoutException:
        return None, "timed out"
    except httpx2.HTTPError as exc:
        return None, f"{type(exc).__name__}"
    except OSError as exc:
        return None, f"{type(exc).__name__}"
    except Exception as exc:  # a reply shaped like nothing expected: the fallback, not a crash
        log.debug("context window probe failed", exc_info=True)
        return None, f"unreadable answer ({type(exc).__name__})"
    return told, "" if told is not None else "not reported"


# -- the ways servers tell it ----------------------------------------------------------------------


def _json(response: Any) -> Any:
    response.raise_for_status()
    try:
        return json.loads(response.content)
    except ValueError:
        kind = response.headers.get("content-type", "").split(";")[0] or "no content type"
        raise BadAnswer(f"not JSON ({kind})") from None


def _window_number(value: Any, what: str) -> int | None:
    """`value` as a window: None when absent, BadAnswer when present but not a believable number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise BadAnswer(f"{what} is not a whole number ({str(value)[:40]!r})")
    if not SANE_WINDOW[0] <= value <= SANE_WINDOW[1]:
        raise BadAnswer(f"{what} is {int(value)}, not a believable window")
    return int(value)


async def llama_cpp_props(client: Any, api_base: str, model: str) -> Told | None:
    data = _json(await client.get(f"{server_root(api_base)}/props"))
    settings = data.get("default_generation_settings") if isinstance(data, dict) else None
    n_ctx = _window_number(settings.get("n_ctx") if isinstance(settings, dict) else None, "n_ctx")
    return Told(n_ctx, "llama.cpp /props") if n_ctx is not None else None


async def ollama_show(client: Any, api_base: str, model: str) -> Told | None:
    data = _json(await client.post(f"{server_root(api_base)}/api/show", json={"model": model}))
    if not isinstance(data, dict) or not isinstance(data.get("model_info"), dict):
        return None
    lengths = [_window_number(value, key) for key, value in data["model_info"].items()
               if isinstance(key, str) and key.endswith(".context_length")]
    trained = min((n for n in lengths if n is not None), default=None)
    parameters = data.get("parameters")
    found = re.search(r"^\s*num_ctx\s+(\S+)", parameters, re.MULTILINE) if isinstance(parameters, str) else None
    if found is not None:
        try:
            num_ctx = _window_number(float(found[1]), "num_ctx")
        except ValueError:
            raise BadAnswer(f"num_ctx is not a number ({found[1][:40]!r})") from None
        runs_with, how = num_ctx, "num_ctx"
    else:
        runs_with, how = OLLAMA_DEFAULT_NUM_CTX, "Ollama's default num_ctx"
    if trained is None and found is None:
        return None
    tokens = min(n for n in (trained, runs_with) if n is not None)
    said = (f"model {trained:,}, " if trained is not None else "") + f"{how} {runs_with:,}"
    return Told(tokens, f"Ollama /api/show ({said})")


def _model_entry(data: Any, model: str, key: str) -> dict[str, Any] | None:
    """The `data` entry of `model` in a model list, or the list's only entry when it has `key` (a server that
    serves one model under another name); None when other models are listed and `model` is not."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    entries = [e for e in entries if isinstance(e, dict)]
    named = [e for e in entries if e.get("id") == model]
    if named:
        return named[0]
    return entries[0] if len(entries) == 1 and key in entries[0] else None


async def lm_studio_models(client: Any, api_base: str, model: str) -> Told | None:
    data = _json(await client.get(f"{server_root(api_base)}/api/v0/models"))
    entry = _model_entry(data, model, "loaded_context_length")
    tokens = _window_number(entry.get("loaded_context_length"), "loaded_context_length") if entry else None
    return Told(tokens, "LM Studio /api/v0/models") if tokens is not None else None


async def vllm_models(client: Any, api_base: str, model: str) -> Told | None:
    data = _json(await client.get(f"{api_base.rstrip('/')}/models"))
    entry = _model_entry(data, model, "max_model_len")
    tokens = _window_number(entry.get("max_model_len"), "max_model_len") if entry else None
    return Told(tokens, "vLLM /v1/models") if tokens is not None else None


# In the order their answers are believed when more than one tells (each server answers only its own way).
PROBES: tuple[tuple[str, Probe], ...] = (
    ("llama.cpp /props", llama_cpp_props),
    ("Ollama /api/show", ollama_show),
    ("LM Studio /api/v0/models", lm_studio_models),
    ("vLLM /v1/models", vllm_models),
)


CUT_BY_THE_WINDOW = "a reply the server cut short where its context was full"


def window_of_a_cut_reply(finish_reason: str | None, usage: Usage | None, max_tokens: int) -> int | None:
    """The window a reply stopped by it shows, or None: llama-cpp-python lowers max_tokens to what the prompt leaves
    without a word, and llama.cpp stops where its context is full, so such a reply ends "length" short of max_tokens
    and its prompt and reply tokens fill the window exactly."""
    if finish_reason != "length" or usage is None or not 0 < usage.completion_tokens < max_tokens:
        return None
    total = usage.prompt_tokens + usage.completion_tokens
    # Context sizes are set in multiples of 256 (2,048, 4,096, 8,192 …); a reply stopped by a cap on its own length
    # almost never sums to one.
    return total if total % 256 == 0 else None
