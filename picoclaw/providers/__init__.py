"""Model providers: any OpenAI-compatible chat completions endpoint.

What this layer offers the layers above: the provider interface (`ChatProvider`, `ChatReply`, `ProviderError`
…, from `base.py`) and the OpenAI-compatible provider with `from_config`. The interface is imported at once
(it needs nothing but the standard library); the provider is imported on first use, so importing the
interface, as memory and agent do, never loads the `openai` client (picoclaw/lazy_exports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports
from picoclaw.providers.base import (
    ChatProvider,
    ChatReply,
    ContextWindow,
    ContextWindows,
    EmbeddingClient,
    ErrorKind,
    FixedWindow,
    Message,
    ProviderError,
    TextSink,
    ToolCall,
    Usage,
    WindowSource,
)

if TYPE_CHECKING:
    from picoclaw.providers.context_window import ServerWindows
    from picoclaw.providers.openai_compat import OpenAICompatProvider, from_config

__getattr__, __dir__ = lazy_exports(__name__)
