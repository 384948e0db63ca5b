"""The model's Markdown as Telegram HTML, in parts that each fit one message.

markdown-it-py parses the Markdown (CommonMark plus tables and ~~strike~~); the syntax tree is rendered to
the few tags Telegram's HTML mode accepts (b, i, s, code, pre, a, blockquote), with only `&`, `<` and `>`
escaped in text. The rendered HTML is then split into messages (`split.py`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from markdown_it import MarkdownIt
from markdown_it.common.utils import isMdAsciiPunct, isPunctChar, isWhiteSpace
from markdown_it.rules_inline import StateInline
from markdown_it.rules_inline import emphasis as emphasis_rule
from markdown_it.rules_inline import strikethrough as strikethrough_rule
from markdown_it.tree import SyntaxTreeNode

from picoclaw import cjk
from picoclaw.channels.telegram.split import BLOCK_MARK, MESSAGE_LIMIT, MessagePart, split_html

LINK_SCHEMES = frozenset({"http", "https", "tg", "mailto"})  # what becomes <a>; other links stay text
RULE = "─" * 12  # a horizontal rule: Telegram has no tag for one
EMPTY_REPLY = "(empty reply)"

# Marks a boundary between two blocks in the rendered stream, so the splitter can prefer it over a line
# break inside a block. It never leaves the channel (and is removed from the input first).
_BLOCK = BLOCK_MARK
_INLINE_TAGS = {"strong": "b", "em": "i", "s": "s"}
_InlineRule = Callable[[StateInline, bool], bool]


def render_html(markdown: str) -> str:
    """Telegram HTML for `markdown`, in one piece (however long)."""
    return _render(markdown).replace(_BLOCK, "")


def telegram_parts(markdown: str, limit: int = MESSAGE_LIMIT) -> list[MessagePart]:
    """`markdown` rendered and split into messages of at most `limit` visible UTF-16 units each, in order."""
    return split_html(_render(markdown), limit)


# -- parsing ------------------------------------------------------------------------------------------------


class _Parser(MarkdownIt):
    """CommonMark with tables and strikethrough, raw HTML off (it stays text), and links kept as written."""

    def __init__(self) -> None:
        super().__init__("commonmark", {"html": False})
        self.enable(["table", "strikethrough"])
        self.inline.ruler.at("emphasis", _cjk_friendly(emphasis_rule.tokenize))
        self.inline.ruler.at("strikethrough", _cjk_friendly(strikethrough_rule.tokenize))
        self.inline.ruler.before("newline", "bare_url", _bare_url)

    def validateLink(self, url: str) -> bool:
        # Every destination parses as a link: the renderer decides what becomes <a>, and shows the rest as
        # text instead of leaving the raw `[text](url)` syntax in the message.
        return True

    def normalizeLink(self, url: str) -> str:
        # As written: percent-encoding or punycode would change the URL the model gave.
        return url

    def normalizeLinkText(self, link: str) -> str:
        return link


def _cjk_friendly(tokenize: _InlineRule) -> _InlineRule:
    """`tokenize` (emphasis or strikethrough) with our own rule for which markers may open or close.

    CommonMark's rule fails Chinese text (`**注意：**这是` stays unformatted: a marker between punctuation and
    a letter cannot close) and sets `2*3*4` in italics. Next to a wide (CJK) character only whitespace
    stops a marker; a single `*` between two ASCII letters or digits is always literal.
    """
    def rule(state: StateInline, silent: bool) -> bool:
        start, count = state.pos, len(state.delimiters)
        if not tokenize(state, silent):
            return False
        can_open, can_close = _flanks(state, start, state.pos)
        for delimiter in state.delimiters[count:]:
            delimiter.open, delimiter.close = can_open, can_close
        return True
    return rule


def _flanks(state: StateInline, start: int, end: int) -> tuple[bool, bool]:
    """Whether the marker run `src[start:end]` can open and close emphasis."""
    marker = state.src[start]
    last = state.src[start - 1] if start > 0 else " "
    following = state.src[end] if end < state.posMax else " "
    if marker == "*" and end - start == 1 and _ascii_word(last) and _ascii_word(following):
        return False, False
    last_space, next_space = isWhiteSpace(ord(last)), isWhiteSpace(ord(following))
    if _wide(last) or _wide(following):
        left, right = not next_space, not last_space
        last_punct = next_punct = True
    else:
        last_punct = isMdAsciiPunct(ord(last)) or isPunctChar(last)
        next_punct = isMdAsciiPunct(ord(following)) or isPunctChar(following)
        left = not next_space and not (next_punct and not (last_space or last_punct))
        right = not last_space and not (last_punct and not (next_space or next_punct))
    if marker == "_":  # `_` never splits a word: snake_case stays as typed
        return left and (not right or last_punct), right and (not left or next_punct)
    return left, right


def _ascii_word(character: str) -> bool:
    return character.isascii() and character.isalnum()


def _wide(character: str) -> bool:
    return unicodedata.east_asian_width(character) in ("W", "F")


_SCHEME_BEFORE = re.compile(r"(?:^|[^A-Za-z0-9+.-])https?$", re.IGNORECASE)
# A bare URL ends at whitespace, <, > or ", and at CJK punctuation or full-width forms (，。） …).
_URL_REST = re.compile(rf"://[^\s<>\"{cjk.PUNCTUATION}]+")


def _bare_url(state: StateInline, silent: bool) -> bool:
    """A bare http(s) URL is text taken whole: `https://x.com/_private_` must not get italics inside."""
    if silent or not state.src.startswith("://", state.pos) or state.linkLevel > 0:
        return False
    # Only the end of the pending text can hold the scheme (a search of all of it would be quadratic).
    if not _SCHEME_BEFORE.search(state.pending[-7:]):
        return False
    match = _URL_REST.match(state.src, state.pos, state.posMax)
    if match is None:
        return False
    rest = _trim_url(match.group())
    if len(rest) <= 3:
        return False
    state.pending += rest
    state.pos += len(rest)
    return True


def _trim_url(url: str) -> str:
    """Without the trailing punctuation of the sentence around it, or a `)` that closes a parenthesis."""
    while True:
        trimmed = url.rstrip(".,;:!?'\"*")
        for opening, closing in ("()", "[]"):
            if trimmed.endswith(closing) and trimmed.count(closing) > trimmed.count(opening):
                trimmed = trimmed[:-1]
        if trimmed == url:
            return url
        url = trimmed


_PARSER = _Parser()


# -- rendering ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    indent: str = ""  # put after every line break: the continuation lines of a list item
    active: frozenset[str] = frozenset()  # inline tags open here: not opened again inside themselves
    in_link: bool = False  # Telegram allows no link or code inside a link
    in_quote: bool = False  # nor a blockquote inside a blockquote


def _render(markdown: str) -> str:
    source = markdown.replace(_BLOCK, "").replace("\r\n", "\n").replace("\r", "\n")
    tree = SyntaxTreeNode(_PARSER.parse(source))
    return _Renderer(source.split("\n")).blocks(tree.children, _Context())


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attribute(value: str) -> str:
    # `<` and `>` too: the splitter reads a tag as running up to the first `>`.
    return _escape(value).replace('"', "&quot;")


def _linkable(url: str) -> bool:
    """Whether Telegram takes `url` as a link target: http(s), tg or mailto, with no space in it."""
    scheme, colon, rest = url.partition(":")
    if not colon or not rest or scheme.lower() not in LINK_SCHEMES or re.search(r"[\s\x00-\x1f]", url):
        return False
    if scheme.lower() == "mailto":
        return True
    return rest.startswith("//") and len(rest) > 2  # http:foo or tg:// alone is no address


class _Renderer:
    """Telegram HTML for a markdown-it syntax tree; `lines` are the source's, to see blank lines."""

    def __init__(self, lines: list[str]):
        self.lines = lines

    def blocks(self, nodes: Sequence[SyntaxTreeNode], context: _Context) -> str:
        out: list[str] = []
        for node in nodes:
            rendered = self.block(node, context)
            if out:
                # As the model laid them out: a blank line between blocks where it left one.
                out.append(_BLOCK + ("\n\n" if self._blank_line_before(node) else "\n") + context.indent)
            out.append(rendered)
        return "".join(out)

    def _blank_line_before(self, node: SyntaxTreeNode) -> bool:
        if node.map is None or node.map[0] == 0 or node.map[0] > len(self.lines):
            return False
        return not self.lines[node.map[0] - 1].strip(" \t>")

    def block(self, node: SyntaxTreeNode, context: _Context) -> str:
        kind = node.type
        if kind == "paragraph":
            return self.inline(_inline_children(node), context)
        if kind == "heading":
            return self.formatted("b", _inline_children(node), context)
        if kind == "blockquote":
            if context.in_quote:  # Telegram nests no quotes: the inner one joins the outer
                return self.blocks(node.children, context)
            return f"<blockquote>{self.blocks(node.children, replace(context, in_quote=True))}</blockquote>"
        if kind in ("bullet_list", "ordered_list"):
            return self.list_block(node, context)
        if kind in ("fence", "code_block"):
            return self.code(node)
        if kind == "table":
            return self.table(node)
        if kind == "hr":
            return RULE
        if node.children:
            return self.blocks(node.children, context)
        return _escape(node.content)

    def list_block(self, node: SyntaxTreeNode, context: _Context) -> str:
        ordered = node.type == "ordered_list"
        start = int(node.attrs.get("start", 1)) if ordered else 1
        out: list[str] = []
        for number, item in enumerate(node.children, start):
            marker = f"{number}." if ordered else "•"
            inner = replace(context, indent=context.indent + " " * (len(marker) + 1))
            body = self.blocks(item.children, inner)
            if out:
                out.append(_BLOCK + ("\n\n" if self._blank_line_before(item) else "\n") + context.indent)
            out.append(f"{marker} {body}" if body else marker)
        return "".join(out)

    def code(self, node: SyntaxTreeNode) -> str:
        body = _escape(node.content.removesuffix("\n"))
        words = node.info.split() if node.type == "fence" else []
        language = re.sub(r"[^\w+#.-]", "", words[0]) if words else ""
        if language:
            return f'<pre><code class="language-{language}">{body}</code></pre>'
        return f"<pre>{body}</pre>" if body else ""

    def table(self, node: SyntaxTreeNode) -> str:
        """The table as aligned columns of monospaced text (Telegram has no table): a <pre> block."""
        rows: list[list[str]] = []
        aligns: list[str] = []
        for section in node.children:
            for row in section.children:
                rows.append([_plain_inline(_inline_children(cell)) for cell in row.children])
                if not aligns:
                    aligns = [str(cell.attrs.get("style", "")) for cell in row.children]
        columns = max(len(row) for row in rows)
        rows = [row + [""] * (columns - len(row)) for row in rows]
        aligns += [""] * (columns - len(aligns))
        widths = [max(_display_width(row[column]) for row in rows) for column in range(columns)]
        lines = [" | ".join(_pad(cell, width, align) for cell, width, align in zip(row, widths, aligns)).rstrip()
                 for row in rows]
        lines.insert(1, "-+-".join("-" * width for width in widths))
        return f"<pre>{_escape(chr(10).join(lines))}</pre>"

    def inline(self, nodes: Sequence[SyntaxTreeNode], context: _Context) -> str:
        return "".join(self.inline_node(node, context) for node in nodes)

    def inline_node(self, node: SyntaxTreeNode, context: _Context) -> str:
        kind = node.type
        if kind == "text":
            return _escape(node.content)
        if kind in ("softbreak", "hardbreak"):
            return "\n" + context.indent
        if kind == "code_inline":
            code = _escape(node.content)
            return code if context.in_link else f"<code>{code}</code>"
        if kind in _INLINE_TAGS:
            return self.formatted(_INLINE_TAGS[kind], node.children, context)
        if kind == "link":
            return self.link(str(node.attrs.get("href", "")), node.children, context)
        if kind == "image":  # Telegram shows no images in text: a link to it, named by its alt text
            return self.link(str(node.attrs.get("src", "")), node.children, context)
        if node.children:
            return self.inline(node.children, context)
        return _escape(node.content)

    def formatted(self, tag: str, children: Sequence[SyntaxTreeNode], context: _Context) -> str:
        inner = self.inline(children, replace(context, active=context.active | {tag}))
        if tag in context.active or not inner:
            return inner
        return f"<{tag}>{inner}</{tag}>"

    def link(self, url: str, children: Sequence[SyntaxTreeNode], context: _Context) -> str:
        if _linkable(url) and not context.in_link:
            text = self.inline(children, replace(context, in_link=True))
            return f'<a href="{_attribute(url)}">{text or _escape(url)}</a>'
        text = self.inline(children, context)
        if not url or _plain_inline(children) == url:
            return text or _escape(url)
        return f"{text} ({_escape(url)})" if text else _escape(url)


def _inline_children(node: SyntaxTreeNode) -> Sequence[SyntaxTreeNode]:
    """The inline content of a paragraph, heading or table cell."""
    return [grandchild for child in node.children for grandchild in child.children]


def _plain_inline(nodes: Sequence[SyntaxTreeNode]) -> str:
    """Inline content as text without markup (table cells, where no tag may go)."""
    out: list[str] = []
    for node in nodes:
        if node.type in ("softbreak", "hardbreak"):
            out.append(" ")
        elif node.type in ("link", "image"):
            text = _plain_inline(node.children)
            url = str(node.attrs.get("href" if node.type == "link" else "src", ""))
            out.append(text if not url or text == url else f"{text} ({url})" if text else url)
        elif node.children:
            out.append(_plain_inline(node.children))
        else:
            out.append(node.content)
    return "".join(out)


def _display_width(text: str) -> int:
    """Columns `text` takes in a monospaced font: wide (CJK) characters two, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if _wide(c) else 1 for c in text)


def _pad(cell: str, width: int, align: str) -> str:
    room = width - _display_width(cell)
    if "right" in align:
        return " " * room + cell
    if "center" in align:
        return " " * (room // 2) + cell + " " * (room - room // 2)
    return cell + " " * room
