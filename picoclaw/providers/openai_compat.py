"""The provider for any OpenAI-compatible endpoint (OpenAI, DeepSeek, Ollama, llama.cpp …), on the `openai` client.

Failed requests are re-sent by the rules of `openai_retries.py` (a timed-out one only when the user allows
it); what fails anyway is sorted into a ProviderError kind the agent loop can act on, with one line for the
user. Replies, whole or streamed, are read by `openai_replies.py`.

With `on_text`, a reply is streamed (the user sees it grow; a server that refuses streaming gets one plain
request instead), and the same ChatReply as a plain call comes back at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import openai
import orjson
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from picoclaw.config import AgentDefaults, Config, ProviderConfig, provider_env_name
from picoclaw.errors import ConfigError
from picoclaw.providers.base import ChatReply, ErrorKind, Message, ProviderError, TextSink, ToolChoice, Usage
from picoclaw.providers.context_window import SANE_WINDOW, ServerWindows, window_of_a_cut_reply
from picoclaw.providers.openai_replies import (
    StreamState,
    UnreadableReply,
    added_usage,
    assembled,
    parse_completion,
    take_chunk,
)
from picoclaw.providers.openai_retries import RETRY_STATUSES, retry_delay
from picoclaw.providers.vision import named_for_vision, server_sees_images
from picoclaw.redact import excerpt

VISION_ASK_AGAIN = 600.0  # seconds before a server that did not say whether its model sees is asked again

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_TEXT_TOOL_CALLS = "auto"

# Providers word "prompt too long" differently; OpenAI sets code context_length_exceeded, others don't.
_CONTEXT_TOO_LONG = re.compile(
    r"context[ _]length|maximum context|context window|too many tokens|prompt is too long"
    r"|input is too long|reduce the length", re.IGNORECASE)
# The window an overflow answer names. OpenAI's wording, which vLLM, DeepSeek and llama-cpp-python's server send
# too: "This model's maximum context length is M tokens. However, you requested N tokens …" (llama-cpp-python's
# server turns its library's "Requested tokens (N) exceed context window of M" into it; the library's own text is
# still read, for servers that pass it through). llama.cpp's server sends `n_ctx` beside type
# "exceed_context_size_error" (and says "the available context size (M tokens)").
_WINDOW_IN_MESSAGE = re.compile(r"maximum context length is (\d+)"
                                r"|exceeds? (?:the )?(?:available )?context (?:window|size) (?:of )?\(?(\d+)",
                                re.IGNORECASE)
_LLAMA_CPP_OVERFLOW = "exceed_context_size_error"
_SERVER_MESSAGE_LIMIT = 200

T = TypeVar("T")


class _SinkFailed(Exception):
    """The caller's `on_text` raised: carried past the error sorting and retrying, then re-raised as is."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class OpenAICompatProvider:
    """Chat completions and embeddings through `openai.AsyncOpenAI`; every failure is a ProviderError.

    One instance belongs to one event loop (the client's connection pool does); close it with `aclose()`
    or `async with`. `max_retries` counts re-sends after the first attempt; `retry_timeouts` lets a timed-out
    request be one of them (off by default: see `openai_retries.py`). `text_tool_calls` is the provider
    entry's setting, kept here for the agent loop, which decides whether to read tool calls written as text.
    """

    def __init__(self, *, name: str, api_base: str, api_key: str, defaults: AgentDefaults,
                 timeout: float = DEFAULT_TIMEOUT, max_retries: int = DEFAULT_MAX_RETRIES,
                 retry_timeouts: bool = False, text_tool_calls: str = DEFAULT_TEXT_TOOL_CALLS) -> None:
        self.name = name
        self.api_base = api_base
        self.model = defaults.model
        self.temperature = defaults.temperature
        self.max_tokens = defaults.max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_timeouts = retry_timeouts
        self.text_tool_calls = text_tool_calls
        self._api_key = api_key
        # The client's own retries are off (documented: max_retries=0); `_retrying` decides instead.
        self._client = openai.AsyncOpenAI(base_url=api_base, api_key=api_key, timeout=timeout, max_retries=0)
        # Set once a streamed request was refused and the same request then worked without streaming:
        # later calls go straight to the plain request instead of paying for the refusal every turn.
        self._streaming_refused = False
        # Set once the server refused a request with tool_choice "none" (HTTP 4xx; some vLLM versions accept only
        # "auto" or a named tool): later requests leave tool_choice out, and the background call that asked for
        # "none" reads a tool call in its answer as a failure (providers/base.py `ask_between_turns`).
        self._choice_none_refused = False
        self.vision = defaults.vision
        self._sees_images: bool | None = None  # "auto": what the server said, once it said it
        self._vision_asked_again = 0.0  # when a server that did not say may be asked again (time.monotonic)
        self.last_usage: Usage | None = None
        self.total_usage = Usage(prompt_tokens=0, completion_tokens=0)
        self.calls = 0  # chat calls that returned a reply
        # The windows handed out: every overflow answer that names the window teaches them, whichever call
        # (a turn, a summary, the memory flush) met it.
        self._windows: list[ServerWindows] = []

    def context_windows(self, configured: int | None) -> ServerWindows:
        """This provider+model's context window, asked of its server at the first `current()` (config.json's
        explicit number `configured` wins unless the server runs with a smaller one); this provider's overflow
        answers teach it."""
        windows = ServerWindows(provider=self.name, api_base=self.api_base, api_key=self._api_key, model=self.model,
                                configured=configured)
        self._windows.append(windows)
        return windows

    async def __aenter__(self) -> OpenAICompatProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.close()

    async def chat(self, messages: list[Message], tools: list[dict[str, Any]] | None = None,
                   *, max_tokens: int | None = None, on_text: TextSink | None = None,
                   tool_choice: ToolChoice = "auto") -> ChatReply:
        """One chat completion; tools (with `tool_choice`, "auto" unless told) only when given.

        With `on_text`, the reply is streamed and each content piece goes to `on_text` as it arrives; the
        returned ChatReply is the one a plain call would give. Once a piece was delivered the request is
        never re-sent (the user would see the text twice), whatever fails afterwards. An exception from
        `on_text` itself propagates unchanged.
        """
        # Messages last: everything before them is the same from turn to turn, so each request's bytes
        # begin with the previous request's (bench/prompt_cache.py), and tool schemas lead the prefix.
        body: dict[str, Any] = {
            "model": self.model, "temperature": self.temperature,
            "max_tokens": max_tokens if max_tokens is not None else self.max_tokens,
            **({"tools": tools, **self._tool_choice(tool_choice)} if tools else {}),
            "messages": messages,
        }
        try:
            reply = await (self._plain(body) if on_text is None else self._streamed(body, on_text))
        except _SinkFailed as failed:
            raise failed.error from None
        except UnreadableReply as exc:
            raise self._bad_response(str(exc)) from None
        except ProviderError:
            raise
        except Exception as exc:
            error = self._sorted(exc)
            if error.kind == "bad_response" and body.get("tool_choice") == "none" and _is_status_4xx(exc):
                log.info("provider %s refused tool_choice \"none\" (%s); later requests leave it out", self.name,
                         error)
                self._choice_none_refused = True
            raise error from exc
        self.calls += 1
        self.last_usage = reply.usage
        # A local server that stopped the reply where its context was full has told its window (llama-cpp-python
        # reports none otherwise): the next request is fitted to it, before any overflow.
        cut = window_of_a_cut_reply(reply.finish_reason, reply.usage, body["max_tokens"])
        if cut is not None:
            for windows in self._windows:
                windows.learn_from_a_cut_reply(cut)
        if reply.usage is not None:
            self.total_usage = added_usage(self.total_usage, reply.usage)
        return reply

    def _tool_choice(self, choice: ToolChoice) -> dict[str, Any]:
        """The request's tool_choice field: none once this server refused "none" (see `_choice_none_refused`)."""
        return {} if choice == "none" and self._choice_none_refused else {"tool_choice": choice}

    async def embed(self, texts: list[str], model: str, dimensions: int | None = None) -> list[list[float]]:
        """One vector per text, in order."""
        if not texts:
            return []
        extra: dict[str, Any] = {"dimensions": dimensions} if dimensions is not None else {}
        try:
            # "float" explicitly: the client otherwise asks for base64, which some compatible servers lack.
            result = await self._retrying(lambda: self._client.embeddings.create(
                input=texts, model=model, encoding_format="float", **extra))
        except Exception as exc:
            raise self._sorted(exc) from exc
        data = getattr(result, "data", None)
        if not isinstance(data, list) or len(data) != len(texts):
            raise self._bad_response(f"{len(texts)} embeddings asked for, got "
                                     f"{len(data) if isinstance(data, list) else 'none'}")
        vectors: list[list[float]] = []
        for item in sorted(data, key=lambda d: getattr(d, "index", 0)):
            vector = getattr(item, "embedding", None)
            if not isinstance(vector, list) or not all(isinstance(x, int | float) for x in vector):
                raise self._bad_response("an embedding is not a list of numbers")
            if dimensions is not None and len(vector) != dimensions:
                raise self._bad_response(f"embedding has {len(vector)} dimensions, asked for {dimensions}")
            vectors.append([float(x) for x in vector])
        return vectors

    async def sees_images(self) -> bool:
        """Whether the model can see images: agents.defaults.vision, or with "auto" the server's word or the
        model's name (providers/vision.py), asked once."""
        if isinstance(self.vision, bool):
            return self.vision
        if self._sees_images is None and time.monotonic() >= self._vision_asked_again:
            told = await server_sees_images(self.api_base, self._api_key)
            if told is not None:
                self._sees_images = told
            else:  # not said (no /props, or a server still starting): the name decides, and it is asked again later
                self._vision_asked_again = time.monotonic() + VISION_ASK_AGAIN
            log.info("provider %s, model %s: %s images (%s)", self.name, self.model,
                     "sees" if (told if told is not None else named_for_vision(self.model)) else "does not see",
                     "the server says so" if told is not None else "known by its name")
        return self._sees_images if self._sees_images is not None else named_for_vision(self.model)

    async def transcribe(self, audio: bytes, filename: str, model: str, language: str | None = None) -> str:
        """The words spoken in `audio` (a file named `filename`: its extension tells the format), through the
        endpoint's `/audio/transcriptions`; "" when it heard none."""
        extra: dict[str, Any] = {"language": language} if language else {}
        try:
            result = await self._retrying(lambda: self._client.audio.transcriptions.create(
                model=model, file=(filename, audio), response_format="json", **extra))
        except Exception as exc:
            raise self._sorted(exc) from exc
        text = getattr(result, "text", None)
        if not isinstance(text, str):
            raise self._bad_response("no text in the transcription")
        return text.strip()

    # -- requests ----------------------------------------------------------------------------------

    async def _plain(self, body: dict[str, Any]) -> ChatReply:
        # The client's documented `post` rather than `chat.completions.create`: create() walks every
        # message through its TypedDict transform, ~60 ms for a 200-message history (bench/turn.py),
        # a no-op for our messages, which are already plain JSON. Errors are the same.
        content = request_json(body)
        completion = await self._retrying(
            lambda: self._client.post("/chat/completions", content=content, cast_to=ChatCompletion))
        return parse_completion(completion)

    async def _whole(self, body: dict[str, Any], on_text: TextSink) -> ChatReply:
        """A plain request for a streamed call: its whole text goes to `on_text` in one piece."""
        reply = await self._plain(body)
        if reply.content:
            await _deliver(on_text, reply.content)
        return reply

    async def _streamed(self, body: dict[str, Any], on_text: TextSink) -> ChatReply:
        if self._streaming_refused:
            return await self._whole(body, on_text)
        attempts: list[StreamState] = []  # one per attempt; a retry starts from nothing
        try:
            reply = await self._retrying(lambda: self._stream_once(body, on_text, attempts),
                                         may_retry=lambda: not attempts or not attempts[-1].delivered)
        except openai.APITimeoutError:
            raise
        except openai.APIConnectionError as exc:
            if not attempts or not attempts[-1].answering:
                raise
            raise ProviderError("unavailable", f"the connection to the model provider '{self.name}' was lost during "
                                               "its answer (did the server stop?); nothing of the answer was kept"
                                ) from exc
        except openai.APIStatusError as exc:
            if not self._refuses_streaming(exc):
                raise
            log.info("provider %s refused a streamed request (HTTP %s); asking without streaming",
                     self.name, exc.status_code)
            reply = await self._whole(body, on_text)
            self._streaming_refused = True
            return reply
        if reply is None:  # a 200 that is neither an event stream nor a completion: ask plainly once
            return await self._whole(body, on_text)
        return reply

    async def _stream_once(self, body: dict[str, Any], on_text: TextSink,
                           attempts: list[StreamState]) -> ChatReply | None:
        """One streamed attempt; None when the answer is not an event stream and not a completion either.

        Its state goes on `attempts`, where the retry loop sees whether text was delivered (then it must
        not re-send).
        """
        state = StreamState()
        attempts.append(state)
        # `post` with the client's stream class, for the reason `_plain` gives (create() would also put the
        # messages first in the body, before the tool schemas that never change).
        streamed = {key: value for key, value in body.items() if key != "messages"}
        streamed.update(stream=True, stream_options={"include_usage": True}, messages=body["messages"])
        stream = await self._client.post("/chat/completions", content=request_json(streamed), cast_to=ChatCompletion,
                                         stream=True, stream_cls=openai.AsyncStream[ChatCompletionChunk])
        async with stream:
            state.answering = True
            content_type = stream.response.headers.get("content-type", "")
            if not content_type.startswith("text/event-stream"):
                # The server ignored `stream` (or a proxy answered). A whole completion is used as is:
                # asking again would make a slow server do the same work twice.
                return await self._completion_instead_of_stream(await stream.response.aread(), on_text, state)
            async for chunk in stream:
                piece = take_chunk(chunk, state)
                if piece:
                    state.delivered = True
                    await _deliver(on_text, piece)
        return assembled(state)

    async def _completion_instead_of_stream(self, raw: bytes, on_text: TextSink,
                                            state: StreamState) -> ChatReply | None:
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            return None
        reply = parse_completion(ChatCompletion.construct(**data))
        if reply.content:
            state.delivered = True
            await _deliver(on_text, reply.content)
        return reply

    def _refuses_streaming(self, exc: openai.APIStatusError) -> bool:
        """A 4xx that is about the request as such (a server without streaming says 400 or 404), not the
        key, the rate, nor the conversation's length, which a plain request would hit as well."""
        if not 400 <= exc.status_code < 500 or exc.status_code in RETRY_STATUSES:
            return False
        kind, _ = self._kind_and_message(exc)
        return kind == "bad_response"

    # -- retries -----------------------------------------------------------------------------------

    async def _retrying(self, attempt: Callable[[], Awaitable[T]],
                        may_retry: Callable[[], bool] = lambda: True) -> T:
        """`attempt()`, re-run after a failure that a later attempt may fix, at most `max_retries` times."""
        retries = 0
        while True:
            try:
                return await attempt()
            except Exception as exc:
                delay = (retry_delay(exc, retries, retry_timeouts=self.retry_timeouts)
                         if retries < self.max_retries and may_retry() else None)
                if delay is None:
                    raise
                retries += 1
                log.info("provider %s: %s; retry %d of %d in %.2f s", self.name, type(exc).__name__, retries,
                         self.max_retries, delay)
                await asyncio.sleep(delay)

    # -- errors ------------------------------------------------------------------------------------

    def _bad_response(self, why: str) -> ProviderError:
        return ProviderError("bad_response", f"the model provider '{self.name}' sent a reply picoclaw cannot "
                                             f"read ({why})")

    def _sorted(self, exc: Exception) -> ProviderError:
        """The ProviderError for a failed call: kind by what went wrong, one line, no secret in it; an overflow
        carries the window the server named, if it did."""
        kind, message = self._kind_and_message(exc)
        window = overflow_window(exc) if kind == "context_too_long" else None
        if window is not None:
            for windows in self._windows:
                windows.learn(window)
        return ProviderError(kind, message, window=window)

    def _kind_and_message(self, exc: Exception) -> tuple[ErrorKind, str]:
        who = f"the model provider '{self.name}'"
        if isinstance(exc, openai.APITimeoutError):
            return "unavailable", f"{who} did not answer within {self.timeout:g} s"
        if isinstance(exc, openai.APIConnectionError):
            return "unavailable", f"could not connect to {who} at {self.api_base}"
        if isinstance(exc, openai.APIStatusError):
            status, said = exc.status_code, self._server_message(exc)
            if (exc.code == "context_length_exceeded" or exc.type == _LLAMA_CPP_OVERFLOW
                    or (400 <= status < 500 and _CONTEXT_TOO_LONG.search(said))):
                return "context_too_long", f"the conversation is too long for model '{self.model}': {said}"
            if status in (401, 403):
                # No server text: OpenAI's 401 echoes part of the key.
                return "auth", (f"{who} refused the API key ({status}); check providers.{self.name}.api_key "
                                f"or {provider_env_name(self.name, 'API_KEY')}")
            if status == 429:
                if exc.code == "insufficient_quota":
                    return "rate_limit", f"{who} says the account is out of quota (429): {said}"
                return "rate_limit", f"{who} is rate limiting requests (429) and retrying did not help: {said}"
            if status >= 500 or status == 408:
                return "unavailable", f"{who} is unavailable (HTTP {status}): {said}"
            return "bad_response", f"{who} rejected the request (HTTP {status}): {said}"
        if isinstance(exc, json.JSONDecodeError):  # the body claims to be JSON but is not
            return "bad_response", f"{who} sent a reply picoclaw cannot read (not valid JSON)"
        if isinstance(exc, openai.APIResponseValidationError | ValueError):
            return "bad_response", f"{who} sent a reply picoclaw cannot read ({type(exc).__name__})"
        if isinstance(exc, openai.OpenAIError):
            return "bad_response", f"{who} call failed: {self._excerpt(str(exc))}"
        raise exc  # a bug here, not a provider failure: let it surface with its traceback

    def _server_message(self, exc: openai.APIStatusError) -> str:
        body = exc.body
        said = body.get("message") if isinstance(body, dict) else None
        return self._excerpt(validation_summary(str(said or exc.message or ""))) or "no message"

    def _excerpt(self, text: str) -> str:
        # Applied to text from outside only (our own wording may contain a placeholder key: provider
        # 'ollama'). Redacted before it is cut: a cut key would no longer be found.
        return excerpt(text, _SERVER_MESSAGE_LIMIT, [self._api_key])


# pydantic's error dump, as llama-cpp-python's server answers a request it cannot validate:
# "7 validation errors: {'type': 'literal_error', 'loc': ('body', 'messages', 2, …), 'msg': "…", …} {…}"
_VALIDATION_DUMP = re.compile(r"^(\d+) validation errors?\b")
_VALIDATION_ERROR = re.compile(r"'type': '(?P<type>[a-z_]+)', 'loc': \((?P<loc>[^)]*)\), "
                               r"'msg': (?P<q>['\"])(?P<msg>.*?)(?P=q)")


def request_json(body: dict[str, Any]) -> bytes:
    """A request's body as the client would send it (compact UTF-8 JSON, keys in order), by orjson: a twentieth of
    the standard library's time for a long history (bench/turn.py). What orjson refuses (an integer past 64 bits in
    a tool's schema) is encoded by the standard library, as the client itself would."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def validation_summary(said: str) -> str:
    """A server's pydantic validation dump as one readable line: how many errors and the telling one.

    The dump lists, for each message, one error per role it failed to be; "Input should be 'system'" for
    an assistant message says nothing, so an error that is not about a literal value is named first.
    """
    count = _VALIDATION_DUMP.match(said)
    errors = list(_VALIDATION_ERROR.finditer(said)) if count else []
    if count is None or not errors:
        return said
    telling = next((e for e in errors if e["type"] != "literal_error"), errors[0])
    where = ".".join(part.strip().strip("'\"") for part in telling["loc"].split(",") if part.strip()
                     and part.strip().strip("'\"") not in ("body", "typed-dict"))
    return f"the request did not validate ({count[1]} errors; {where}: {telling['msg']})"


def overflow_window(exc: Exception) -> int | None:
    """The context window an over-long request's refusal names (llama.cpp's `n_ctx`; "maximum context length is
    M", as OpenAI, vLLM, DeepSeek and llama-cpp-python's server word it; "exceed context window of M"), or None."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    body = exc.body
    n_ctx = body.get("n_ctx") if isinstance(body, dict) else None
    if isinstance(n_ctx, int) and not isinstance(n_ctx, bool):
        window: int | None = n_ctx
    else:
        said = body.get("message") if isinstance(body, dict) else None
        found = _WINDOW_IN_MESSAGE.search(str(said or exc.message or ""))
        window = int(found[1] or found[2]) if found else None
    # A number no window can be is a misreading: the overflow is still sorted as one, without a window to learn.
    return window if window is not None and SANE_WINDOW[0] <= window <= SANE_WINDOW[1] else None


def from_config(config: Config, provider_name: str | None = None, *, timeout: float | None = None,
                max_retries: int | None = None, model: str | None = None) -> OpenAICompatProvider:
    """The provider named by `agents.defaults.provider` (or `provider_name`), checked before any call.

    `timeout` and `max_retries` given here win over the provider entry (an embedder wants its own short
    timeout); otherwise the entry's values (defaults 60 s and 3) apply. Timed-out requests are re-sent only
    when the entry sets `max_retries` itself: that is the user saying re-sending is fine for this server.
    `model`: this client's model instead of agents.defaults' (agents.background's).
    """
    name = provider_name or config.agents.defaults.provider
    entry = config.providers.get(name)
    if entry is None:
        known = ", ".join(sorted(config.providers)) or "none"
        raise ConfigError(f"provider '{name}' is not in config.json providers (known: {known})")
    api_base = config.api_base_for(name)
    if not api_base:
        raise ConfigError(f"provider '{name}' has no api_base: set providers.{name}.api_base in config.json or "
                          f"the {provider_env_name(name, 'API_BASE')} environment variable")
    api_key = config.api_key_for(name)
    if not api_key:
        raise ConfigError(f"provider '{name}' has no API key: set providers.{name}.api_key in config.json or "
                          f"the {provider_env_name(name, 'API_KEY')} environment variable (a local server such as "
                          "Ollama accepts any non-empty placeholder)")
    defaults = config.agents.defaults if model is None else config.agents.defaults.model_copy(update={"model": model})
    return OpenAICompatProvider(
        name=name, api_base=api_base, api_key=api_key, defaults=defaults,
        timeout=entry.timeout if timeout is None else timeout,
        max_retries=entry.max_retries if max_retries is None else max_retries,
        retry_timeouts=_user_set_retries(entry), text_tool_calls=entry.text_tool_calls)


def _user_set_retries(entry: ProviderConfig) -> bool:
    """Whether config.json itself has `max_retries` for this provider (not just the default)."""
    return "max_retries" in entry.model_fields_set


# -- helpers -----------------------------------------------------------------------------------------


async def _deliver(on_text: TextSink, piece: str) -> None:
    """Hand a piece to the caller; its failure is marked so it is neither sorted nor retried."""
    try:
        await on_text(piece)
    except Exception as exc:
        raise _SinkFailed(exc) from exc


def _is_status_4xx(exc: Exception) -> bool:
    """An HTTP 4xx answer: the server refused the request as such (not a failure a retry would mend)."""
    return isinstance(exc, openai.APIStatusError) and 400 <= exc.status_code < 500
