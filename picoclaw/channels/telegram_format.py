"""The model's Markdown as Telegram HTML, in parts that each fit one message.

markdown-it-py parses the Markdown (CommonMark plus tables and ~~strike~~); the syntax tree is rendered to
the few tags Telegram's HTML mode accepts (b, i, s, code, pre, a, blockquote), with only `&`, `<` and `>`
escaped in text. The rendered HTML is then split: a part holds at most `limit` characters of visible text,
counted as Telegram counts them (UTF-16 code units, tags removed, entities unescaped); cuts fall between
blocks, else at a line break, else at a space, else anywhere but inside a tag, an entity or a character
sequence drawn as one glyph. Tags open at a cut are closed at the end of the part and opened again at the
start of the next. Each part carries a plain-text twin for when Telegram refuses the HTML.
"""

from __future__ import annotations

import html
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

MESSAGE_LIMIT = 4096  # characters (UTF-16 code units) of one Telegram message, after entities are parsed out
LINK_SCHEMES = frozenset({"http", "https", "tg", "mailto"})  # what becomes <a>; other links stay text
RULE = "─" * 12  # a horizontal rule: Telegram has no tag for one
EMPTY_REPLY = "(empty reply)"

# Marks a boundary between two blocks in the rendered stream, so the splitter can prefer it over a line
# break inside a block. It never leaves this module (and is removed from the input first).
_BLOCK = "\x1e"
_INLINE_TAGS = {"strong": "b", "em": "i", "s": "s"}
_InlineRule = Callable[[StateInline, bool], bool]


@dataclass(frozen=True)
class MessagePart:
    """One message: Telegram HTML, and the same text without markup (links as "text (url)")."""

    html: str
    plain: str


def render_html(markdown: str) -> str:
    """Telegram HTML for `markdown`, in one piece (however long)."""
    return _render(markdown).replace(_BLOCK, "")


def telegram_parts(markdown: str, limit: int = MESSAGE_LIMIT) -> list[MessagePart]:
    """`markdown` rendered and split into messages of at most `limit` visible UTF-16 units each, in order."""
    atoms = _atoms(_render(markdown), limit)
    parts: list[MessagePart] = []
    for part in _split(atoms, limit):
        plain = _plain(part)
        if utf16_length(plain) > limit:  # URLs longer than the room the split left them: the text alone
            plain = "".join(atom.text for atom in part)
        parts.append(MessagePart("".join(atom.raw for atom in part), plain))
    return parts


def visible_text(rendered: str) -> str:
    """What Telegram shows of `rendered` HTML: tags removed, entities unescaped."""
    return html.unescape(re.sub(r"<[^>]*>", "", rendered))


def utf16_length(text: str) -> int:
    """The length Telegram counts: characters outside the Basic Multilingual Plane (emoji) count twice."""
    return len(text) + sum(1 for character in text if ord(character) > 0xFFFF)


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
_URL_REST = re.compile(r"://[^\s<>\"\u3000-\u303f\uff00-\uffef]+")


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


# -- splitting ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Atom:
    """An indivisible piece of rendered HTML: a tag, an entity, one character, or a run of whitespace."""

    kind: str  # "block" (between blocks), "newline", "space", "char", "entity", "open", "close"
    raw: str  # as it goes into the HTML
    text: str = ""  # what Telegram shows of it
    cost: int = 0  # UTF-16 units it adds to a part (an <a> adds its " (url)" of the plain twin)
    tag: str = ""
    href: str = ""


_ATOM = re.compile(r"(?P<block>\x1e\n*)|(?P<tag><[^>]*>)|(?P<entity>&(?:[a-z]+|#[0-9]+|#x[0-9a-f]+);)"
                   r"|(?P<newline>\n)|(?P<space>[ \t])|(?P<char>.)", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r'<(/?)([a-z-]+)(?:\s+href="([^"]*)")?')
_SEPARATORS = ("block", "newline", "space")
_GLUE = {"\u200d", "\u20e3"}  # zero-width joiner, combining keycap


def _atoms(rendered: str, limit: int) -> list[_Atom]:
    atoms: list[_Atom] = []
    for match in _ATOM.finditer(rendered):
        kind, raw = match.lastgroup or "char", match.group()
        if kind == "tag":
            tag = _TAG.match(raw)
            assert tag is not None, raw  # the renderer made every tag
            closing, name, href = tag.group(1), tag.group(2), html.unescape(tag.group(3) or "")
            # A link's URL joins its text in the plain twin; capped so one huge URL cannot fill a part.
            cost = min(utf16_length(f" ({href})"), limit // 2) if href else 0
            atoms.append(_Atom("close" if closing else "open", raw, cost=0 if closing else cost, tag=name, href=href))
        else:
            text = raw.removeprefix(_BLOCK) if kind == "block" else html.unescape(raw) if kind == "entity" else raw
            atoms.append(_Atom(kind, raw.removeprefix(_BLOCK), text, utf16_length(text)))
    return atoms


def _split(atoms: list[_Atom], limit: int) -> list[list[_Atom]]:
    """Atoms in parts of at most `limit` cost, each with the tags open at its cuts closed and reopened."""
    parts: list[list[_Atom]] = []
    start = 0
    reopen: list[_Atom] = []  # the tags open at `start`, reopened at the head of the part
    while start < len(atoms):
        used = sum(atom.cost for atom in reopen)
        end = start
        while end < len(atoms) and used + atoms[end].cost <= limit:
            used += atoms[end].cost
            end += 1
        if end == start:  # even one atom is too much (a limit under 2 and an emoji): take it anyway
            end += 1
        if end >= len(atoms):
            cut = resume = len(atoms)
        else:
            cut = _cut(atoms, start, end)
            resume = cut + 1 if atoms[cut].kind in _SEPARATORS else cut
        body = atoms[start:cut]
        still_open = _open_after(reopen, body)
        part = _without_empty_elements([*reopen, *body, *(_Atom("close", f"</{a.tag}>", tag=a.tag)
                                                          for a in reversed(still_open))])
        if any(atom.text.strip() for atom in part):
            parts.append(part)
        start, reopen = resume, still_open
        # The line breaks at a cut are dropped: a message starts with its text.
        while start < len(atoms) and atoms[start].kind in ("block", "newline"):
            start += 1
    return parts


def _cut(atoms: list[_Atom], start: int, end: int) -> int:
    """Where to end a part that starts at `start` and must end by `end`: the index of the first atom left out.

    Prefers the last block boundary, then the last line break, then the last space (the separator itself
    is dropped); failing those, `end`, moved so that no closing tag is left behind and no opening tag or
    half of a glyph ends the part.
    """
    first_text = next((i for i in range(start, end) if atoms[i].kind in ("char", "entity")), end)
    for kind in _SEPARATORS:
        for index in range(min(end, len(atoms) - 1), first_text, -1):
            if atoms[index].kind == kind and atoms[index - 1].kind != "open":
                return index
    cut = end
    while cut < len(atoms) and atoms[cut].kind == "close":  # closing tags cost nothing: they come along
        cut += 1
    while cut - 1 > first_text and (atoms[cut - 1].kind == "open" or _glued(atoms[cut - 1], atoms[cut])):
        cut -= 1
    return max(cut, start + 1)


def _glued(before: _Atom, after: _Atom) -> bool:
    """Whether a cut between these two atoms would break one glyph (an emoji sequence, an accent)."""
    if before.kind != "char" or after.kind != "char":
        return False
    character = after.text
    return (before.text in _GLUE or character in _GLUE or unicodedata.combining(character) != 0
            or unicodedata.category(character) == "Me" or "\ufe00" <= character <= "\ufe0f"
            or "\U0001f3fb" <= character <= "\U0001f3ff" or "\U000e0020" <= character <= "\U000e007f")


def _open_after(reopen: list[_Atom], body: list[_Atom]) -> list[_Atom]:
    """The opening tags still open after `body`, outermost first."""
    stack = list(reopen)
    for atom in body:
        if atom.kind == "open":
            stack.append(atom)
        elif atom.kind == "close" and stack:
            stack.pop()
    return stack


def _without_empty_elements(atoms: list[_Atom]) -> list[_Atom]:
    """`atoms` minus elements with nothing inside (a tag reopened just before its own closing tag)."""
    out: list[_Atom] = []
    for atom in atoms:
        if atom.kind == "close" and out and out[-1].kind == "open" and out[-1].tag == atom.tag:
            out.pop()
        else:
            out.append(atom)
    return out


def _plain(atoms: list[_Atom]) -> str:
    """The visible text of a part, each link's URL after its text."""
    out: list[str] = []
    links: list[tuple[str, int]] = []  # open links: URL, where their text starts in `out`
    for atom in atoms:
        if atom.kind == "open" and atom.tag == "a":
            links.append((atom.href, len(out)))
        elif atom.kind == "close" and atom.tag == "a" and links:
            href, begin = links.pop()
            if href and "".join(out[begin:]) != href:
                out.append(f" ({href})")
        else:
            out.append(atom.text)
    return "".join(out)
