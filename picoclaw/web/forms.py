"""A change's form must be UTF-8 throughout, or it changes nothing.

aiohttp decodes a form's percent-escapes with errors="replace": `content=%CE%D2` (a GBK page's text) would
reach a handler as U+FFFD characters and be stored. So every change's form is first parsed strictly here, and
one that is not UTF-8 is refused before any handler reads it. Multipart forms are refused (each part could
name a charset of its own), except where a page sends a file (`UPLOADS`: the chat's Attach), whose handler reads
the parts itself, strictly as UTF-8 and within its bounds.
"""

from __future__ import annotations

import codecs
from urllib.parse import parse_qsl

from aiohttp import web

FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
NOT_UTF8 = "The form's text is not UTF-8; nothing was changed.\n"
UPLOADS = frozenset({"/chat/turn"})  # the paths whose pages send a file, as multipart/form-data


async def check_form(request: web.Request) -> None:
    """HTTPBadRequest unless the request's form (if it sends one) is UTF-8 in its bytes and its escapes;
    HTTPUnsupportedMediaType for a multipart one, except to the paths of `UPLOADS`."""
    content_type = request.content_type
    if content_type == MULTIPART and request.path not in UPLOADS:
        raise web.HTTPUnsupportedMediaType(text=f"Send the form as {FORM}, as the console's pages do; nothing "
                                                "was changed.\n")
    if content_type not in ("", FORM):  # "" is read as a form too (aiohttp's `post`)
        return
    if request.charset is not None and not _is_utf8(request.charset):
        raise web.HTTPBadRequest(text=NOT_UTF8)
    body = await request.read()  # kept by aiohttp: `post` parses these same bytes later
    try:
        parse_qsl(body.decode("utf-8"), keep_blank_values=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise web.HTTPBadRequest(text=NOT_UTF8) from None


def _is_utf8(charset: str) -> bool:
    try:
        return codecs.lookup(charset).name == "utf-8"
    except LookupError:  # a charset Python does not know: not UTF-8 either
        return False
