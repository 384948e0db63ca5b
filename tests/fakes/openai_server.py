"""A real local HTTP server that speaks the OpenAI Chat Completions and Embeddings protocol.

Tests point the official `openai` client (through picoclaw's provider) at it, script what it answers,
and read back what it was sent:

    with FakeOpenAIServer() as server:
        server.reply_tool_calls([("memory_append", {"content": "喜欢绿茶", "slot": "long_term"})])
        server.reply_text("记住了 / noted")
        ...  # talk to server.base_url
        assert server.chat_requests()[0]["model"] == "gpt-4o-mini"

Chat requests take scripted replies from a FIFO queue; when it is empty, `responder(request_json)` answers
if set, else the text "ok". GET /v1/models lists `models` (an error or a raw body can be scripted for it).
Embedding requests get deterministic vectors unless an error is scripted for
them; `hold_embeddings` (until released) or `delay_embeddings` (for so many seconds) make chosen ones wait.
The server runs aiohttp on its own event loop in a background thread, so sync tests and tests that
run their own `asyncio.run` can both use it. Like the real API it rejects malformed requests (bad message
order around tool calls, `tool_choice` without `tools`, `stream_options` without `stream`, empty embedding
input) with a 400, so code that would fail against OpenAI fails here too; pass `validate=False` to turn
that off.

A request with `"stream": true` gets the scripted reply as server-sent events, the way OpenAI sends them:
`chat.completion.chunk`s with the text in pieces of a few characters (so a test sees more than one piece),
tool calls as deltas (index, id and name first, then argument fragments), a chunk with the finish reason,
a usage chunk when `stream_options.include_usage` is set, then `data: [DONE]`. Two switches mimic servers
met in the wild: `streaming=False` answers any streamed request with a 400 "streaming is not supported"
(leaving the scripted reply for the plain request that should follow), and `strict_content=True` answers
an assistant message with `content: null` beside `tool_calls` with a 500, as llama.cpp's server does.

A context window: `window` (tokens) makes the server refuse a chat request whose prompt is longer, as
llama.cpp does (`overflow="llama.cpp"`: HTTP 400, type `exceed_context_size_error` with `n_prompt_tokens` and
`n_ctx`) or llama-cpp-python's server does (`overflow="llama-cpp-python"`: HTTP 400, code
`context_length_exceeded`, "This model's maximum context length is M tokens. However, you requested …", as its
llama_cpp/server/errors.py words it). The prompt is counted by `window_tokens` (a deterministic rule: 4 per
message, `rough_tokens` of each text and of the tool schemas' JSON), reported as `usage.prompt_tokens` too, and
every chat request's count is kept in `prompt_counts`. `kind` says which way the server tells its window:
"llama.cpp" (`GET /props`), "vllm" (`max_model_len` in `GET /v1/models`), "ollama" (`POST /api/show`),
"lm-studio" (`GET /api/v0/models`), or "none" (those paths answer 404, as on a server that has none of them).
Each of those answers can be scripted (`endpoint="props"`, `"show"`, `"lm_models"`, `"models"`) to play a broken server.

Audio transcription: POST /v1/audio/transcriptions takes the multipart form the `openai` client sends
(`client.audio.transcriptions.create(model=..., file=(name, data), language=..., response_format=...)`) and
answers with the next `reply_transcript` (`endpoint="transcription"` for errors, garbage and raw bodies), else with
`transcriber(request)` if set, else a 500 "no scripted transcription". `transcription_requests()` gives what
each request sent. As OpenAI does, a file whose name has no supported audio extension gets a 400 "Invalid file
format" (unless `validate=False`), a request without model or file a 400, and a body over 25 MB a 413.
`response_format` "text", "srt" or "vtt" gets the text as a plain body; "verbose_json" adds language and duration.
"""

from __future__ import annotations

import base64
import email.message
import email.policy
import hashlib
import json
import math
import re
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from aiohttp import web

from tests.fakes.http_server import BackgroundHTTPServer

Endpoint = Literal["chat", "embeddings", "models", "props", "show", "lm_models", "transcription"]
ServerKind = Literal["llama.cpp", "vllm", "ollama", "lm-studio", "none"]
OverflowStyle = Literal["llama.cpp", "llama-cpp-python"]
UsageSpec = Mapping[str, int] | Literal[False] | None  # None: estimate; False: leave `usage` out
STREAM_PIECE_CHARS = 3  # characters of text per streamed delta
STREAM_ARGUMENT_CHARS = 7  # characters of tool-call arguments per streamed delta


@dataclass(frozen=True)
class Text:
    """A plain assistant answer.

    `cached_tokens` adds `usage.prompt_tokens_details.cached_tokens` (OpenAI's prompt-cache report);
    `chunk_delay` is the pause before each streamed chunk after the first piece of text, as a slow server
    writes tokens (the role chunk and the first piece go out at once, so a client sees text before a stall).
    `cut_after` streams only that many pieces of text, then drops the connection: a server killed mid-answer.
    `until` holds the answer until that event is set (at most HOLD_LIMIT seconds): a test that needs one
    request answered after something else happened says so, instead of hoping a delay is long enough.
    """

    text: str
    usage: UsageSpec = None
    delay: float = 0.0
    until: threading.Event | None = None
    finish_reason: str = "stop"
    cached_tokens: int | None = None
    chunk_delay: float = 0.0
    cut_after: int | None = None


@dataclass(frozen=True)
class ToolCalls:
    """An assistant turn that calls tools; a `str` argument is sent as is (it may be malformed JSON).

    `cached_tokens` and `chunk_delay` work as for Text.
    """

    calls: Sequence[tuple[str, Mapping[str, Any] | str]]
    content: str | None = None
    usage: UsageSpec = None
    delay: float = 0.0
    cached_tokens: int | None = None
    chunk_delay: float = 0.0


@dataclass(frozen=True)
class Error:
    """An OpenAI-shaped error body: {"error": {"message", "type", "param", "code"}}."""

    status: int
    message: str
    code: str | None = None
    headers: Mapping[str, str] | None = None
    delay: float = 0.0


@dataclass(frozen=True)
class Raw:
    """Any body at all, for replies the client must cope with (garbage, odd provider dialects)."""

    body: str | Mapping[str, Any] | list[Any]
    status: int = 200
    content_type: str = "application/json"
    delay: float = 0.0


Reply = Text | ToolCalls | Error | Raw
HOLD_LIMIT = 30.0  # seconds a held reply waits at most: a test whose release never comes fails, not hangs
GARBAGE = "<html><body><h1>502 Bad Gateway</h1>nginx</body></html>"
TRANSCRIPTION_LIMIT = 25 * 1024 * 1024  # bytes: OpenAI's limit for an audio upload
AUDIO_FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav", "webm")  # what OpenAI takes
NO_TRANSCRIPTION = "no scripted transcription: call reply_transcript() or set transcriber first"


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it; `json` is None when the body was not JSON."""

    path: str
    headers: dict[str, str]  # lower-cased names
    json: Any
    received_at: float = field(default_factory=time.monotonic)
    raw: bytes = b""  # the body's bytes as they came (what a prompt cache would compare)


class FakeOpenAIServer(BackgroundHTTPServer):
    """OpenAI-compatible HTTP server on 127.0.0.1 (free port); use as a context manager."""

    name = "fake-openai"

    def __init__(self, *, api_key: str | None = None, validate: bool = True,
                 default_dimensions: int = 16, streaming: bool = True, strict_content: bool = False,
                 kind: ServerKind = "none", window: int | None = None,
                 overflow: OverflowStyle = "llama.cpp") -> None:
        super().__init__()
        self.api_key = api_key  # when set, any other bearer token gets a 401 like OpenAI's
        self.validate = validate
        self.streaming = streaming  # False: a streamed request gets a 400, like a server without streaming
        self.strict_content = strict_content  # True: an assistant message with content null is a 500 (llama.cpp)
        self.default_dimensions = default_dimensions
        self.kind: ServerKind = kind  # which way it reports `window` (see the module's docstring)
        self.window = window  # None: no window, every prompt is taken
        self.overflow: OverflowStyle = overflow
        # Each chat request's body, or its count where the window needed it at once: a server without a window counts
        # when `prompt_counts` is read, so bench/turn.py's round trips do not include counting a 400-message prompt
        # in this thread (about a millisecond of the GIL the client waits for) that nobody reads.
        self._prompted: list[dict[str, Any] | int] = []
        self.models: list[str] = ["gpt-4o-mini"]  # what GET /v1/models lists (unless a reply is scripted for it)
        self.responder: Callable[[dict[str, Any]], Reply | str] | None = None
        # Answers a transcription request (as `transcription_requests()` shows it) when nothing is queued for it.
        self.transcriber: Callable[[dict[str, Any]], Reply | str] | None = None
        self.embedder: Callable[[str, int], list[float]] | None = None
        # An embeddings request whose inputs this picks waits until `release_embeddings()` (a slow endpoint
        # without real waiting), at most HOLD_LIMIT seconds, so a test of code that blocks fails, not hangs.
        self.hold_embeddings: Callable[[list[str]], bool] | None = None
        # Seconds an embeddings request waits before answering, chosen by its inputs (a slow endpoint that
        # really is slow, for a benchmark); None or 0: at once.
        self.delay_embeddings: Callable[[list[str]], float] | None = None
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._queues: dict[Endpoint, deque[Reply]] = {
            name: deque() for name in ("chat", "embeddings", "models", "props", "show", "lm_models", "transcription")}
        self._requests: list[RecordedRequest] = []
        self._transcriptions: list[dict[str, Any]] = []
        self._counter = 0

    # -- scripting ---------------------------------------------------------------------------------

    def reply_text(self, text: str, *, usage: UsageSpec = None, delay: float = 0.0,
                   finish_reason: str = "stop", cached_tokens: int | None = None, chunk_delay: float = 0.0) -> None:
        self.enqueue(Text(text, usage=usage, delay=delay, finish_reason=finish_reason,
                          cached_tokens=cached_tokens, chunk_delay=chunk_delay))

    def reply_tool_calls(self, calls: Sequence[tuple[str, Mapping[str, Any] | str]], *,
                         content: str | None = None, usage: UsageSpec = None, delay: float = 0.0,
                         cached_tokens: int | None = None) -> None:
        self.enqueue(ToolCalls(list(calls), content=content, usage=usage, delay=delay, cached_tokens=cached_tokens))

    def reply_transcript(self, text: str, *, delay: float = 0.0, until: threading.Event | None = None) -> None:
        """The next transcription request's answer: {"text": text} (or the plain text, as its response_format
        asks). `until` holds it until that event is set, as for a chat reply."""
        self.enqueue(Text(text, delay=delay, until=until), "transcription")

    def reply_error(self, status: int, message: str, code: str | None = None,
                    headers: Mapping[str, str] | None = None, *, delay: float = 0.0,
                    endpoint: Endpoint = "chat") -> None:
        self.enqueue(Error(status, message, code=code, headers=headers, delay=delay), endpoint)

    def reply_garbage(self, *, delay: float = 0.0, endpoint: Endpoint = "chat") -> None:
        """A 200 whose body is an HTML page, as a misconfigured proxy would send."""
        self.enqueue(Raw(GARBAGE, content_type="text/html", delay=delay), endpoint)

    def reply_raw(self, body: str | Mapping[str, Any] | list[Any], *, status: int = 200,
                  content_type: str = "application/json", delay: float = 0.0,
                  endpoint: Endpoint = "chat") -> None:
        self.enqueue(Raw(body, status=status, content_type=content_type, delay=delay), endpoint)

    def enqueue(self, reply: Reply, endpoint: Endpoint = "chat") -> None:
        with self._lock:
            self._queues[endpoint].append(reply)

    def pending(self, endpoint: Endpoint = "chat") -> int:
        """Scripted replies not used yet (a test can assert the code made every expected call)."""
        with self._lock:
            return len(self._queues[endpoint])

    # -- what was sent -----------------------------------------------------------------------------

    @property
    def prompt_counts(self) -> list[int]:
        """Each chat request's prompt tokens (by `window_tokens`), refused ones too, oldest first."""
        with self._lock:
            prompted = list(self._prompted)
        return [entry if isinstance(entry, int) else window_tokens(entry) for entry in prompted]

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def chat_requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of every chat completion request, oldest first."""
        return [r.json for r in self.requests if r.path.endswith("/chat/completions")]

    def embedding_requests(self) -> list[dict[str, Any]]:
        return [r.json for r in self.requests if r.path.endswith("/embeddings")]

    def transcription_requests(self) -> list[dict[str, Any]]:
        """Each transcription request, oldest first (refused ones too): "model", "language", "response_format"
        and "prompt" (None when not sent), and the file part's "filename", "content_type", "size" and "data"
        (None and 0 and b"" without one)."""
        with self._lock:
            return [dict(entry) for entry in self._transcriptions]

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """What to give the client as `base_url` / config `api_base`."""
        return f"{self.origin}/v1"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/audio/transcriptions", self._transcription)
        app.router.add_get("/props", partial(self._told, "props", "llama.cpp"))
        app.router.add_post("/api/show", partial(self._told, "show", "ollama"))
        app.router.add_get("/api/v0/models", partial(self._told, "lm_models", "lm-studio"))

    # -- handlers ----------------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        refused = self._check_auth(request) or self._check_chat(body)
        if refused is not None:
            return refused
        streamed = bool(body.get("stream"))
        if streamed and not self.streaming:  # before taking a reply: the plain retry should get it
            return _bad_request("streaming is not supported")
        if self.window is not None:
            tokens = window_tokens(body)
            with self._lock:
                self._prompted.append(tokens)
            if tokens > self.window:  # before taking a reply: the retry should get it
                return _overflow(self.overflow, tokens, self.window, body.get("max_tokens"))
        else:
            with self._lock:
                self._prompted.append(body)
        scripted = self._next("chat")
        if scripted is None:
            responder = self.responder
            answered = responder(body) if responder is not None else Text("ok")
            scripted = Text(answered) if isinstance(answered, str) else answered
        reply: Reply = scripted
        await self.pause(reply.delay)
        if isinstance(reply, Text) and reply.until is not None:
            await self._held(reply.until)
        if isinstance(reply, Error | Raw):
            return _render(reply)
        if streamed:
            return await self._stream(request, body, reply)
        return _json(self._completion(body, reply))

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        refused = self._check_auth(request) or self._check_embeddings(body)
        if refused is not None:
            return refused
        scripted = self._next("embeddings")
        if scripted is not None:
            await self.pause(scripted.delay)
            return _render(scripted) if isinstance(scripted, Error | Raw) else _bad_request(
                "only errors and raw bodies can be scripted for embeddings")
        inputs = [body["input"]] if isinstance(body["input"], str) else list(body["input"])
        if self.hold_embeddings is not None and self.hold_embeddings(inputs):
            await self._held(self._released)
        if self.delay_embeddings is not None:
            await self.pause(self.delay_embeddings(inputs))
        dimensions = body.get("dimensions") or self.default_dimensions
        embed = self.embedder or default_embedding
        base64_wanted = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(inputs):
            vector = [float(x) for x in embed(text, dimensions)]
            encoded: Any = (base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
                            if base64_wanted else vector)
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(rough_tokens(text) for text in inputs)
        return _json({"object": "list", "data": data, "model": body["model"],
                      "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def _models(self, request: web.Request) -> web.Response:
        await self._record(request)
        refused = self._check_auth(request)
        if refused is not None:
            return refused
        scripted = self._next("models")
        if scripted is not None:
            await self.pause(scripted.delay)
            return _render(scripted) if isinstance(scripted, Error | Raw) else _bad_request(
                "only errors and raw bodies can be scripted for models")
        told = {"max_model_len": self.window} if self.kind == "vllm" and self.window is not None else {}
        return _json({"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "fake",
                                                  **told} for name in self.models]})

    async def _transcription(self, request: web.Request) -> web.Response:
        """POST /v1/audio/transcriptions: a multipart form with the audio file, answered as OpenAI's Whisper does."""
        try:
            raw = await request.clone(client_max_size=TRANSCRIPTION_LIMIT).read()
        except web.HTTPRequestEntityTooLarge:
            return _render(Error(413, f"Maximum content size limit ({TRANSCRIPTION_LIMIT}) exceeded."))
        headers = {name.lower(): value for name, value in request.headers.items()}
        fields, files = _multipart(request.headers.get("Content-Type", ""), raw)
        upload = files.get("file")
        entry: dict[str, Any] = {
            "model": fields.get("model"), "language": fields.get("language"),
            "response_format": fields.get("response_format"), "prompt": fields.get("prompt"),
            "filename": upload[0] if upload else None, "content_type": upload[1] if upload else None,
            "size": len(upload[2]) if upload else 0, "data": upload[2] if upload else b""}
        with self._lock:
            self._requests.append(RecordedRequest(request.path, headers, None, raw=raw))
            self._transcriptions.append(entry)
        refused = self._check_auth(request) or self._check_transcription(entry)
        if refused is not None:
            return refused
        scripted = self._next("transcription")
        if scripted is None:
            transcriber = self.transcriber
            if transcriber is None:
                return _render(Error(500, NO_TRANSCRIPTION))
            answered = transcriber(dict(entry))
            scripted = Text(answered) if isinstance(answered, str) else answered
        await self.pause(scripted.delay)
        if isinstance(scripted, Text) and scripted.until is not None:
            await self._held(scripted.until)
        if isinstance(scripted, Error | Raw):
            return _render(scripted)
        if not isinstance(scripted, Text):
            return _bad_request("only text, errors and raw bodies can be scripted for transcriptions")
        form = entry["response_format"] or "json"
        if form in ("text", "srt", "vtt"):
            return web.Response(text=scripted.text, content_type="text/plain", charset="utf-8")
        if form == "verbose_json":
            return _json({"task": "transcribe", "language": entry["language"] or "english", "duration": 3.0,
                          "text": scripted.text, "segments": []})
        return _json({"text": scripted.text})

    def _check_transcription(self, entry: dict[str, Any]) -> web.Response | None:
        if not entry["model"]:
            return _bad_request("you must provide a model parameter")
        if entry["filename"] is None:
            return _bad_request("1 validation error for Request\nbody -> file\n  field required "
                                "(type=value_error.missing)")
        form = entry["response_format"]
        if form is not None and form not in ("json", "text", "srt", "verbose_json", "vtt"):
            return _bad_request(f"'{form}' is not one of ['json', 'text', 'srt', 'verbose_json', 'vtt'] - "
                                "'response_format'")
        extension = str(entry["filename"]).rsplit(".", 1)[-1].lower() if "." in str(entry["filename"]) else ""
        if self.validate and extension not in AUDIO_FORMATS:
            return _bad_request(f"Invalid file format. Supported formats: {list(AUDIO_FORMATS)}")
        return None

    async def _told(self, endpoint: Endpoint, kind: ServerKind, request: web.Request) -> web.Response:
        """llama.cpp's /props, Ollama's /api/show, LM Studio's /api/v0/models: the window, when the server is of
        that kind; a 404 otherwise, as a server without that path answers."""
        body = await self._record(request)
        scripted = self._next(endpoint)
        if scripted is not None:
            await self.pause(scripted.delay)  # a server that never answers: a delay past the client's timeout
            return _render(scripted) if isinstance(scripted, Error | Raw) else _bad_request(
                "only errors and raw bodies can be scripted for this path")
        if self.kind != kind or self.window is None:
            return web.Response(status=404, text="404: Not Found")
        model = self.models[0] if self.models else "fake-model"
        if kind == "llama.cpp":
            return _json({"default_generation_settings": {"n_ctx": self.window, "temperature": 0.8},
                          "total_slots": 1, "model_path": f"/models/{model}.gguf"})
        if kind == "ollama":
            asked = body.get("model") or body.get("name") if isinstance(body, dict) else None
            if asked not in self.models:
                return _json({"error": f"model '{asked}' not found"}, status=404)
            # The model could hold more; the server runs it with num_ctx, the window that counts.
            return _json({"parameters": f'num_ctx                        {self.window}\nstop "<|im_end|>"',
                          "model_info": {"general.architecture": "qwen2", "qwen2.context_length": 32768}})
        return _json({"object": "list", "data": [
            {"id": name, "object": "model", "type": "llm", "state": "loaded", "max_context_length": 32768,
             "loaded_context_length": self.window} for name in self.models]})

    def release_embeddings(self) -> None:
        """Let every held embeddings request (and any later one) answer."""
        self._released.set()

    async def _held(self, released: threading.Event) -> None:
        """Wait until `released` is set, the server stops, or HOLD_LIMIT seconds have passed."""
        deadline = time.monotonic() + HOLD_LIMIT
        while not released.is_set() and not self.stopping() and time.monotonic() < deadline:
            await self.pause(0.005)

    async def _record(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in request.headers.items()}
        with self._lock:
            self._requests.append(RecordedRequest(request.path, headers, body, raw=raw))
        return body

    def _next(self, endpoint: Endpoint) -> Reply | None:
        with self._lock:
            queue = self._queues[endpoint]
            return queue.popleft() if queue else None

    def _check_auth(self, request: web.Request) -> web.Response | None:
        if self.api_key is None:
            return None
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if given == self.api_key:
            return None
        # OpenAI echoes a masked key; the provider must still never show any of it to the user.
        masked = f"{given[:3]}{'*' * max(len(given) - 7, 0)}{given[-4:]}" if len(given) > 7 else given
        return _render(Error(401, f"Incorrect API key provided: {masked}. You can find your API key at "
                                  "https://platform.openai.com/account/api-keys.", code="invalid_api_key"))

    def _check_chat(self, body: Any) -> web.Response | None:
        if not isinstance(body, dict):
            return _bad_request("We could not parse the JSON body of your request.")
        if self.strict_content and null_assistant_content(body):
            # What llama.cpp's servers do, status and all: the C++ one fails to parse content as a string,
            # llama-cpp-python's answers with pydantic's validation dump (as seen, verbatim).
            return _render(Error(500, LLAMA_CPP_PYTHON_NULL_CONTENT if not _has_tool_calls(body) else
                                 "[json.exception.type_error.302] type must be string, but is null"))
        if not self.validate:
            return None
        problem = chat_request_problem(body)
        return _bad_request(problem) if problem else None

    def _check_embeddings(self, body: Any) -> web.Response | None:
        if not isinstance(body, dict):
            return _bad_request("We could not parse the JSON body of your request.")
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(body.get("model"), str) or not isinstance(inputs, list) or not inputs:
            return _bad_request("'model' and a non-empty 'input' are required.")
        if self.validate and not all(isinstance(text, str) and text for text in inputs):
            return _bad_request("'$.input' is invalid: every input must be a non-empty string.")
        return None

    # -- bodies ------------------------------------------------------------------------------------

    def _serial(self) -> int:
        with self._lock:
            self._counter += 1
            return self._counter

    def _completion(self, request: dict[str, Any], reply: Text | ToolCalls) -> dict[str, Any]:
        serial = self._serial()
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        if isinstance(reply, Text):
            message["content"] = reply.text
            finish_reason, produced = reply.finish_reason, reply.text
        else:
            message["content"] = reply.content
            message["tool_calls"] = [
                {"id": f"call_{serial}_{i}", "type": "function",
                 "function": {"name": name,
                              "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}
                for i, (name, args) in enumerate(reply.calls)
            ]
            finish_reason = "tool_calls"
            produced = (reply.content or "") + "".join(c["function"]["arguments"] for c in message["tool_calls"])
        completion: dict[str, Any] = {
            "id": f"chatcmpl-fake{serial}", "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model", "fake-model"), "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        }
        usage = _usage(request, reply, produced, self.window is not None)
        if usage is not None:
            completion["usage"] = usage
        return completion

    async def _stream(self, request: web.Request, body: dict[str, Any], reply: Text | ToolCalls) -> web.StreamResponse:
        """The reply as OpenAI streams it: server-sent `chat.completion.chunk`s, then `data: [DONE]`."""
        serial = self._serial()
        base = {"id": f"chatcmpl-fake{serial}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body.get("model", "fake-model"), "system_fingerprint": "fp_fake"}
        options = body.get("stream_options")
        with_usage = isinstance(options, dict) and bool(options.get("include_usage"))

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            data: dict[str, Any] = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                         "finish_reason": finish_reason}]}
            if with_usage:  # OpenAI: null on every chunk but the last one
                data["usage"] = None
            return data

        text: str | None
        if isinstance(reply, Text):
            text, finish_reason, calls = reply.text, reply.finish_reason, []
        else:
            text, finish_reason = reply.content, "tool_calls"
            calls = [(name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
                     for name, args in reply.calls]
        # OpenAI's first chunk names the role, with content "" for text and null for a tool-call turn.
        chunks = [chunk({"role": "assistant", "content": "" if isinstance(reply, Text) else None,
                         "refusal": None})]
        chunks += [chunk({"content": piece}) for piece in _pieces(text or "", STREAM_PIECE_CHARS)]
        for index, (name, arguments) in enumerate(calls):
            chunks.append(chunk({"tool_calls": [{"index": index, "id": f"call_{serial}_{index}", "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]}))
            chunks += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                       for piece in _pieces(arguments, STREAM_ARGUMENT_CHARS)]
        chunks.append(chunk({}, finish_reason))
        produced = (text or "") + "".join(arguments for _, arguments in calls)
        usage = _usage(body, reply, produced, self.window is not None)
        if with_usage and usage is not None:
            chunks.append({**base, "choices": [], "usage": usage})

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        cut = reply.cut_after if isinstance(reply, Text) else None
        for number, data in enumerate(chunks):
            if number > 1:  # chunks[0] names the role, chunks[1] is the first piece
                await self.pause(reply.chunk_delay)
            if cut is not None and number > cut:
                assert request.transport is not None
                request.transport.close()  # as a killed server's socket: no last chunk, no end of the body
                return response
            await response.write(f"data: {_json_dumps(data)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


# -- helpers (module level so other fakes and tests can reuse them) -----------------------------------

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_WORD = re.compile(r"[^\W\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")


def rough_tokens(text: str) -> int:
    """About what a BPE tokenizer counts: one per CJK character, one per four other characters."""
    cjk = len(_CJK.findall(text))
    return max(1, cjk + math.ceil((len(text) - cjk) / 4))


def _pieces(text: str, size: int) -> list[str]:
    """`text` cut into pieces of `size` characters (code points, so Chinese is never split mid-character)."""
    return [text[start:start + size] for start in range(0, len(text), size)]


def _usage(request: dict[str, Any], reply: Text | ToolCalls, produced: str,
           windowed: bool = False) -> dict[str, Any] | None:
    """The `usage` object for a reply: scripted, or estimated from the text (with the tool schemas when the
    server has a window: the count it refuses by); None when scripted away."""
    if reply.usage is False:
        return None
    prompt = window_tokens(request) if windowed else _prompt_tokens(request)
    usage: dict[str, Any] = dict(reply.usage or {"prompt_tokens": prompt,
                                                 "completion_tokens": rough_tokens(produced)})
    usage.setdefault("total_tokens", usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))
    if reply.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens, "audio_tokens": 0}
    return usage


def _prompt_tokens(request: dict[str, Any]) -> int:
    total = 0
    for message in request.get("messages", []):
        content = message.get("content") if isinstance(message, dict) else None
        total += 4 + (rough_tokens(content) if isinstance(content, str) else 0)
    return total


def window_tokens(request: dict[str, Any]) -> int:
    """The prompt tokens a windowed fake counts: 4 per message plus the text of each (string or text parts),
    plus the tool schemas as JSON. Deterministic, and about what a real tokenizer says."""
    total = 0
    for message in request.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        parts = [content] if isinstance(content, str) else [
            part.get("text") for part in content if isinstance(part, dict)] if isinstance(content, list) else []
        total += 4 + sum(rough_tokens(text) for text in parts if isinstance(text, str) and text)
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if calls:
            total += rough_tokens(_json_dumps(calls))
    if request.get("tools"):
        total += rough_tokens(_json_dumps(request["tools"]))
    return total


def _overflow(style: OverflowStyle, tokens: int, window: int, max_tokens: Any) -> web.Response:
    """The 400 a llama.cpp server (or llama-cpp-python's) gives a prompt longer than its window, as on the wire."""
    if style == "llama.cpp":
        return _json({"error": {"code": 400, "message": f"request ({tokens} tokens) exceeds the available context "
                                                        f"size ({window} tokens), try increasing it",
                                "type": "exceed_context_size_error", "n_prompt_tokens": tokens, "n_ctx": window}},
                     status=400)
    # llama-cpp-python's server rewrites the library's "Requested tokens (N) exceed context window of M" into
    # OpenAI's wording (its ErrorResponseFormatters.context_length_exceeded); the library's text never leaves.
    requested = tokens + (max_tokens if isinstance(max_tokens, int) else 0)
    return _json({"error": {"message": f"This model's maximum context length is {window} tokens. However, you "
                                       f"requested {requested} tokens ({tokens} in the messages, {max_tokens} in the "
                                       "completion). Please reduce the length of the messages or completion.",
                            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}},
                 status=400)


def default_embedding(text: str, dimensions: int) -> list[float]:
    """Deterministic unit vector from hashed words and CJK characters/bigrams.

    Texts that share words get a higher cosine similarity, which is enough to test vector ranking
    without a model; the same text always gives the same vector, in any process.
    """
    vector = [0.0] * dimensions
    chars = _CJK.findall(text)
    features = [w.lower() for w in _WORD.findall(text)] + chars + [a + b for a, b in zip(chars, chars[1:])]
    for feature in features or [text]:
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        slot = int.from_bytes(digest[:4], "little") % dimensions
        vector[slot] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0:  # every feature cancelled out: still a unit vector, still deterministic
        vector[int(hashlib.blake2b(text.encode(), digest_size=4).hexdigest(), 16) % dimensions] = 1.0
        return vector
    return [x / norm for x in vector]


def chat_request_problem(body: dict[str, Any]) -> str | None:
    """The 400 message OpenAI would give this chat request, or None if it would accept it."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    if "stream" in body and not isinstance(body["stream"], bool):
        return "Invalid type for 'stream': expected a boolean."
    if body.get("stream_options") is not None and not body.get("stream"):
        return "The 'stream_options' parameter is only allowed when 'stream' is enabled."
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
                isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
                and isinstance(t["function"].get("name"), str) for t in tools):
            return "Invalid 'tools': every tool must be {'type': 'function', 'function': {'name': ...}}"
    if "tool_choice" in body and not tools:
        return "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified."
    awaiting: list[str] = []  # tool_call ids still owed a tool message
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return f"Invalid value for 'messages[{i}].role': {role!r}"
        if role == "tool":
            if message.get("tool_call_id") not in awaiting:
                return (f"Invalid parameter: messages with role 'tool' must be a response to a preceding "
                        f"message with 'tool_calls' (messages[{i}]).")
            awaiting.remove(message["tool_call_id"])
            continue
        if awaiting:
            return ("An assistant message with 'tool_calls' must be followed by tool messages responding to "
                    f"each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                    f"{', '.join(awaiting)}")
        if role == "assistant" and message.get("tool_calls"):
            awaiting = [call.get("id") for call in message["tool_calls"]]
    if awaiting:
        return ("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(awaiting)}")
    return None


def null_assistant_content(body: dict[str, Any]) -> bool:
    """Whether an assistant message has a null (or missing) `content`."""
    messages = body.get("messages")
    return isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") == "assistant" and m.get("content") is None for m in messages)


def _has_tool_calls(body: dict[str, Any]) -> bool:
    return any(isinstance(m, dict) and m.get("role") == "assistant" and m.get("content") is None
               and m.get("tool_calls") for m in body.get("messages") or [])


# The head of llama-cpp-python's answer to an assistant message with content null.
LLAMA_CPP_PYTHON_NULL_CONTENT = (
    "7 validation errors: {'type': 'literal_error', 'loc': ('body', 'messages', 2, 'typed-dict', 'role'), "
    "'msg': \"Input should be 'system'\", 'input': 'assistant', 'ctx': {'expected': \"'system'\"}} "
    "{'type': 'string_type', 'loc': ('body', 'messages', 2, 'typed-dict', 'content'), "
    "'msg': 'Input should be a valid string', 'input': None} "
    "{'type': 'literal_error', 'loc': ('body', 'messages', 2, 'typed-dict', 'role'), "
    "'msg': \"Input should be 'user'\", 'input': 'assistant', 'ctx': {'expected': \"'user'\"}}")


_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
                404: "invalid_request_error", 429: "rate_limit_error"}
_json_dumps = partial(json.dumps, ensure_ascii=False)  # real providers send UTF-8, not \u escapes


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response(data, status=status, headers=dict(headers or {}), dumps=_json_dumps)


def _render(reply: Error | Raw) -> web.Response:
    if isinstance(reply, Error):
        kind = _ERROR_TYPES.get(reply.status, "server_error" if reply.status >= 500 else "invalid_request_error")
        return _json({"error": {"message": reply.message, "type": kind, "param": None, "code": reply.code}},
                     status=reply.status, headers=reply.headers)
    text = reply.body if isinstance(reply.body, str) else _json_dumps(reply.body)
    return web.Response(text=text, status=reply.status, content_type=reply.content_type)


def _bad_request(message: str) -> web.Response:
    return _render(Error(400, message))


def _multipart(content_type: str, raw: bytes) -> tuple[dict[str, str], dict[str, tuple[str, str, bytes]]]:
    """A multipart/form-data body's text fields, and its files as (filename, content type, bytes), by field name.
    Parsed from the raw bytes (which the server also records); anything not multipart gives nothing."""
    head = email.message.Message()
    head["Content-Type"] = content_type
    boundary = head.get_param("boundary")
    if head.get_content_type() != "multipart/form-data" or not isinstance(boundary, str):
        return {}, {}
    fields: dict[str, str] = {}
    files: dict[str, tuple[str, str, bytes]] = {}
    delimiter = b"--" + boundary.encode()
    for chunk in raw.split(delimiter)[1:]:
        if chunk.startswith(b"--"):  # the closing delimiter
            break
        chunk = chunk.removeprefix(b"\r\n").removesuffix(b"\r\n")
        header_bytes, _, body = chunk.partition(b"\r\n\r\n")
        part = email.message_from_bytes(header_bytes + b"\r\n\r\n", policy=email.policy.HTTP)
        disposition = part.get("Content-Disposition")
        if disposition is None:
            continue
        params = dict(getattr(disposition, "params", {}))
        name = _utf8(str(params.get("name", "")))
        if "filename" in params:
            files[name] = (_utf8(str(params["filename"])), part.get_content_type() if "Content-Type" in part
                           else "application/octet-stream", body)
        else:
            fields[name] = body.decode("utf-8", "replace")
    return fields, files



def _utf8(header_text: str) -> str:
    """A header's text as UTF-8 (the email parser leaves raw non-ASCII bytes as surrogate escapes)."""
    try:
        return header_text.encode("ascii", "surrogateescape").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return header_text
