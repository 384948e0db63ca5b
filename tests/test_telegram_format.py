"""Markdown → Telegram HTML (markdown-it-py), and splitting the HTML into messages Telegram takes.

The checks of the output are independent of the module: html.parser reads every part, the tags must be
Telegram's and well nested, and the visible text is measured as Telegram measures it (UTF-16 code units).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from picoclaw.channels.telegram import MESSAGE_LIMIT, MessagePart, render_html, split, telegram_parts

TELEGRAM_TAGS = {"b", "i", "u", "s", "code", "pre", "a", "blockquote", "tg-spoiler"}


class TelegramHTML(HTMLParser):
    """Reads HTML as Telegram's HTML mode would and records every rule it breaks in `problems`."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.text: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in TELEGRAM_TAGS:
            self.problems.append(f"<{tag}> is not a Telegram tag")
        if tag == "a" and [name for name, _ in attrs] != ["href"]:
            self.problems.append(f"<a> with {attrs}")
        if tag == "code" and attrs and not (self.stack[-1:] == ["pre"] and len(attrs) == 1
                                            and (attrs[0][1] or "").startswith("language-")):
            self.problems.append(f"<code {attrs}>")
        if tag not in ("a", "code") and attrs:
            self.problems.append(f"<{tag}> with {attrs}")
        if tag in self.stack and tag in ("a", "blockquote", "code", "pre"):
            self.problems.append(f"<{tag}> inside <{tag}>")
        if ("code" in self.stack or "pre" in self.stack) and not (tag == "code" and self.stack[-1:] == ["pre"]):
            self.problems.append(f"<{tag}> inside code")
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:]}")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def read(html: str) -> str:
    """The visible text of `html`, after checking that Telegram would accept it."""
    parser = TelegramHTML()
    parser.feed(html)
    parser.close()
    assert not parser.problems and not parser.stack, (parser.problems, parser.stack, html)
    return "".join(parser.text)


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def check_parts(parts: list[MessagePart], whole_markdown: str, limit: int = MESSAGE_LIMIT) -> None:
    """Every part fits and is well formed; together they show all of the text, in order."""
    assert parts
    whole = read(render_html(whole_markdown))
    position = 0
    for part in parts:
        visible = read(part.html)
        assert 0 < utf16(visible) <= limit and utf16(part.plain) <= limit, (utf16(visible), utf16(part.plain))
        assert visible.strip(), part
        # Contiguous: only whitespace (at the cut) lies between one part's text and the next.
        found = whole.find(visible.strip(), position)
        assert found >= 0 and whole[position:found].strip() == "", (whole[position:position + 80], visible[:80])
        position = found + len(visible.strip())
    assert whole[position:].strip() == ""


# -- rendering ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("markdown", "expected"), [
    ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
    ("**bold** *italic* _also_ ~~gone~~", "<b>bold</b> <i>italic</i> <i>also</i> <s>gone</s>"),
    ("***both***", "<i><b>both</b></i>"),
    ("# Title\nbody", "<b>Title</b>\nbody"),
    ("## 标题 **Title**", "<b>标题 Title</b>"),  # no <b> inside <b>
    ("use `x <y> & *z*` here", "use <code>x &lt;y&gt; &amp; *z*</code> here"),
    ("snake_case_name and 2*3*4 and a*b*c", "snake_case_name and 2*3*4 and a*b*c"),
    ("2 * 3 = 6, **5**x", "2 * 3 = 6, <b>5</b>x"),
    ("<script>alert(1)</script> <b>raw</b>", "&lt;script&gt;alert(1)&lt;/script&gt; &lt;b&gt;raw&lt;/b&gt;"),
    ("<div>\nblock html\n</div>", "&lt;div&gt;\nblock html\n&lt;/div&gt;"),
    ("line one\nline two  \nline three", "line one\nline two\nline three"),
    ("first\n\n\n\nsecond", "first\n\nsecond"),
    (r"\*not italic\* and \_not\_", "*not italic* and _not_"),
    ("a\n\n---\n\nb", "a\n\n────────────\n\nb"),
    ("tom &amp; jerry", "tom &amp; jerry"),
])
def test_markdown_becomes_telegram_html(markdown: str, expected: str) -> None:
    assert render_html(markdown) == expected
    read(expected)


@pytest.mark.parametrize(("markdown", "expected"), [
    ("[docs](https://x.com/_foo_/bar)", '<a href="https://x.com/_foo_/bar">docs</a>'),
    ("see https://x.com/_private_ now", "see https://x.com/_private_ now"),
    ("https://x.com/_private_", "https://x.com/_private_"),
    ("*see https://x.com/a_b_c*", "<i>see https://x.com/a_b_c</i>"),
    ("(see https://x.com/_p_).", "(see https://x.com/_p_)."),
    ("看这里：https://x.com/_a_，好吗", "看这里：https://x.com/_a_，好吗"),
    ("[w](https://en.wikipedia.org/wiki/Foo_(bar))", '<a href="https://en.wikipedia.org/wiki/Foo_(bar)">w</a>'),
    ("https://en.wikipedia.org/wiki/Foo_(bar)", "https://en.wikipedia.org/wiki/Foo_(bar)"),
    ('[q](https://example.com/?a=1&b="2")', '<a href="https://example.com/?a=1&amp;b=&quot;2&quot;">q</a>'),
    ("[中文](https://zh.wikipedia.org/wiki/中文)", '<a href="https://zh.wikipedia.org/wiki/中文">中文</a>'),
    ("<https://x.com/a_b_>", '<a href="https://x.com/a_b_">https://x.com/a_b_</a>'),
    ("[**bold** link](https://a.b/c_d)", '<a href="https://a.b/c_d"><b>bold</b> link</a>'),
    ("[`code` link](https://a.b/)", '<a href="https://a.b/">code link</a>'),  # no <code> inside <a>
    ("[m](mailto:a@b.c) [t](tg://user?id=1)", '<a href="mailto:a@b.c">m</a> <a href="tg://user?id=1">t</a>'),
    ("[x](javascript:alert(1))", "x (javascript:alert(1))"),
    ("[f](ftp://host/file) [rel](/docs/a_b)", "f (ftp://host/file) rel (/docs/a_b)"),
    ("![a cat](https://x.com/cat.png)", '<a href="https://x.com/cat.png">a cat</a>'),
    ("![](https://x.com/cat.png)", '<a href="https://x.com/cat.png">https://x.com/cat.png</a>'),
])
def test_links_keep_their_urls_exactly(markdown: str, expected: str) -> None:
    assert render_html(markdown) == expected
    read(expected)


@pytest.mark.parametrize(("markdown", "expected"), [
    ("中文**粗体**和*斜体*", "中文<b>粗体</b>和<i>斜体</i>"),
    ("**注意：**这是重点。", "<b>注意：</b>这是重点。"),
    ("（见**附录**）", "（见<b>附录</b>）"),
    ("**粗体**，然后*斜体*。~~删除~~！", "<b>粗体</b>，然后<i>斜体</i>。<s>删除</s>！"),
    ("使用**Python**编程，**中文**English", "使用<b>Python</b>编程，<b>中文</b>English"),
    ("「引号」和《书名》 & <标签>", "「引号」和《书名》 &amp; &lt;标签&gt;"),
])
def test_chinese_text_and_punctuation(markdown: str, expected: str) -> None:
    assert render_html(markdown) == expected


def test_emoji_pass_through_untouched() -> None:
    markdown = "**Done** ✅ 👍🏽 👨‍👩‍👧 🇨🇳 *好的* 😀"
    assert render_html(markdown) == "<b>Done</b> ✅ 👍🏽 👨‍👩‍👧 🇨🇳 <i>好的</i> 😀"


def test_code_blocks_are_escaped_and_keep_their_language() -> None:
    markdown = "Look:\n```python\nif a < b and '**' in s & t:\n    print(\"中文\")\n```\ndone"
    assert render_html(markdown) == ('Look:\n<pre><code class="language-python">if a &lt; b and \'**\' in s &amp; t:\n'
                                     '    print("中文")</code></pre>\ndone')
    assert render_html("~~~\n<html> & _x_\n~~~") == "<pre>&lt;html&gt; &amp; _x_</pre>"
    assert render_html("~~~js extra words\nlet a = 1;\n~~~") == '<pre><code class="language-js">let a = 1;</code></pre>'
    assert render_html("    indented <code>\n    & more") == "<pre>indented &lt;code&gt;\n&amp; more</pre>"
    assert render_html('```a"><b>\nx\n```') == '<pre><code class="language-ab">x</code></pre>'


def test_quotes_become_blockquotes_never_nested() -> None:
    assert render_html("> quoted **bold**\n> more") == "<blockquote>quoted <b>bold</b>\nmore</blockquote>"
    assert render_html("> outer\n>\n> > inner\n\nafter") == "<blockquote>outer\n\ninner</blockquote>\n\nafter"
    read(render_html("> # 标题\n> - a\n> ```\n> code\n> ```"))


def test_lists_nested_and_numbered() -> None:
    markdown = ("Steps:\n"
                "1. first *one*\n"
                "2. second\n"
                "   - bullet a\n"
                "   - bullet b\n"
                "     1. deep\n"
                "3. third\n"
                "\n"
                "- x\n"
                "- y")
    assert render_html(markdown) == ("Steps:\n"
                                     "1. first <i>one</i>\n"
                                     "2. second\n"
                                     "   • bullet a\n"
                                     "   • bullet b\n"
                                     "     1. deep\n"
                                     "3. third\n"
                                     "\n"
                                     "• x\n"
                                     "• y")
    assert render_html("7. seven\n8. eight") == "7. seven\n8. eight"
    assert render_html("- loose\n\n- items\n  continued") == "• loose\n\n• items\n  continued"


def test_tables_become_aligned_pre_blocks() -> None:
    markdown = ("| Name | 数量 | Note |\n"
                "|:-----|-----:|:----:|\n"
                "| apple | 3 | `a<b` |\n"
                "| 香蕉 | 12 | [x](https://x.com) |")
    assert render_html(markdown) == ("<pre>Name  | 数量 |       Note\n"
                                     "------+------+------------------\n"
                                     "apple |    3 |        a&lt;b\n"
                                     "香蕉  |   12 | x (https://x.com)</pre>")


def test_markers_that_overlap_render_well_nested() -> None:
    for markdown in ["**a *b** c*", "**粗 *斜** 体*", "~~x **y~~ z**", "*[链接*](https://example.com)",
                     "_a **b_ c**", "**[a](https://x.com/_b_)**c*"]:
        read(render_html(markdown))


def test_mixed_markup_always_renders_well_nested() -> None:
    pieces = ["**", "*", "_", "__", "~~", "`", "[链接](https://x.org/)", "中文", "word", " ", "\n", "# ", "<&>",
              "```py\n", "\n```", "snake_case", "2*3", "> ", "- ", "| a |", "https://x.com/_a_"]
    # Every arrangement of three pieces, twice over: a fixed, exhaustive grid instead of random input.
    for first in pieces:
        for second in pieces:
            for third in pieces:
                read(render_html(first + second + third + first + third + second))


# -- splitting ----------------------------------------------------------------------------------------------


def test_short_text_is_one_part_and_blank_text_none() -> None:
    assert telegram_parts("hello **world**\n\n你好") == [
        MessagePart("hello <b>world</b>\n\n你好", "hello world\n\n你好")]
    assert telegram_parts("   \n\n  ") == []
    assert telegram_parts("see [docs](https://x.com/_a_)") == [
        MessagePart('see <a href="https://x.com/_a_">docs</a>', "see docs (https://x.com/_a_)")]


@pytest.mark.parametrize("word", ["word & <tag> **bold** ", "中文 & <标签> **粗体** 😀 "])
def test_paragraphs_are_kept_whole_and_in_order(word: str) -> None:
    markdown = "\n\n".join(f"P{i} " + (word * 12).strip() for i in range(60))
    parts = telegram_parts(markdown, 1000)
    check_parts(parts, markdown, 1000)
    assert "\n\n".join(part.html for part in parts) == render_html(markdown)  # cut only between paragraphs
    assert all(part.html.startswith("P") for part in parts)


def test_a_code_block_is_not_split_when_it_fits_in_a_part_of_its_own() -> None:
    prose = "intro " * 100
    code = "```js\n" + "\n".join(f"let x{i} = a < b;" for i in range(40)) + "\n```"
    markdown = f"{prose}\n\n{code}\n\nafter"
    parts = telegram_parts(markdown, 1000)
    check_parts(parts, markdown, 1000)
    assert sum(render_html(code) in part.html for part in parts) == 1


def test_a_code_block_longer_than_a_message_is_closed_and_reopened() -> None:
    lines = [f"line {i}: if (a < b && c) {{ 中文 }}" for i in range(400)]
    markdown = "```c\n" + "\n".join(lines) + "\n```"
    parts = telegram_parts(markdown)
    check_parts(parts, markdown)
    assert len(parts) > 2
    assert all(p.html.startswith('<pre><code class="language-c">') and p.html.endswith("</code></pre>") for p in parts)
    assert "\n".join(read(p.html) for p in parts).split("\n") == lines  # cut at line ends only


def test_inline_tags_open_at_a_cut_are_reopened_with_their_attributes() -> None:
    markdown = "**" + ("粗体字 " * 400).strip() + "**\n\n[" + "link text " * 200 + "](https://x.com/_a_)"
    parts = telegram_parts(markdown, 500)
    check_parts(parts, markdown, 500)
    bold = [p for p in parts if "粗" in p.html]
    linked = [p for p in parts if "link text" in p.html]
    assert len(bold) > 1 and all(p.html.startswith("<b>") and p.html.endswith("</b>") for p in bold)
    assert len(linked) > 1
    assert all(p.html.startswith('<a href="https://x.com/_a_">') and p.html.endswith("</a>") for p in linked)
    assert all(p.plain.endswith(" (https://x.com/_a_)") for p in linked)


@pytest.mark.parametrize("text", ["字" * 10_000, "&" * 10_000, "<>" * 5_000, "x" * 9_000 + "\n" + "<" * 3_000])
def test_a_line_longer_than_a_message_is_cut_between_characters(text: str) -> None:
    parts = telegram_parts(text)
    check_parts(parts, text)
    for part in parts:  # never inside an entity
        assert re.fullmatch(r"(?:[^&<>]|&amp;|&lt;|&gt;|\n)*", part.html), part.html[:50]
    assert "".join(read(p.html) for p in parts).replace("\n", "") == text.replace("\n", "")


def test_emoji_are_counted_as_two_and_never_cut_apart() -> None:
    text = "👍🏽" * 3_000 + " " + "😀" * 3_000
    parts = telegram_parts(text, 101)  # odd on purpose: a half emoji would fit
    check_parts(parts, text, 101)
    for part in parts:
        visible = read(part.html)
        assert re.fullmatch("(👍🏽)+|😀+", visible), visible
        assert utf16(visible) <= 101
    family = "👨‍👩‍👧" * 500
    parts = telegram_parts(family, 100)
    check_parts(parts, family, 100)
    assert all(re.fullmatch("(👨‍👩‍👧)+", read(p.html)) for p in parts)


def test_a_huge_mixed_reply_is_split_into_well_formed_parts() -> None:
    paragraphs: list[str] = []
    for i in range(60):
        paragraphs.append(f"## Section {i}\n\nSome **bold {i}** text with `code <{i}>`, a [link](https://x.com/_{i}_) "
                          f"and 中文**粗体**、*斜体*。 Emoji 😀👍🏽 & snake_case_{i}. " * 3)
        if i % 10 == 0:
            paragraphs.append("- item a\n- item b\n  - nested *c*\n\n> a quote with **bold**\n> 第二行")
        if i % 15 == 0:
            paragraphs.append("| a | 表 |\n|---|---|\n| 1 | 二 |")
    prose = "\n\n".join(paragraphs)
    code = "```python\n" + "\n".join(f"value_{i} = compute(a < b, c & d)  # 注释 {i} 😀" for i in range(250)) + "\n```"
    markdown = prose[:len(prose) // 2].rsplit("\n\n", 1)[0] + "\n\n" + code + "\n\n" + prose[len(prose) // 2:]
    assert len(prose) > 20_000 and len(code) > 10_000

    parts = telegram_parts(markdown)
    check_parts(parts, markdown)
    assert len(parts) >= 8
    code_parts = [p for p in parts if "<pre><code" in p.html]
    assert len(code_parts) >= 3
    assert all(p.html.endswith("</code></pre>") for p in code_parts[:-1])
    assert all(p.plain == read(p.html) for p in parts if "<a " not in p.html)


@pytest.mark.parametrize("text", [
    "Deploy on **Thursday** & roll back if p95 > 300 ms; see [the board](https://g.example/d?a=1&b=2). " * 12,
    "我们在**周四**部署；如果延迟超过 300 毫秒就回滚，详见[仪表盘](https://g.example/d)。😀👍🏽 " * 12,
])
def test_atoms_kept_between_replies_are_bounded_and_change_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                  text: str) -> None:
    """The atoms a split shares between replies (split.py) are dropped at their bound, and a reply split with
    the store full, emptied or kept small comes out the same."""
    expected = telegram_parts(text, 120)
    check_parts(expected, text, 120)
    assert len(expected) > 3
    monkeypatch.setattr(split, "SHARED_ATOMS_KEPT", 8)
    split._SHARED_ATOMS.clear()
    assert telegram_parts(text, 120) == expected  # emptied, and cleared again at every 8 new atoms
    assert 0 < len(split._SHARED_ATOMS) <= 8


def test_utf16_length_counts_as_telegram_does() -> None:
    assert [split.utf16_length(text) for text in ("", "abc", "中文。", "😀", "👍🏽", "e\u0301")] == [0, 3, 3, 2, 4, 2]
    assert split.utf16_length("a\ud800b") == 3  # a lone surrogate (str allows one) is one unit, not an error
