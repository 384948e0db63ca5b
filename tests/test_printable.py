"""`printable`: text freed of terminal escapes, whole or streamed in pieces, with Chinese, emoji and tabs kept."""

from __future__ import annotations

import random

import pytest

from picoclaw.printable import HELD_MAX_CHARS, PrintablePieces, has_controls, printable

# Bytes that would act on a terminal if printed: ESC, BEL, the 8-bit CSI and OSC, and the string terminator.
ACTING = ("\x1b", "\x07", "\x9b", "\x9d", "\x9c")


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("a\x1b[31mred\x07", "ared", id="csi-colour-and-bell"),
    pytest.param("\x1b[2J\x1b[1;1Hcleared", "cleared", id="csi-clear-and-move"),
    pytest.param("\x1b[38;2;255;0;0m红色\x1b[0m red", "红色 red", id="csi-truecolour-chinese"),
    pytest.param("\x1b]0;pwned title\x07after", "after", id="osc-title-bel"),
    pytest.param("\x1b]0;标题\x1b\\之后", "之后", id="osc-title-st-chinese"),
    pytest.param("\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\ here", "click here", id="osc-hyperlink"),
    pytest.param("\x9b31mred\x9b0m", "red", id="8-bit-csi"),
    pytest.param("\x9d0;title\x9cafter", "after", id="8-bit-osc"),
    pytest.param("\x1bPq#0;2;0;0;0\x1b\\sixel", "sixel", id="dcs"),
    pytest.param("\x1b7saved\x1b8\x1bc", "saved", id="two-byte-escapes"),
    pytest.param("nul\x00 del\x7f bs\x08 nel\x85 end", "nul del bs nel end", id="c0-c1-del"),
    pytest.param("progress 10%\rdone", "progress 10%\ndone", id="lone-cr-is-a-line-break"),
    pytest.param("line one\r\nline two\r\n", "line one\nline two\n", id="crlf"),
    pytest.param("\x1b]0;never ended\nnext line", "\nnext line", id="unterminated-osc-takes-its-line-only"),
    pytest.param("\x1b[31中文", "31中文", id="csi-cut-by-a-non-ascii-char"),
    pytest.param("\x1b", "", id="lone-esc"),
])
def test_escape_sequences_and_controls_go(text: str, expected: str) -> None:
    assert printable(text) == expected
    assert not any(byte in printable(text) for byte in ACTING)


@pytest.mark.parametrize("text", [
    "我的狗叫 Bob，是一只柯基。🐕🎉",
    "tabs\tstay\n\tand newlines too\n",
    "「全角」——符号 and ASCII punctuation [31m ; ] \\",
    "",
])
def test_ordinary_text_passes_unchanged(text: str) -> None:
    assert printable(text) == text
    assert not has_controls(text)


def test_has_controls_names_what_would_be_removed() -> None:
    assert has_controls("a\x1b[31mb") and has_controls("bell\x07") and has_controls("\x9b1m")
    # A CR becomes a line break: nothing is removed, so it is not reported as a control to strip.
    assert not has_controls("windows\r\nline") and not has_controls("old mac\rline")


SAMPLES = [
    "a\x1b[31mred\x1b[0m and 中文\x07!",
    "\x1b]0;title 标题\x07after\x1b]2;two\x1b\\end",
    "\x9b31m8-bit\x9b0m \x9d0;t\x9c done",
    "one\r\ntwo\rthree\r\n",
    "\x1b7\x1b8\x1b(B plain 🎉\ttab",
    "\x1b]0;no end of this title\nthe next line stays",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_pieces_cut_anywhere_print_what_the_whole_prints(text: str) -> None:
    """A streamed answer may cut a sequence (ESC | [3 | 1m) or a CRLF between pieces; nothing leaks, and
    the pieces together show exactly what the whole text would."""
    for first in range(len(text) + 1):
        for second in range(first, len(text) + 1):
            pieces = PrintablePieces()
            shown = [pieces.feed(text[:first]), pieces.feed(text[first:second]), pieces.feed(text[second:]),
                     pieces.end()]
            assert "".join(shown) == printable(text), (first, second)
            for part in shown:
                assert not any(byte in part for byte in ACTING), (first, second, part)


def test_pieces_of_random_text_print_what_the_whole_prints() -> None:
    alphabet = ["\x1b", "[", "]", "\\", "\x07", "\x9b", "\x9d", "\x9c", "\r", "\n", "\t", "0", ";", "3", "1",
                "m", "P", "(", "B", "a", "中", "🎉", " "]
    chance = random.Random(23)
    for _ in range(2000):
        text = "".join(chance.choice(alphabet) for _ in range(chance.randint(0, 40)))
        pieces = PrintablePieces()
        shown = []
        rest = text
        while rest:
            size = chance.randint(1, 5)
            shown.append(pieces.feed(rest[:size]))
            rest = rest[size:]
        shown.append(pieces.end())
        assert "".join(shown) == printable(text), repr(text)
        assert not any(byte in part for part in shown for byte in ACTING), repr(text)


def test_plain_pieces_are_shown_at_once_and_a_cut_sequence_only_until_it_ends() -> None:
    pieces = PrintablePieces()
    assert pieces.feed("你好 ") == "你好 "
    assert pieces.feed("hello\x1b[3") == "hello"  # held: the sequence may go on
    assert pieces.feed("1mred") == "red"
    assert pieces.feed(" line\r") == " line"  # held: a LF may follow
    assert pieces.feed("\nnext") == "\nnext"
    assert pieces.end() == ""


def test_a_sequence_that_never_ends_is_held_only_so_long() -> None:
    pieces = PrintablePieces()
    assert pieces.feed("\x1b[") == ""
    shown = pieces.feed("1" * (HELD_MAX_CHARS + 10))
    assert shown == "1" * (HELD_MAX_CHARS + 10)  # the ESC [ went; the rest is harmless text, shown now
    assert pieces.end() == ""
