"""Markdown → Telegram HTML, and splitting into parts that each render within one message."""

from __future__ import annotations

import html
import re

import pytest

from picoclaw.channels.telegram_format import MESSAGE_LIMIT, render_html, split_markdown


@pytest.mark.parametrize(("markdown", "expected"), [
    ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
    ("**bold** *italic* _also_ ~~gone~~", "<b>bold</b> <i>italic</i> <i>also</i> <s>gone</s>"),
    ("中文**粗体**和*斜体*", "中文<b>粗体</b>和<i>斜体</i>"),
    ("# 标题 Title", "<b>标题 Title</b>"),
    ("use `x <y> & *z*` here", "use <code>x &lt;y&gt; &amp; *z*</code> here"),
    ("[docs](https://example.com/?a=1&b=\"2\")", '<a href="https://example.com/?a=1&amp;b=&quot;2&quot;">docs</a>'),
    ("snake_case_name and 2*3*4", "snake_case_name and 2*3*4"),
    ("<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"),
])
def test_render_escapes_everything_but_the_markup_it_knows(markdown: str, expected: str) -> None:
    assert render_html(markdown) == expected


def test_code_blocks_are_escaped_and_keep_their_language() -> None:
    markdown = "Look:\n```python\nif a < b and '**' in s:\n    print(\"中文\")\n```\ndone"
    assert render_html(markdown) == ("Look:\n<pre><code class=\"language-python\">if a &lt; b and '**' in s:\n"
                                     "    print(\"中文\")</code></pre>\ndone")


def test_short_text_is_one_part() -> None:
    assert split_markdown("hello **world**\n\n你好") == ["hello **world**\n\n你好"]
    assert split_markdown("   \n\n  ") == []


def _check(parts: list[str], limit: int) -> None:
    rendered = [render_html(p) for p in parts]
    assert all(len(r) <= limit for r in rendered), [len(r) for r in rendered]
    for r in rendered:
        assert _well_nested(r), r


def _well_nested(rendered: str) -> bool:
    """Each tag the HTML opens it closes, innermost first (Telegram refuses <b><i></b></i>)."""
    stack: list[str] = []
    for closing, name in re.findall(r"<(/?)(\w+)[^>]*>", rendered):
        if not closing:
            stack.append(name)
        elif not stack or stack.pop() != name:
            return False
    return not stack


@pytest.mark.parametrize(("markdown", "expected"), [
    ("**a *b** c*", "<b>a *b</b> c*"),
    ("**粗 *斜** 体*", "<b>粗 *斜</b> 体*"),
    ("~~x **y~~ z**", "~~x <b>y~~ z</b>"),
    ("*[链接*](https://example.com)", '*<a href="https://example.com">链接*</a>'),
])
def test_markers_that_overlap_stay_as_typed_rather_than_cross(markdown: str, expected: str) -> None:
    rendered = render_html(markdown)
    assert rendered == expected and _well_nested(rendered)


def test_mixed_markup_always_renders_well_nested() -> None:
    pieces = ["**", "*", "_", "__", "~~", "`", "[链接](https://x.org/)", "中文", "word", " ", "\n", "# ", "<&>",
              "```py\n", "\n```", "snake_case", "2*3"]
    # Every arrangement of three pieces, twice over: a fixed, exhaustive grid instead of random input.
    for first in pieces:
        for second in pieces:
            for third in pieces:
                markdown = first + second + third + first + third + second
                assert _well_nested(render_html(markdown)), markdown


@pytest.mark.parametrize("word", ["word & <tag> **bold** ", "中文 & <标签> **粗体** "])
def test_paragraphs_are_kept_whole_and_in_order(word: str) -> None:
    markdown = "\n\n".join(f"P{i} " + (word * 12).strip() for i in range(60))
    parts = split_markdown(markdown, 1000)
    _check(parts, 1000)
    assert "\n\n".join(parts) == markdown
    assert all(p.startswith("P") for p in parts)


def test_a_code_block_is_not_split_when_it_fits_in_a_part_of_its_own() -> None:
    prose = "intro " * 100
    code = "```js\n" + "\n".join(f"let x{i} = a < b;" for i in range(40)) + "\n```"
    parts = split_markdown(f"{prose}\n\n{code}\n\nafter", 1000)
    _check(parts, 1000)
    assert sum(code in p for p in parts) == 1


def test_a_code_block_longer_than_a_message_becomes_closed_blocks() -> None:
    lines = [f"line {i}: if (a < b && c) {{ 中文 }}" for i in range(400)]
    parts = split_markdown("```c\n" + "\n".join(lines) + "\n```", MESSAGE_LIMIT)
    _check(parts, MESSAGE_LIMIT)
    assert len(parts) > 2 and all(p.startswith("```c\n") and p.endswith("\n```") for p in parts)
    bodies = [html.unescape(re.sub(r"</?\w[^>]*>", "", render_html(p))) for p in parts]
    assert "\n".join(bodies).split("\n") == lines


@pytest.mark.parametrize("text", ["字" * 10_000, "&" * 10_000, "x" * 9_000 + "\n" + "<" * 3_000])
def test_a_line_longer_than_a_message_is_cut(text: str) -> None:
    parts = split_markdown(text)
    _check(parts, MESSAGE_LIMIT)
    assert "".join(p.replace("\n", "") for p in parts) == text.replace("\n", "")
