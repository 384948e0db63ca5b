"""A workspace's eval set: the cases saved in memory/eval/cases.jsonl (generated, then the user's to edit) and the
cases its past turns make, when there are enough; and the saved file written back after a generation."""

from __future__ import annotations

from picoclaw.memory.eval.cases import CASES_NAME, EvalCase, cases_jsonl, merged, parse_cases
from picoclaw.memory.eval.past_turns import past_turn_cases
from picoclaw.memory.workspace import Workspace


def saved_cases(workspace: Workspace) -> list[EvalCase]:
    """The saved cases ([] when there is no file); CaseFileError when the file cannot be used."""
    found = workspace.store.documents.read(CASES_NAME)
    if found.data is None:
        return []
    return parse_cases(found.data, CASES_NAME)


def eval_set(workspace: Workspace) -> list[EvalCase]:
    """The saved cases, then the past turns' (when there are enough) that ask a question not among them."""
    return merged(saved_cases(workspace), past_turn_cases(workspace.sessions(), workspace.root))


def save_cases(workspace: Workspace, cases: list[EvalCase]) -> None:
    """Write `cases` as the saved case file (whole: the old file's cases are among them)."""
    workspace.store.documents.replace(CASES_NAME, cases_jsonl(cases))
