"""The provider for any OpenAI-compatible endpoint (OpenAI, DeepSeek, Qwen, Ollama …), on the `openai` client.

Retries are the client's: it retries 408/409/429/5xx, timeouts and connection errors with exponential
backoff and honours `retry-after`/`retry-after-ms`. What reaches this module is a failure that retrying
did not fix; it is sorted into a ProviderError kind the agent loop can act on, with one line for the user.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from picoclaw.config import AgentDefaults, Config, provider_env_name
from picoclaw.errors import ConfigError
from picoclaw.providers.base import ChatReply, ErrorKind, Message, ProviderError, ToolCall, Usage

DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 3

# Providers word "prompt too long" differently; OpenAI sets code context_length_exceeded, others don't.
_CONTEXT_TOO_LONG = re.compile(
    r"context[ _]length|maximum context|context window|too many tokens|prompt is too long"
    r"|input is too long|reduce the length", re.IGNORECASE)
_SERVER_MESSAGE_LIMIT = 200
_SECRET_MIN_LENGTH = 8


class OpenAICompatProvider:
    """Chat completions and embeddings through `openai.AsyncOpenAI`; every failure is a ProviderError.

    One instance belongs to one event loop (the client's connection pool does); close it with `aclose()`
    or `async with`.
    """

    def __init__(self, *, name: str, api_base: str, api_key: str, defaults: AgentDefaults,
                 timeout: float = DEFAULT_TIMEOUT, max_retries: int = DEFAULT_MAX_RETRIES) -> None:
        self.name = name
        self.api_base = api_base
        self.model = defaults.model
        self.temperature = defaults.temperature
        self.max_tokens = defaults.max_tokens
        self.timeout = timeout
        self._api_key = api_key
        self._client = openai.AsyncOpenAI(base_url=api_base, api_key=api_key, timeout=timeout,
                                          max_retries=max_retries)
        self.last_usage: Usage | None = None
        self.total_usage = Usage(prompt_tokens=0, completion_tokens=0)
        self.calls = 0  # chat calls that returned a reply

    async def __aenter__(self) -> OpenAICompatProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.close()

    async def chat(self, messages: list[Message], tools: list[dict[str, Any]] | None = None,
                   *, max_tokens: int | None = None) -> ChatReply:
        """One chat completion; tools (with tool_choice "auto") only when given."""
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "temperature": self.temperature,
            "max_tokens": max_tokens if max_tokens is not None else self.max_tokens,
            **({"tools": tools, "tool_choice": "auto"} if tools else {}),
        }
        try:
            # The client's documented `post` rather than `chat.completions.create`: create() walks every
            # message through its TypedDict transform, ~60 ms for a 200-message history (bench/turn.py),
            # a no-op for our messages, which are already plain JSON. Retries and errors are the same.
            completion = await self._client.post("/chat/completions", body=body, cast_to=ChatCompletion)
        except Exception as exc:
            raise self._sorted(exc) from exc
        reply = self._parse_completion(completion)
        self.calls += 1
        self.last_usage = reply.usage
        if reply.usage is not None:
            self.total_usage = Usage(self.total_usage.prompt_tokens + reply.usage.prompt_tokens,
                                     self.total_usage.completion_tokens + reply.usage.completion_tokens)
        return reply

    async def embed(self, texts: list[str], model: str, dimensions: int | None = None) -> list[list[float]]:
        """One vector per text, in order."""
        if not texts:
            return []
        extra: dict[str, Any] = {"dimensions": dimensions} if dimensions is not None else {}
        try:
            # "float" explicitly: the client otherwise asks for base64, which some compatible servers lack.
            result = await self._client.embeddings.create(input=texts, model=model, encoding_format="float",
                                                          **extra)
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

    # -- replies -----------------------------------------------------------------------------------

    def _parse_completion(self, completion: object) -> ChatReply:
        # The client does not validate bodies (non-strict mode) and returns plain text for non-JSON
        # replies, so the shape is checked here rather than trusted.
        choices = getattr(completion, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise self._bad_response("no choices")
        choice = choices[0]
        message = getattr(choice, "message", None)
        if message is None:
            raise self._bad_response("no message")
        content = getattr(message, "content", None)
        if content is not None and not isinstance(content, str):
            raise self._bad_response("content is not text")
        calls = [self._tool_call(call, i) for i, call in enumerate(getattr(message, "tool_calls", None) or [])]
        usage = getattr(completion, "usage", None)
        prompt = getattr(usage, "prompt_tokens", None)
        produced = getattr(usage, "completion_tokens", None)
        return ChatReply(
            content=content, tool_calls=calls,
            usage=Usage(prompt, produced) if isinstance(prompt, int) and isinstance(produced, int) else None,
            finish_reason=getattr(choice, "finish_reason", None))

    def _tool_call(self, call: object, position: int) -> ToolCall:
        function = getattr(call, "function", None)
        name = getattr(function, "name", None)
        if not isinstance(name, str) or not name:
            raise self._bad_response("a tool call has no function name")
        arguments = getattr(function, "arguments", None)
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):
            # Some servers (older Ollama) send an object; the loop expects the JSON text.
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = getattr(call, "id", None)
        # The id must be present to pair the tool result with the call in the next request.
        return ToolCall(id=call_id if isinstance(call_id, str) and call_id else f"call_{position}",
                        name=name, arguments=arguments)

    # -- errors ------------------------------------------------------------------------------------

    def _bad_response(self, why: str) -> ProviderError:
        return ProviderError("bad_response", f"the model provider '{self.name}' sent a reply picoclaw cannot "
                                             f"read ({why})")

    def _sorted(self, exc: Exception) -> ProviderError:
        """The ProviderError for a failed call: kind by what went wrong, one line, no secret in it."""
        kind, message = self._kind_and_message(exc)
        return ProviderError(kind, message)

    def _kind_and_message(self, exc: Exception) -> tuple[ErrorKind, str]:
        who = f"the model provider '{self.name}'"
        if isinstance(exc, openai.APITimeoutError):
            return "unavailable", f"{who} did not answer within {self.timeout:g} s"
        if isinstance(exc, openai.APIConnectionError):
            return "unavailable", f"could not connect to {who} at {self.api_base}"
        if isinstance(exc, openai.APIStatusError):
            status, said = exc.status_code, self._server_message(exc)
            if exc.code == "context_length_exceeded" or (400 <= status < 500 and _CONTEXT_TOO_LONG.search(said)):
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
            return "bad_response", f"{who} call failed: {self._redact(' '.join(str(exc).split()))}"
        raise exc  # a bug here, not a provider failure: let it surface with its traceback

    def _server_message(self, exc: openai.APIStatusError) -> str:
        body = exc.body
        said = body.get("message") if isinstance(body, dict) else None
        text = self._redact(" ".join(str(said or exc.message or "").split()))  # one line
        return text[:_SERVER_MESSAGE_LIMIT] + ("…" if len(text) > _SERVER_MESSAGE_LIMIT else "") or "no message"

    def _redact(self, text: str) -> str:
        # Applied to text from outside only. Short keys are placeholders ("ollama", "x"): replacing them
        # would garble ordinary words, and our own wording may contain one (provider 'ollama').
        return text.replace(self._api_key, "***") if len(self._api_key) >= _SECRET_MIN_LENGTH else text


def from_config(config: Config, provider_name: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                max_retries: int = DEFAULT_MAX_RETRIES) -> OpenAICompatProvider:
    """The provider named by `agents.defaults.provider` (or `provider_name`), checked before any call."""
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
    return OpenAICompatProvider(name=name, api_base=api_base, api_key=api_key,
                                defaults=config.agents.defaults, timeout=timeout, max_retries=max_retries)
