"""The model's Markdown as Telegram HTML, in parts that fit one message.

Telegram's HTML mode knows a handful of tags and needs only `&`, `<` and `>` escaped. The Markdown is
split first (at paragraphs, then lines, never inside a code block when a block fits) and each part is
rendered on its own, so no tag is ever cut in half and every rendered part stays within the limit.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator

MESSAGE_LIMIT = 4096  # characters of one Telegram message, after entities are parsed out

_FENCE = re.compile(r"^```([\w+-]*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s]+)\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
# Only ASCII letters and digits count as word characters next to a marker: snake_case and 2*3*4 stay as
# they are, while Chinese text (where \w would match every character) can still be set in italics.
_ITALIC = re.compile(r"(?<![A-Za-z0-9*])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![A-Za-z0-9*])"
                     r"|(?<![A-Za-z0-9_])_(?=\S)([^_\n]+?)(?<=\S)_(?![A-Za-z0-9_])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_PLACEHOLDER = "\x00{}\x00"
_TAG = re.compile(r"<(/?)([a-z]+)[^>]*>")  # only tags we made: the text itself is escaped by then


def render_html(markdown: str) -> str:
    """Telegram HTML for `markdown`: code, bold, italic, strike, links, headings; everything else escaped."""
    out: list[str] = []
    position = 0
    for fence in _FENCE.finditer(markdown):
        out.append(_render_prose(markdown[position:fence.start()]))
        out.append(_render_code_block(fence.group(1), fence.group(2)))
        position = fence.end()
    out.append(_render_prose(markdown[position:]))
    return "".join(out)


def _render_code_block(language: str, code: str) -> str:
    body = html.escape(code.removesuffix("\n"), quote=False)
    attribute = f' class="language-{html.escape(language)}"' if language else ""
    return f"<pre><code{attribute}>{body}</code></pre>"


def _render_prose(text: str) -> str:
    # Inline code is set aside first: nothing inside it is Markdown.
    codes: list[str] = []

    def keep_code(match: re.Match[str]) -> str:
        codes.append(f"<code>{html.escape(match.group(1), quote=False)}</code>")
        return _PLACEHOLDER.format(len(codes) - 1)

    text = html.escape(_INLINE_CODE.sub(keep_code, text), quote=False)
    text = _LINK.sub(lambda m: f'<a href="{html.escape(html.unescape(m.group(2)))}">{m.group(1)}</a>', text)
    text = _HEADING.sub(lambda m: f"<b>{m.group(1)}</b>", text)
    text = _BOLD.sub(_wrap("b"), text)
    text = _ITALIC.sub(_wrap("i"), text)
    text = _STRIKE.sub(_wrap("s"), text)
    return re.sub("\x00(\\d+)\x00", lambda m: codes[int(m.group(1))], text)


def _wrap(tag: str) -> Callable[[re.Match[str]], str]:
    """A substitution setting the match's text in `tag`, unless that would cross a tag set earlier."""
    def replace(match: re.Match[str]) -> str:
        inner = next(group for group in match.groups() if group is not None)
        # Markers overlapping another pair (`**a *b** c*`) would give <b>a <i>b</b> c</i>, which Telegram
        # refuses; such markers are left as typed.
        return f"<{tag}>{inner}</{tag}>" if _balanced(inner) else match.group(0)
    return replace


def _balanced(fragment: str) -> bool:
    """Whether every tag in `fragment` is closed inside it, in nesting order."""
    open_tags: list[str] = []
    for closing, name in _TAG.findall(fragment):
        if not closing:
            open_tags.append(name)
        elif not open_tags or open_tags.pop() != name:
            return False
    return not open_tags


def split_markdown(markdown: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """Markdown parts, in order, each of which renders to at most `limit` characters of HTML."""
    parts: list[str] = []
    current = ""
    for unit in _units(markdown.strip(), limit):
        candidate = f"{current}\n\n{unit}" if current else unit
        if len(render_html(candidate)) <= limit:
            current = candidate
            continue
        if current:
            parts.append(current)
        current = unit
    if current:
        parts.append(current)
    return parts


def _units(markdown: str, limit: int) -> Iterator[str]:
    """Paragraphs and whole code blocks; anything that renders over `limit` is cut into smaller units."""
    position = 0
    for fence in _FENCE.finditer(markdown):
        yield from _prose_units(markdown[position:fence.start()], limit)
        yield from _code_units(fence.group(1), fence.group(2), limit)
        position = fence.end()
    yield from _prose_units(markdown[position:], limit)


def _prose_units(text: str, limit: int) -> Iterator[str]:
    for paragraph in re.split(r"\n[ \t]*\n", text):
        paragraph = paragraph.strip("\n")
        if not paragraph.strip():
            continue
        if len(render_html(paragraph)) <= limit:
            yield paragraph
            continue
        yield from _pack(paragraph.split("\n"), "\n", limit, lambda s: len(render_html(s)))


def _code_units(language: str, code: str, limit: int) -> Iterator[str]:
    def fenced(body: str) -> str:
        return f"```{language}\n{body}\n```"

    block = fenced(code.removesuffix("\n"))
    if len(render_html(block)) <= limit:
        yield block
        return
    # Too long for one message: each part is a closed block of its own, so each renders as code.
    overhead = len(_render_code_block(language, ""))
    lines = code.removesuffix("\n").split("\n")
    for body in _pack(lines, "\n", limit - overhead, lambda s: len(html.escape(s, quote=False))):
        yield fenced(body)


def _pack(pieces: list[str], joiner: str, limit: int, measure: Callable[[str], int]) -> Iterator[str]:
    """Join `pieces` greedily into runs whose measure is at most `limit`; a piece too big alone is cut."""
    current: str | None = None
    for piece in pieces:
        candidate = piece if current is None else f"{current}{joiner}{piece}"
        if measure(candidate) <= limit:
            current = candidate
            continue
        if current is not None:
            yield current
        current = None
        if measure(piece) <= limit:
            current = piece
            continue
        while piece:
            cut = _longest_prefix(piece, limit, measure)
            yield piece[:cut]
            piece = piece[cut:]
    if current is not None:
        yield current


def _longest_prefix(text: str, limit: int, measure: Callable[[str], int]) -> int:
    """The length of the longest prefix of `text` whose measure is within `limit` (at least 1)."""
    low, high = 1, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if measure(text[:middle]) <= limit:
            low = middle
        else:
            high = middle - 1
    return low
