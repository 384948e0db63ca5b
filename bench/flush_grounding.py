#!/usr/bin/env python3
"""Does the memory flush's grounding check (picoclaw/memory/grounding.py, issue 40) drop real facts?

What is measured
    The LoCoMo dev conversations (English and the Chinese translation) are read as chats: each session is one
    span a flush would read, and each of the two speakers in turn is "the user" (the other one is the assistant).
    A scripted perfect flush proposes, for every session, the facts the user stated: each sentence of the user's
    own turns that speaks of themselves (English: I, I'm, my, me, we, our; Chinese: 我) and ends as a statement
    ("." "!" "。" "！" or no mark, never "?" "？"), with four words or more (six CJK characters or more). Those
    sentences are chosen without any of the check's own rules, so what the check refuses of them is a loss.

    Each proposed fact goes through `grounding.check(fact, Said.of(<the user's turns of that session>), known)`,
    `known` being what the flush "wrote" before in that conversation (as MEMORY.md would hold it). Rows:

    * verbatim: the user's sentences as they are;
    * third person: the same sentences as a model writes facts ("I" → "The user", "my" → "the user's"; 我 → 用户),
      which the check must read as the user's too;
    * the other speaker's: the same selection from the other speaker's turns, proposed as the user's facts: what a
      model that keeps the assistant's words would write. These should be refused; "kept" here is leakage
      (it includes sentences the user happened to say too).

    "known" is what an earlier fact already says, "kept" is written + known (nothing the user said is lost when
    it is known); the reasons of the refusals follow. Nothing calls a model and nothing is written to disk.
    (In the Chinese file a few turns name their speaker in another transliteration than the conversation's
    header: they count as the other speaker's for both, so that row proposes a few more.)

Data: ``../shared/bench-data/locomo/locomo10.json`` and ``locomo10_CN.json`` (never committed); the dev
conversations (conv-26 conv-30 conv-41 conv-42 conv-43) only.

Run (from the repository root):
    python bench/flush_grounding.py
    python bench/flush_grounding.py --lang zh --show 10   # also print ten refused facts per row
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/flush_grounding.py` without installing picoclaw
    sys.path.insert(0, str(REPO))

from picoclaw import cjk  # noqa: E402
from picoclaw.memory.grounding import Known, Said, check  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared/bench-data/locomo"
FILES = {"en": "locomo10.json", "zh": "locomo10_CN.json"}
LANG_NAMES = {"en": "English", "zh": "Chinese"}
DEV = ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43")
MIN_WORDS = 4
MIN_CJK = 6

_SENTENCE = re.compile(r"[^.!?。！？\n]+[.!?。！？]*")
_FIRST_PERSON = re.compile(r"\b(?:I|I'm|I've|I'd|I'll|my|me|we|our|we're)\b", re.IGNORECASE)
_THIRD = ((re.compile(r"\bI am\b|\bI'm\b"), "the user is"), (re.compile(r"\bI've\b"), "the user has"),
          (re.compile(r"\bI'll\b"), "the user will"), (re.compile(r"\bI'd\b"), "the user would"),
          (re.compile(r"\bI\b"), "the user"), (re.compile(r"\b[Mm]y\b"), "the user's"),
          (re.compile(r"\bme\b"), "the user"), (re.compile("我的"), "用户的"), (re.compile("我"), "用户"))


@dataclass
class Tally:
    proposed: int = 0
    written: int = 0
    known: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    examples: list[tuple[str, str]] = field(default_factory=list)

    @property
    def kept(self) -> int:
        return self.written + self.known


def statements(text: str, lang: str) -> Iterator[str]:
    """The sentences of a turn a perfect flush would keep as the speaker's facts (see the module docstring)."""
    for match in _SENTENCE.finditer(text):
        sentence = match.group().strip()
        if not sentence or sentence.endswith(("?", "？")):
            continue
        if lang == "zh" or cjk.has_cjk(sentence):
            if "我" in sentence and len(cjk.letters(sentence)) >= MIN_CJK:
                yield sentence
        elif _FIRST_PERSON.search(sentence) and len(sentence.split()) >= MIN_WORDS:
            yield sentence


def third_person(sentence: str) -> str:
    for pattern, replacement in _THIRD:
        sentence = pattern.sub(replacement, sentence)
    return sentence[:1].upper() + sentence[1:]


def sessions(sample: dict[str, object]) -> Iterator[list[dict[str, str]]]:
    conversation = sample["conversation"]
    assert isinstance(conversation, dict)
    number = 1
    while f"session_{number}" in conversation:
        yield conversation[f"session_{number}"]
        number += 1


def run(data: Path, lang: str) -> dict[str, Tally]:
    samples = json.loads((data / FILES[lang]).read_text(encoding="utf-8"))
    rows: dict[str, Callable[[str], str] | None] = {"verbatim": str, "third person": third_person,
                                                     "the other speaker's": None}
    tallies = {name: Tally() for name in rows}
    for sample in samples:
        if sample["sample_id"] not in DEV:
            continue
        speakers = (sample["conversation"]["speaker_a"], sample["conversation"]["speaker_b"])
        for user in speakers:
            known = {name: Known.of([]) for name in rows}
            for turns in sessions(sample):
                mine = [turn["text"] for turn in turns if turn["speaker"] == user]
                theirs = [turn["text"] for turn in turns if turn["speaker"] != user]
                said = Said.of(mine)
                for name, rewrite in rows.items():
                    source = theirs if rewrite is None else mine
                    for sentence in (s for text in source for s in statements(text, lang)):
                        fact = sentence if rewrite is None else rewrite(sentence)
                        tally = tallies[name]
                        tally.proposed += 1
                        verdict = check(fact, said, known[name])
                        if verdict.action == "write":
                            tally.written += 1
                            known[name] = known[name].plus(fact)
                        elif verdict.action == "known":
                            tally.known += 1
                        else:
                            tally.rejected[verdict.reason or "?"] += 1
                            tally.examples.append((verdict.reason or "?", fact))
    return tallies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"LoCoMo folder (default {DEFAULT_DATA})")
    parser.add_argument("--lang", choices=("en", "zh", "both"), default="both")
    parser.add_argument("--show", type=int, default=0, help="print this many refused facts of each row")
    args = parser.parse_args(argv)
    langs = ("en", "zh") if args.lang == "both" else (args.lang,)
    started = time.perf_counter()
    print("Flush grounding on LoCoMo-10, dev conversations, each speaker in turn as the user, one session a flush")
    print("| language | facts proposed      | proposed | written | known | kept | kept % | rejected (by reason) |")
    print("|----------|---------------------|----------|---------|-------|------|--------|----------------------|")
    shown: list[str] = []
    for lang in langs:
        for name, tally in run(args.data, lang).items():
            share = tally.kept / tally.proposed if tally.proposed else float("nan")
            reasons = ", ".join(f"{count} {reason}" for reason, count in tally.rejected.most_common()) or "-"
            print(f"| {LANG_NAMES[lang]:<8} | {name:<19} | {tally.proposed:>8} | {tally.written:>7} | "
                  f"{tally.known:>5} | {tally.kept:>4} | {share:>6.1%} | {reasons} |")
            shown += [f"  [{LANG_NAMES[lang]}, {name}] {reason}: {fact}" for reason, fact in tally.examples[:args.show]]
    if shown:
        print("\nrefused (first of each row):")
        print("\n".join(shown))
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
