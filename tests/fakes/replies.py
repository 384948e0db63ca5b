"""Model replies several tests script on the fake OpenAI server (tests/fakes/openai_server.py)."""

from __future__ import annotations

from typing import Any


def null_answer() -> dict[str, Any]:
    """A completion whose message has no text and no tool calls, `content: null`: llama.cpp's answer of one
    end-of-text token. Send it with `FakeOpenAIServer.reply_raw`."""
    return {"id": "chatcmpl-null", "object": "chat.completion", "created": 0, "model": "qwen",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": "stop"}]}
