"""HTML as plain text, read with the standard library's HTML parser: the one way markup becomes text (a web
page's title, a page trafilatura finds no main text in, a search result's title or snippet, an error page).

Script, style and template content is dropped, comments too; entities are decoded. As in a browser, a line
break in the markup is only white space (except inside <pre>): block elements (p, div, li, h1 …, br) start a
line of their own and table cells are set apart by a space, while inline tags (b, a, span …) add nothing, so
"<b>Py</b>thon" stays one word. A "<" that starts no tag ("a < b") is text.
"""

from __future__ import annotations

from html.parser import HTMLParser

__all__ = ["html_text", "html_title", "one_line"]

# Elements whose content is not text for a reader.
_HIDDEN = frozenset({"script", "style", "noscript", "template"})
# Elements a browser puts on a line of their own: their start and end break the line.
_BLOCKS = frozenset({
    "address", "article", "aside", "blockquote", "br", "caption", "dd", "details", "dialog", "div", "dl", "dt",
    "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr",
    "li", "main", "nav", "ol", "option", "p", "pre", "section", "summary", "table", "title", "tr", "ul",
})
_CELLS = frozenset({"td", "th"})
# How much of a page is parsed at a time while looking for its title (it is near the top).
_TITLE_CHUNK = 8192


class _TextParser(HTMLParser):
    """Collects the visible text as pieces, with "\n" where a block starts or ends, and the first title."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pieces: list[str] = []
        self.title: list[str] | None = None  # None until a <title> starts
        self.title_done = False
        self._hidden = 0  # depth inside hidden elements
        self._pre = 0  # depth inside <pre>, where the markup's line breaks are the text's
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _HIDDEN:
            self._hidden += 1
        elif tag == "pre":
            self._pre += 1
        elif tag == "title" and self.title is None:
            self.title, self._in_title = [], True
        self._break(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._break(tag)  # <br/>: a void element has no content, hidden or not

    def handle_endtag(self, tag: str) -> None:
        if tag in _HIDDEN and self._hidden:
            self._hidden -= 1
        elif tag == "pre" and self._pre:
            self._pre -= 1
        elif tag == "title" and self._in_title:
            self._in_title, self.title_done = False, True
        if tag in _BLOCKS:
            self.pieces.append("\n")

    def handle_data(self, data: str) -> None:
        if self._hidden:
            return
        if not self._pre:
            data = data.replace("\r", " ").replace("\n", " ")
        self.pieces.append(data)
        if self._in_title and self.title is not None:
            self.title.append(data)

    def _break(self, tag: str) -> None:
        if tag in _BLOCKS:
            self.pieces.append("\n")
        elif tag in _CELLS:
            self.pieces.append(" ")


def html_text(markup: str) -> str:
    """The text of `markup`, line by line: white space within a line made single spaces, empty lines left out."""
    parser = _TextParser()
    parser.feed(markup)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.pieces).splitlines())
    return "\n".join(line for line in lines if line)


def html_title(markup: str) -> str:
    """The text of the page's <title> on one line; "" when it has none (or it never ends)."""
    parser = _TextParser()
    # Parsed from the top only until the title has ended: the rest of a large page is not needed for it.
    for start in range(0, len(markup), _TITLE_CHUNK):
        parser.feed(markup[start:start + _TITLE_CHUNK])
        if parser.title_done:
            break
    else:
        parser.close()
    return " ".join("".join(parser.title or ()).split()) if parser.title_done else ""


def one_line(markup: str) -> str:
    """The text of a short piece of markup (a search result's title or snippet) as one line."""
    return " ".join(html_text(markup).split())
