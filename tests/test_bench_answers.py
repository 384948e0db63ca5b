"""bench/answers.py and bench/answer_scoring.py: LoCoMo answers through picoclaw's own turn, scored, against
the fake OpenAI server.

The script's `main` runs in-process on a tiny LoCoMo-shaped file written here (English and Chinese); the fake
model answers from what its request carries, so each column's score follows from what picoclaw sent it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from bench.answer_scoring import parse_verdict, token_f1
from bench.answers import main
from tests.fakes import FakeOpenAIServer
from tests.fakes.openai_server import Text
from tests.waiting import wait_until_sync

REPO = Path(__file__).resolve().parents[1]

SESSION_TIMES = {"en": ("1:56 pm on 8 May, 2023", "10:00 am on 20 June, 2023"),
                 "zh": ("2023年5月8日下午1:56", "2023年6月20日上午10:00")}
TURNS = {
    "en": ([("Alice", "Morning Bob! How was the weekend?"), ("Bob", "Quiet, I mostly read."),
            ("Alice", "I adopted a corgi puppy and named him Biscuit."), ("Bob", "Lovely, send photos!")],
           [("Bob", "I finally finished the marathon in Lyon."), ("Alice", "Congratulations, that is huge.")]),
    "zh": ([("Alice", "早上好，鲍勃！周末过得怎么样？"), ("Bob", "很安静，我主要在看书。"),
            ("Alice", "我领养了一只柯基，给它取名叫饼干。"), ("Bob", "太可爱了，发照片给我！")],
           [("Bob", "我终于在里昂跑完了马拉松。"), ("Alice", "恭喜你，太厉害了。")]),
}
QA = {
    "en": [("What is the name of Alice's corgi?", "Biscuit", ["D1:3"], 4),
           ("Where did Bob run the marathon?", "Lyon", ["D2:1"], 1),
           ("What is Bob's favourite colour?", "Not mentioned", ["D1:2"], 5),  # adversarial: left out
           ("Which book did Bob read?", "unknown", [], 4)],  # no evidence: left out
    "zh": [("爱丽丝的柯基叫什么名字？", "饼干", ["D1:3"], 4),
           ("鲍勃在哪里跑了马拉松？", "里昂", ["D2:1"], 1),
           ("鲍勃最喜欢什么颜色？", "没有提到", ["D1:2"], 5),
           ("鲍勃读了哪本书？", "未知", [], 4)],
}
# question (its start) → (the evidence line's words, the model's answer when it sees them)
KNOWN = {"en": {"What is the name": ("named him Biscuit", "Biscuit."), "Where did Bob": ("marathon in Lyon", "Lyon")},
         "zh": {"爱丽丝的柯基": ("取名叫饼干", "饼干。"), "鲍勃在哪里": ("在里昂跑完", "里昂")}}
EVIDENCE = {"en": "named him Biscuit", "zh": "取名叫饼干"}
FILES = {"en": "locomo10.json", "zh": "locomo10_CN.json"}


def write_locomo(folder: Path) -> Path:
    """Both languages' files with one conversation, conv-26, and a second one, conv-30 (a copy)."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang, name in FILES.items():
        conversation: dict[str, Any] = {"speaker_a": "Alice", "speaker_b": "Bob"}
        for n, (when, turns) in enumerate(zip(SESSION_TIMES[lang], TURNS[lang]), 1):
            conversation[f"session_{n}_date_time"] = when
            conversation[f"session_{n}"] = [{"speaker": who, "dia_id": f"D{n}:{t}", "text": text}
                                            for t, (who, text) in enumerate(turns, 1)]
        qa = [{"question": q, "answer": a, "evidence": e, "category": c} for q, a, e, c in QA[lang]]
        samples = [{"sample_id": sid, "conversation": conversation, "qa": qa} for sid in ("conv-26", "conv-30")]
        (folder / name).write_text(json.dumps(samples, ensure_ascii=False), encoding="utf-8")
    return folder


def model(lang: str, judge: str | None = "yes") -> Any:
    """A fake model that answers from its request: the right answer when the request carries the question's
    evidence, "I don't know" otherwise; a grading request gets `judge` (None: "Yes." when the graded answer
    is one the model gives from evidence, else "No.")."""
    def respond(body: dict[str, Any]) -> str:
        text = str(body["messages"][-1]["content"])
        if "Answer to grade:" in text:
            graded = text.split("Answer to grade:")[1].split("\n")[0].strip()
            return judge if judge is not None else "Yes." if any(
                graded == answer for _, answer in KNOWN[lang].values()) else "No."
        question = text.split("\n")[-1]
        for start, (evidence, answer) in KNOWN[lang].items():
            if question.startswith(start) and evidence in text:
                return answer
        return "I don't know" if lang == "en" else "我不知道"
    return respond


def run(fake: FakeOpenAIServer, data: Path, lang: str, *extra: str, capsys: pytest.CaptureFixture[str]
        ) -> tuple[int, dict[str, Any]]:
    code = main(["--base-url", fake.base_url, "--api-key", "sk-test", "--model", "fake", "--data", str(data),
                 "--lang", lang, "--conversations", "conv-26", "--quiet", "--json", *extra])
    out = capsys.readouterr().out
    return code, json.loads(out) if code == 0 else {}


def answers_of(result: dict[str, Any], column: str) -> dict[int, dict[str, Any]]:
    return {a["number"]: a for a in result["answers"] if a["column"] == column}


def user_texts(fake: FakeOpenAIServer) -> list[str]:
    return [str(body["messages"][-1]["content"]) for body in fake.chat_requests()]


# -- scoring ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("answer", "gold", "f1"), [
    ("The Biscuit!", "biscuit", 1.0),  # case, punctuation and articles do not count
    ("May 7, 2023", "7 May 2023", 1.0),  # order does not count
    ("running dogs", "run dog", 1.0),  # stems
    ("a red car", "red bicycle", 0.5),
    ("", "Lyon", 0.0),
    ("Sweden and Norway", "Sweden", 2 / 3),  # "and" is dropped: P 1/2, R 1
])
def test_token_f1_english(answer: str, gold: str, f1: float) -> None:
    assert token_f1(answer, gold) == pytest.approx(f1)


@pytest.mark.parametrize(("answer", "gold", "f1"), [
    ("瑞典。", "瑞典", 1.0),  # CJK punctuation does not count
    ("2023年5月7日", "2023年5月7日", 1.0),
    ("收养机构", "收养中心", 0.5),  # one token a character: 收 养 shared of four each
    ("LGBTQ支持小组", "lgbtq 小组", 2 * (3 / 5) * 1 / (3 / 5 + 1)),  # Latin words stay words
    ("我不知道", "饼干", 0.0),
])
def test_token_f1_chinese_counts_characters(answer: str, gold: str, f1: float) -> None:
    assert token_f1(answer, gold) == pytest.approx(f1)


@pytest.mark.parametrize(("reply", "verdict"), [
    ("yes", True), ("Yes.", True), ("**No**", False), ("no, the dates differ", False), ("Correct", True),
    ("是", True), ("正确。", True), ("不正确", False), ("否", False), ("不是", False),
    ("<think>hmm, yes or no</think>No", False), ("I think the answer is yes", True),
    ("<html><body>502</body></html>", None), ("", None), (None, None), ("yes no yes", True),
    ("The answer could be yes or no", None), ("答案可能吧", None),
])
def test_judge_replies_parse_robustly(reply: str | None, verdict: bool | None) -> None:
    assert parse_verdict(reply) is verdict


# -- the three columns -----------------------------------------------------------------------------

@pytest.mark.parametrize("lang", ["en", "zh"])
def test_memory_column_carries_the_evidence_and_no_memory_does_not(
        fake_openai: FakeOpenAIServer, tmp_path: Path, lang: str, capsys: pytest.CaptureFixture[str]) -> None:
    fake_openai.responder = model(lang)
    code, result = run(fake_openai, write_locomo(tmp_path / "data"), lang, capsys=capsys)
    assert code == 0
    # Two usable questions (category 5 and the one without evidence left out), three columns each.
    assert len(result["answers"]) == 6
    texts = user_texts(fake_openai)
    assert len(texts) == 6
    # The full context first, question after question; then each question as a memory and a no-memory turn.
    full, memory, none = texts[0:2], texts[2::2], texts[3::2]
    assert EVIDENCE[lang] in memory[0] and "<memory>" in memory[0]
    assert all(EVIDENCE[lang] not in t and "<memory>" not in t for t in none)
    assert all(EVIDENCE[lang] in t and "<notes>" in t for t in full)
    # Each turn's system prompt is the full-context request's too, with the answer instruction in it.
    systems = {body["messages"][0]["content"] for body in fake_openai.chat_requests()}
    assert len(systems) == 1 and "Answer in a few words" in systems.pop()
    scores = {c: {n: a["f1"] for n, a in answers_of(result, c).items()} for c in ("none", "memory", "full")}
    assert scores["memory"][1] == 1.0 and scores["full"][1] == 1.0
    assert scores["none"] == {1: 0.0, 2: 0.0}
    assert all(a["status"] == "answered" and a["verdict"] is None for a in result["answers"])  # no --judge


def test_full_context_requests_share_the_conversation_and_end_with_the_question(
        fake_openai: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_openai.responder = model("en")
    code, _ = run(fake_openai, write_locomo(tmp_path / "data"), "en", capsys=capsys)
    assert code == 0
    first, second = user_texts(fake_openai)[0:2]
    assert first.endswith("What is the name of Alice's corgi?")
    assert second.endswith("Where did Bob run the marathon?")
    shared = first.removesuffix("What is the name of Alice's corgi?")
    assert second.startswith(shared) and "## 2023-05-08 13:56" in shared and "## 2023-06-20 10:00" in shared
    assert "Bob: I finally finished the marathon in Lyon." in shared
    assert fake_openai.chat_requests()[0].get("tools") is None  # one request, no tools
    assert fake_openai.chat_requests()[2].get("tools")  # the memory column is a real turn: tools offered


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_category_table_and_judge(fake_openai: FakeOpenAIServer, tmp_path: Path, lang: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    fake_openai.responder = model(lang, judge=None)
    data = write_locomo(tmp_path / "data")
    code = main(["--base-url", fake_openai.base_url, "--api-key", "sk-test", "--model", "fake", "--data", str(data),
                 "--lang", lang, "--conversations", "conv-26", "conv-30", "--quiet", "--judge"])
    assert code == 0
    out = capsys.readouterr().out
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line.strip("|").split("|")
            for line in out.splitlines() if line.startswith("| ") and "category" not in line}
    # Categories 1 and 4 are present (5 is left out), then "all"; three columns each.
    assert sorted(rows) == sorted((c, col) for c in ("1 multi-hop", "4 single-hop", "all")
                                  for col in ("no memory", "picoclaw memory", "full context"))
    asked, answered, _, _, f1, judged, no_verdict = (cell.strip() for cell in rows[("all", "picoclaw memory")][2:9])
    assert (asked, answered, f1, judged, no_verdict) == ("4", "4", "1.000", "1.000", "0")
    none = [cell.strip() for cell in rows[("4 single-hop", "no memory")][2:9]]
    assert none == ["2", "2", "0", "0", "0.000", "0.000", "0"]


def test_judge_garbage_is_no_verdict(fake_openai: FakeOpenAIServer, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    fake_openai.responder = model("en", judge="<html><body>502 Bad Gateway</body></html>")
    code, result = run(fake_openai, write_locomo(tmp_path / "data"), "en", "--judge", capsys=capsys)
    assert code == 0
    assert all(a["verdict"] is None and a["judge_reply"].startswith("<html>") for a in result["answers"])
    overall = [row for row in result["summary"] if row["category"] == "all"]
    assert [(row["judge_yes"], row["no_verdict"]) for row in overall] == [(0.0, 2)] * 3


def test_a_conversation_that_does_not_fit_is_counted_never_truncated(
        fake_openai: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_openai.responder = model("en")
    # A reply of up to 3,900 tokens leaves the whole conversation no room in a 4,096 window; picoclaw's own turns
    # fit their prompt first and lower max_tokens to what it leaves (agent/budget.py).
    code, result = run(fake_openai, write_locomo(tmp_path / "data"), "en", "--context-tokens", "4096",
                       "--max-tokens", "3900", capsys=capsys)
    assert code == 0
    assert [a["status"] for a in answers_of(result, "full").values()] == ["did not fit"] * 2
    assert all(a["status"] == "answered" for a in result["answers"] if a["column"] != "full")
    assert not any("<notes>" in t for t in user_texts(fake_openai))  # nothing cut short was sent
    full = next(row for row in result["summary"] if row["category"] == "all" and row["column"] == "full context")
    assert (full["did_not_fit"], full["answered"], full["f1"]) == (2, 0, None)


def test_the_endpoint_saying_too_long_is_did_not_fit(fake_openai: FakeOpenAIServer, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fake_openai.responder = model("en")
    fake_openai.reply_error(400, "This model's maximum context length is 4096 tokens.", "context_length_exceeded")
    code, result = run(fake_openai, write_locomo(tmp_path / "data"), "en", "--questions", "1", capsys=capsys)
    assert code == 0
    assert [(a["column"], a["status"]) for a in result["answers"]] == [
        ("full", "did not fit"), ("memory", "answered"), ("none", "answered")]


def test_columns_can_be_chosen(fake_openai: FakeOpenAIServer, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    fake_openai.responder = model("en")
    code, result = run(fake_openai, write_locomo(tmp_path / "data"), "en", "--columns", "none", "memory",
                       capsys=capsys)
    assert code == 0
    assert [(a["number"], a["column"]) for a in result["answers"]] == [(1, "memory"), (1, "none"), (2, "memory"),
                                                                       (2, "none")]
    assert not any("<notes>" in t for t in user_texts(fake_openai))
    assert {row["column"] for row in result["summary"]} == {"no memory", "picoclaw memory"}


def test_questions_first_n_or_a_seeded_sample(fake_openai: FakeOpenAIServer, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    fake_openai.responder = model("en")
    data = write_locomo(tmp_path / "data")
    _, first = run(fake_openai, data, "en", "--questions", "1", capsys=capsys)
    assert {a["question"] for a in first["answers"]} == {"What is the name of Alice's corgi?"}
    picks = [run(fake_openai, data, "en", "--questions", "1", "--sample-seed", "7", capsys=capsys)[1]
             for _ in range(2)]
    assert [len(p["answers"]) for p in picks] == [3, 3]
    assert picks[0]["answers"][0]["question"] == picks[1]["answers"][0]["question"]  # seeded: the same pick


@pytest.mark.slow
def test_ctrl_c_prints_the_table_of_what_was_answered(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    fake_openai.responder = model("en")
    release = threading.Event()
    fake_openai.enqueue(Text("Biscuit."))
    fake_openai.enqueue(Text("Lyon", until=release))  # the second answer is under way when Ctrl-C comes
    command = [sys.executable, str(REPO / "bench/answers.py"), "--base-url", fake_openai.base_url, "--api-key",
               "sk-test", "--model", "fake", "--data", str(write_locomo(tmp_path / "data")), "--conversations",
               "conv-26", "--quiet"]
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True) as process:
        try:
            wait_until_sync(lambda: len(fake_openai.chat_requests()) == 2, what="the second full-context request")
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=120)  # bounds a hang only
        finally:
            release.set()
    assert process.returncode == 0
    assert err.strip() == "answers: stopped early: 1 of 6 answers made"
    assert "stopped early: 1 of 6 answers made; total" in out
    row = next(line for line in out.splitlines() if line.startswith("| all ") and "full context" in line)
    assert [cell.strip() for cell in row.strip("|").split("|")][2:7] == ["1", "1", "0", "0", "1.000"]


# -- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "said"), [
    (["--data", "{missing}"], "no LoCoMo file at"),
    (["--conversations", "conv-99"], "unknown conversation conv-99 (known: conv-26, conv-30)"),
    (["--api-key", ""], "no API key"),
    (["--questions", "0"], "--questions must be at least 1"),
    (["--max-tokens", "0"], "max_tokens"),
])
def test_bad_input_is_one_clear_line_and_exit_2(fake_openai: FakeOpenAIServer, tmp_path: Path, argv: list[str],
                                                said: str, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    data = write_locomo(tmp_path / "data")
    argv = [a.replace("{missing}", str(tmp_path / "nowhere")) for a in argv]
    code = main(["--base-url", fake_openai.base_url, "--api-key", "sk-test", "--model", "fake", "--data", str(data),
                 "--conversations", "conv-26", *argv])
    captured = capsys.readouterr()
    assert code == 2
    assert said in captured.err and captured.err.count("\n") == 1 and captured.out == ""
    assert fake_openai.chat_requests() == []


def test_progress_keeps_a_record_of_every_answer_and_verdict(fake_openai: FakeOpenAIServer, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    fake_openai.responder = model("en", judge=None)
    code = main(["--base-url", fake_openai.base_url, "--api-key", "sk-test", "--model", "fake", "--data",
                 str(write_locomo(tmp_path / "data")), "--conversations", "conv-26", "--judge"])
    assert code == 0
    err = capsys.readouterr().err.splitlines()
    answered = [line for line in err if " s) " in line]
    verdicts = [line for line in err if ": judge " in line]
    assert len(answered) == 6 and len(verdicts) == 6
    assert any(line.startswith("  conv-26 q1 (category 4) picoclaw memory: F1 1.00 (") for line in answered)
    assert "  conv-26 q1 (category 4) no memory: judge no 'No.'" in verdicts
