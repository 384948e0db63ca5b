"""Eval cases: a question and what identifies its answer, one JSON object a line.

`{"question": "What is my dog called?", "expect": "Bob"}`: `expect` is a piece of the entry, note or lesson that
answers the question, compared without regard to case or runs of whitespace (`holds`). Other keys are kept for
the reader (`from`: where a generated case came from) and ignored by the run. A case file that is not UTF-8, a
line that is not a JSON object, a missing or empty field, an empty file and a huge one are each refused in one
line naming the file (and the line), so nothing is scored from half a file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from picoclaw.disk.bounded_read import FileTooLargeError, read_bounded
from picoclaw.errors import PicoclawError
from picoclaw.memory.terms import normalize

CASES_NAME = "memory/eval/cases.jsonl"  # the scope's saved cases (generated, then the user's to edit)
MAX_FILE_BYTES = 2_000_000
MAX_CASES = 5_000
MAX_FIELD_CHARS = 2_000
SHAPE = '{"question": …, "expect": …}'

# Where a case came from, as the report names it.
FILE, GENERATED, PAST_TURN = "file", "generated", "past turn"


class CaseFileError(PicoclawError):
    """An eval case file that cannot be used, in one line; nothing was scored."""


@dataclass(frozen=True)
class EvalCase:
    """One question, the text that identifies its answer, and where the case came from."""

    question: str
    expect: str
    source: str = FILE
    origin: str = ""  # a generated case's entry (`memory/MEMORY.md:12`), a past turn's transcript

    def record(self) -> dict[str, str]:
        """The case as a line of a case file."""
        record = {"question": self.question, "expect": self.expect, "source": self.source}
        if self.origin:
            record["from"] = self.origin
        return record


def holds(text: str, expect: str) -> bool:
    """Whether `text` holds `expect`, case and runs of whitespace aside."""
    wanted = normalize(expect)
    return bool(wanted) and wanted in normalize(text)


def parse_cases(data: bytes, where: str, *, source: str = FILE) -> list[EvalCase]:
    """The cases of a JSONL case file's bytes; CaseFileError naming `where` (and the line) otherwise."""
    if len(data) > MAX_FILE_BYTES:
        raise CaseFileError(f"{where} is larger than {MAX_FILE_BYTES:,} bytes, the most an eval case file may hold "
                            "(split it, or keep the cases you mean to run)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CaseFileError(f"{where} is not UTF-8 text (byte {exc.start}); an eval case file has one JSON "
                            f"object a line: {SHAPE}") from None
    cases: list[EvalCase] = []
    for number, line in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        if not line.strip():
            continue
        if len(cases) >= MAX_CASES:
            raise CaseFileError(f"{where} holds more than {MAX_CASES:,} cases; an eval runs at most that many")
        cases.append(_case(line, f"{where}:{number}", source))
    if not cases:
        raise CaseFileError(f"{where} holds no cases; write one JSON object a line: {SHAPE}")
    return cases


def read_case_file(path: Path) -> list[EvalCase]:
    """The cases of the file at `path` (read at most MAX_FILE_BYTES); CaseFileError naming it otherwise."""
    try:
        data = read_bounded(path, MAX_FILE_BYTES)
    except FileTooLargeError:
        raise CaseFileError(f"{path} is larger than {MAX_FILE_BYTES:,} bytes, the most an eval case file may hold "
                            "(split it, or keep the cases you mean to run)") from None
    except FileNotFoundError:
        raise CaseFileError(f"{path}: file not found") from None
    except OSError as exc:
        raise CaseFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_cases(data, str(path))


def _case(line: str, where: str, source: str) -> EvalCase:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise CaseFileError(f"{where}: not JSON ({str(exc).split(':')[0]}); each line is {SHAPE}") from None
    if not isinstance(value, dict):
        raise CaseFileError(f"{where}: a JSON {type(value).__name__}, not an object; each line is {SHAPE}")
    fields = {}
    for name in ("question", "expect"):
        field = value.get(name)
        if not isinstance(field, str) or not field.strip():
            said = "missing" if name not in value else "not a text" if not isinstance(field, str) else "empty"
            raise CaseFileError(f'{where}: "{name}" is {said}; each line is {SHAPE}')
        if len(field) > MAX_FIELD_CHARS:
            raise CaseFileError(f'{where}: "{name}" is {len(field):,} characters; at most {MAX_FIELD_CHARS:,}')
        fields[name] = field.strip()
    origin = value.get("from")
    given = value.get("source")
    return EvalCase(fields["question"], fields["expect"], given if isinstance(given, str) and given else source,
                    origin if isinstance(origin, str) else "")


def cases_jsonl(cases: Iterable[EvalCase]) -> bytes:
    """A case file holding `cases`, one a line, Chinese as written (a person reads and edits it)."""
    return b"".join(orjson.dumps(case.record()) + b"\n" for case in cases)


def merged(first: Iterable[EvalCase], more: Iterable[EvalCase]) -> list[EvalCase]:
    """`first`, then the cases of `more` whose question is not among them yet (case and spacing aside)."""
    out: list[EvalCase] = []
    seen: set[str] = set()
    for case in [*first, *more]:
        key = normalize(case.question)
        if key not in seen:
            seen.add(key)
            out.append(case)
    return out
