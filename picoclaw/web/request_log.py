"""One log line for each request the console refuses, never a traceback: a bad request is the client's
mistake (or a probe), and the terminal running `picoclaw web` should say what was refused and why."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

REASON_KEY: web.RequestKey[str] = web.RequestKey("picoclaw_refusal", str)  # why, when the body does not say
QUIET = frozenset({401, 404})  # a browser before it logs in, a stale bookmark: said only with -v
MOST = 200  # characters of a reason in a log line
_TOKEN = re.compile(r"(token=)[^\s&'\"]+")  # a login link quoted in a reason keeps its token out of the log


def log_refusal(request: web.Request, response: web.StreamResponse) -> None:
    """One line for a 4xx answer: the method, path (never the query, which may hold a login token), status
    and reason. A 401 with no reason (no credentials at all) and a 404 are INFO; the rest WARNING."""
    if not 400 <= response.status < 500:
        return
    reason = request.get(REASON_KEY) or _first_line(response)
    quiet = response.status in QUIET and not (response.status == 401 and request.get(REASON_KEY))
    log.log(logging.INFO if quiet else logging.WARNING, "console: refused %s %s (%d)%s", request.method,
            request.path[:100], response.status, f": {_shown(reason)}" if reason else "")


def _first_line(response: web.StreamResponse) -> str:
    if isinstance(response, web.Response) and response.content_type == "text/plain" and response.text:
        return response.text.strip().split("\n", 1)[0]
    return ""


def _shown(reason: str) -> str:
    text = _TOKEN.sub(r"\1…", " ".join(reason.split()))
    return text if len(text) <= MOST else text[:MOST - 1] + "…"


class ServerLog(logging.LoggerAdapter):
    """aiohttp's server log for the console (`logger=` of its runner): a request that is not valid HTTP, which
    aiohttp answers with 400 itself before any handler runs, is one line instead of a traceback. Anything else
    (a bug in a handler) keeps its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})

    def log(self, level: int, msg: object, *args: object, exc_info: Any = None,
            extra: Mapping[str, object] | None = None, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            # aiohttp says non-HTTP traffic on a first request (a port scan) at DEBUG: it stays there
            quoted = exc_info.message.strip().split("\n", 1)[0]
            log.log(min(level, logging.WARNING), "console: refused a request that is not valid HTTP (%d): %s",
                    exc_info.code, _shown(quoted))
            return
        self.logger.log(level, msg, *args, exc_info=exc_info, extra=extra, **kwargs)
