"""The docs hold together: every relative link and image of README.md and docs/*.md points to a file that exists
(and, with `#anchor`, to one of its headings), every page of docs/ can be reached from the README, and the README
shows the exact command `.ci/run` runs.

Anchors are the ones GitHub makes from a heading: lower-cased, markup and punctuation dropped (letters of any
script kept), spaces turned into hyphens, and `-1`, `-2` … added to a repeated one. Links inside code (fenced
blocks and `spans`) are text, not links. The checker is plain functions over text, so the self-tests at the bottom
run it on small pages.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CI_RUN = REPO / ".ci" / "run"

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)[\s\S]*?(?<!`)\1(?!`)")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
EXTERNAL = ("http://", "https://", "mailto:")


def pages() -> list[Path]:
    """The README and every page of docs/."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """`text` without fenced code blocks and code spans: what a reader sees as Markdown, not as code."""
    kept: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)[0] * len(opening.group(1))
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            kept.append(line)
    return CODE_SPAN.sub("", "\n".join(kept))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: links, code and emphasis reduced to their words, punctuation
    dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").lower()
    return "".join(ch for ch in text if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor the headings of a page make (a repeated one gets -1, -2 …)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fence: str | None = None
    for line in text.split("\n"):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)[0] * len(opening.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> Iterator[str]:
    """The targets of the page's links and images, outside code."""
    for match in LINK.finditer(prose(text)):
        yield match.group(1)


def broken(page: Path, text: str) -> list[str]:
    """What is wrong with each relative link of `page` (whose text is `text`): a missing file or heading."""
    problems: list[str] = []
    for target in links(text):
        if not target or target.startswith(EXTERNAL):
            continue
        path_part, _, anchor = target.partition("#")
        if not path_part:  # an anchor of this page
            if anchor not in anchors(text):
                problems.append(f"{page.name}: {target}: no heading makes #{anchor}")
            continue
        file = (page.parent / path_part).resolve()
        if not file.exists():
            problems.append(f"{page.name}: {target}: no such file")
        elif anchor and (file.suffix != ".md" or file.is_dir()):
            problems.append(f"{page.name}: {target}: an anchor into a file that is not a Markdown page")
        elif anchor and anchor not in anchors(file.read_text(encoding="utf-8")):
            problems.append(f"{page.name}: {target}: no heading makes #{anchor}")
    return problems


def linked_pages(page: Path, text: str) -> set[Path]:
    """The Markdown pages `page` links to."""
    found: set[Path] = set()
    for target in links(text):
        path_part = target.partition("#")[0]
        if path_part and not target.startswith(EXTERNAL) and path_part.endswith(".md"):
            found.add((page.parent / path_part).resolve())
    return found


# -- the docs as they are -----------------------------------------------------------------------------------


def test_every_relative_link_and_image_resolves() -> None:
    problems = [problem for page in pages() for problem in broken(page, page.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_every_docs_page_can_be_reached_from_the_readme() -> None:
    reached, todo = {README.resolve()}, [README.resolve()]
    while todo:
        page = todo.pop()
        for target in linked_pages(page, page.read_text(encoding="utf-8")) - reached:
            if target.exists():
                reached.add(target)
                todo.append(target)
    unreached = [page.name for page in pages() if page.resolve() not in reached]
    assert not unreached, unreached


def test_the_readme_shows_the_command_ci_runs() -> None:
    # .ci/run's last line is the README's test command, byte for byte: the two must change together.
    command = CI_RUN.read_text(encoding="utf-8").rstrip("\n").split("\n")[-1]
    assert command.startswith("python3 -m venv .venv && ")
    assert command in README.read_text(encoding="utf-8").split("\n")


def test_the_readme_stays_short() -> None:
    assert README.read_text(encoding="utf-8").count("\n") <= 250


# -- the checker, on small pages ----------------------------------------------------------------------------


def test_slugs_follow_github_in_english_and_chinese() -> None:
    assert slug("Memory you can measure: `picoclaw memory stats`") == "memory-you-can-measure-picoclaw-memory-stats"
    assert slug("Approve / Deny") == "approve--deny"
    assert slug("Every request fits the model's window") == "every-request-fits-the-models-window"
    assert slug("Evolution: tunes itself (off by default)") == "evolution-tunes-itself-off-by-default"
    assert slug("记忆与策略：怎样调") == "记忆与策略怎样调"
    assert slug("[Lessons](lessons.md) and skills") == "lessons-and-skills"
    assert anchors("# A\n## Notes\n```\n## not a heading\n```\n## Notes\n") == {"a", "notes", "notes-1"}


def test_the_checker_finds_a_missing_file_or_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n## 定时任务\n", encoding="utf-8")
    (tmp_path / "pic.png").write_bytes(b"\x89PNG")
    page = tmp_path / "page.md"
    text = ("# Page\n## Here\n[ok](other.md#定时任务) [ok](#here) ![ok](pic.png) [web](https://example.com/x)\n"
            "[gone](missing.md) [no heading](other.md#nowhere) [self](#elsewhere) ![no image](gone.png)\n"
            "`[in code](missing-too.md)`\n```\n[in a block](missing-three.md)\n```\n")
    assert broken(page, text) == [
        "page.md: missing.md: no such file",
        "page.md: other.md#nowhere: no heading makes #nowhere",
        "page.md: #elsewhere: no heading makes #elsewhere",
        "page.md: gone.png: no such file",
    ]
    assert linked_pages(page, text) == {(tmp_path / "other.md").resolve(), (tmp_path / "missing.md").resolve()}
