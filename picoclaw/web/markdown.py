"""The model's Markdown as the console's HTML: CommonMark with tables and ~~strike~~ (markdown-it-py), raw HTML in the
text escaped, never markup; links open apart (rel="noopener noreferrer", target _blank), and only to the schemes
markdown-it allows (no javascript:); an image is its alt text as a link, so no answer makes the page fetch anything."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token
from markupsafe import Markup


def _link_open(renderer: Any, tokens: Sequence[Token], index: int, options: Any, env: Any) -> str:
    """A link's opening tag, with rel and target set (markdown-it calls it as the renderer's method)."""
    token = tokens[index]
    token.attrSet("rel", "noopener noreferrer")
    token.attrSet("target", "_blank")
    return str(renderer.renderToken(tokens, index, options, env))


def _parser() -> MarkdownIt:
    parser = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    parser.enable(["table", "strikethrough"])
    parser.disable("image")  # `![x](https://…)` stays text with its link: an answer never loads a picture
    parser.add_render_rule("link_open", _link_open)
    return parser


_PARSER = _parser()


def rendered(text: str) -> Markup:
    """`text` (a model's Markdown) as HTML safe to put in a page."""
    return Markup(_PARSER.render(text))
