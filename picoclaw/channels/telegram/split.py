"""Rendered Telegram HTML cut into messages: each part holds at most `limit` characters of visible text,
counted as Telegram counts them (UTF-16 code units, tags removed, entities unescaped).

Cuts fall between blocks, else at a line break, else at a space, else anywhere but inside a tag, an entity
or a character sequence drawn as one glyph. Tags open at a cut are closed at the end of the part and
opened again at the start of the next. Each part carries a plain-text twin for when Telegram refuses the
HTML.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass
from typing import NamedTuple

MESSAGE_LIMIT = 4096  # characters (UTF-16 code units) of one Telegram message, after entities are parsed out
# The renderer puts this between two blocks, so a cut there is preferred over a line break inside a block.
BLOCK_MARK = "\x1e"


@dataclass(frozen=True)
class MessagePart:
    """One message: Telegram HTML, and the same text without markup (links as "text (url)")."""

    html: str
    plain: str


def split_html(rendered: str, limit: int = MESSAGE_LIMIT) -> list[MessagePart]:
    """`rendered` HTML (with BLOCK_MARKs between blocks) as messages of at most `limit` visible units, in order."""
    atoms = _atoms(rendered, limit)
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
    # Counted by the codec in C: two bytes a unit (a lone surrogate, which str allows, is one unit as before).
    return len(text.encode("utf-16-le", "surrogatepass")) // 2



class _Atom(NamedTuple):
    """An indivisible piece of rendered HTML: a tag, an entity, one character, or a run of whitespace."""

    kind: str  # "block" (between blocks), "newline", "space", "char", "entity", "open", "close"
    raw: str  # as it goes into the HTML
    text: str = ""  # what Telegram shows of it
    cost: int = 0  # UTF-16 units it adds to a part (an <a> adds its " (url)" of the plain twin)
    tag: str = ""
    href: str = ""


# `chars`: a run of characters none of the others can start with, each an atom of its own (matched as a run: a
# match a character cost most of the splitting); `char`: any other one, a "<" or "&" that starts no tag or entity.
_ATOM = re.compile(r"(?P<block>\x1e\n*)|(?P<tag><[^>]*>)|(?P<entity>&(?:[a-z]+|#[0-9]+|#x[0-9a-f]+);)"
                   r"|(?P<newline>\n)|(?P<space>[ \t])|(?P<chars>[^<&\n \t\x1e]+)|(?P<char>.)",
                   re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r'<(/?)([a-z-]+)(?:\s+href="([^"]*)")?')
_SEPARATORS = ("block", "newline", "space")
_GLUE = {"\u200d", "\u20e3"}  # zero-width joiner, combining keycap
SHARED_ATOMS_KEPT = 4096  # the most atoms kept by their raw text (a Chinese reply has a few hundred characters)


class _SharedAtoms(dict[str, _Atom]):
    """The atom of a character, a space, a line break, an entity or a block mark, by its raw text: made once and
    shared (an atom is immutable), as making one a character was most of the splitting's cost."""

    def __missing__(self, raw: str) -> _Atom:
        if len(self) >= SHARED_ATOMS_KEPT:
            self.clear()
        match = _ATOM.fullmatch(raw)
        assert match is not None and match.lastgroup != "tag", raw  # `raw` is one atom's, never a tag's
        kind = "char" if match.lastgroup in ("chars", None) else match.lastgroup
        text = raw.removeprefix(BLOCK_MARK) if kind == "block" else html.unescape(raw) if kind == "entity" else raw
        atom = self[raw] = _Atom(kind, raw.removeprefix(BLOCK_MARK), text, utf16_length(text))
        return atom


_SHARED_ATOMS = _SharedAtoms()


def _atoms(rendered: str, limit: int) -> list[_Atom]:
    atoms: list[_Atom] = []
    shared = _SHARED_ATOMS.__getitem__
    for match in _ATOM.finditer(rendered):
        kind = match.lastgroup
        if kind == "chars":
            atoms.extend(map(shared, match.group()))
        elif kind == "tag":
            raw = match.group()
            tag = _TAG.match(raw)
            assert tag is not None, raw  # the renderer made every tag
            closing, name, href = tag.group(1), tag.group(2), html.unescape(tag.group(3) or "")
            # A link's URL joins its text in the plain twin; capped so one huge URL cannot fill a part.
            cost = min(utf16_length(f" ({href})"), limit // 2) if href else 0
            atoms.append(_Atom("close" if closing else "open", raw, cost=0 if closing else cost, tag=name, href=href))
        else:
            atoms.append(shared(match.group()))
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
