"""Local stand-ins for the outside services picoclaw talks to; no test reaches the internet."""

from __future__ import annotations

from tests.fakes.openai_server import Error, FakeOpenAIServer, Raw, RecordedRequest, Text, ToolCalls

__all__ = ["Error", "FakeOpenAIServer", "Raw", "RecordedRequest", "Text", "ToolCalls"]
