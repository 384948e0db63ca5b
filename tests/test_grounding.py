"""The grounding check of automatic memory writes (memory/grounding.py) on its own: what is no fact
whoever says it, what is grounded in the user's words, what MEMORY.md already says, and the entries the model
writes in words the user never said (their `Source:` line: found again as the same fact, never marking an
entry a person gave as superseded). The entries a real 1.5B model's flush wrote are the first cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from picoclaw.memory.entries import models_entry
from picoclaw.memory.grounding import (
    ABOUT_ASSISTANT,
    ADVICE,
    QUESTION,
    REFUSAL,
    UNGROUNDED,
    Known,
    Said,
    added_text,
    check,
    grounded,
    not_a_fact,
    user_texts,
)
from picoclaw.memory.supersede import Statement
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import frozen

DATA = Path(__file__).resolve().parent / "data" / "real-model" / "flush_poisoning.json"
POISONED = json.loads(DATA.read_text(encoding="utf-8"))
USER_ENTRY: str = POISONED["entry_the_user_gave"]
JUNK: list[str] = POISONED["memory_entries_in_order"][1:]
MESSAGES = [record["message"] for record in POISONED["repl_session_records"] if record["type"] == "message"]


def test_the_recorded_entries_one_by_one() -> None:
    said = Said.of(user_texts(MESSAGES))
    known = Known.of([USER_ENTRY])
    verdicts = [check(entry, said, known) for entry in JUNK]
    assert [v.action for v in verdicts] == ["known", "known", *["rejected"] * 6]
    assert [v.reason for v in verdicts[2:]] == [UNGROUNDED, UNGROUNDED, UNGROUNDED, ADVICE, QUESTION, REFUSAL]
    # The stored fact is in the injected <context> and the tool results, never in the user's words.
    assert not Said.of(user_texts(MESSAGES)).text.count("peanuts")




@pytest.mark.parametrize(("line", "reason"), [
    ("我最喜欢的咖啡是什么？", QUESTION), ("我最喜欢的咖啡是什么", QUESTION), ("我喜欢拿铁吗", QUESTION),
    ("Do I like black coffee", QUESTION), ("What is my favourite coffee", QUESTION),
    ("The user asked about their favourite coffee.", QUESTION), ("用户问最喜欢的咖啡是什么", QUESTION),
    ("Tell me one short tip for sleeping better.", QUESTION),
    ("To sleep better, try taking a warm bath before bed.", ADVICE), ("You should drink less coffee.", ADVICE),
    ("建议睡前喝一杯热牛奶。", ADVICE), ("可以试试睡前冥想。", ADVICE),
    ("抱歉，我不能回答这个问题。", REFUSAL), ("I'm sorry, I can't answer that.", REFUSAL),
    ("I cannot provide personal information.", REFUSAL),
    ("The assistant can search memory.", ABOUT_ASSISTANT), ("我是一个AI助手。", ABOUT_ASSISTANT),
    # A question form opening a Chinese sentence, no question mark after it.
    ("能不能帮我查一下我的柜子号码", QUESTION), ("请问我的车牌号是多少", QUESTION), ("是否需要提前预约", QUESTION),
    ("可不可以把会议改到周五", QUESTION), ("麻烦你帮我记一下明天的会议", QUESTION),
])
def test_what_is_no_fact_whoever_says_it(line: str, reason: str) -> None:
    assert not_a_fact(line) == reason


@pytest.mark.parametrize("line", [
    "I can't eat gluten.", "我什么都吃，就是不吃香菜。", "我有几个朋友住在杭州。", "When I was young I lived in Rome.",
    "My doctor says I should eat less salt.", "我最好的朋友叫小林。", "I apologised to Tom for being late.",
    "My assistant Mary books my flights.", "Unfortunately, I can't have dairy.", "What can I say, I love turtles.",
    "I'm an assistant manager now.", "说不定哪天我会试试陶艺！", "音乐让我想起我们是如何走到一起的。",
    "It's important to me that people have someone to talk to.",
    "提醒我要追随自己的热情的，是我的老师。", "是我妹妹安娜推荐了这家咖啡馆。", "有一次我在柏林丢了护照。",
])
def test_facts_that_look_like_junk_are_facts(line: str) -> None:
    assert not_a_fact(line) is None




@pytest.mark.parametrize(("said", "line", "expected"), [
    (["By the way, my sister Anna lives in Lyon now."], "My sister Anna lives in Lyon.", True),
    (["By the way, my sister Anna lives in Lyon now."], "The user's sister Anna lives in Lyon.", True),
    (["My gym locker is number 217."], "My gym locker is number 317.", False),  # a number the user never said
    (["What is my favourite coffee?"], "My favourite coffee is black coffee.", False),  # asked, never stated
    (["我女儿叫小雨，在上海读大学。"], "用户的女儿叫小雨，在上海读大学。", True),
    (["我最喜欢的咖啡是什么？"], "我最喜欢的咖啡是拿铁。", False),
    (["<context>\n<memory>\n我对花生过敏。\n</memory>\n</context>\n\n我对什么过敏？"], "我对花生过敏。", False),
    (["Note: my dentist is Dr. Okafor at 21 Baker Street, 我每半年去一次."], "Dentist: Dr. Okafor, 21 Baker Street.",
     True),
    (["remember: my coffee is an oat-milk latte"], "Coffee: oat-milk latte / 咖啡：燕麦拿铁", False),  # translated
])
def test_grounded_in_the_users_statements_only(said: list[str], line: str, expected: bool) -> None:
    messages = [{"role": "user", "content": text} for text in said]
    assert grounded(line, Said.of(user_texts(messages))) is expected


@pytest.mark.parametrize(("stored", "line", "known"), [
    ("I am allergic to peanuts, my gym locker number is 317.", "**My gym locker number is 317**", True),
    ("I am allergic to peanuts, my gym locker number is 317.", "The user's gym locker is 317.", True),
    ("I am allergic to peanuts.", "I am not allergic to peanuts.", False),  # the negation is new
    ("我对花生过敏，健身房柜子是317号。", "「健身房柜子是３１７号」", True),  # full-width digits, quotes
    ("My gym locker is number 217.", "My gym locker is number 305.", False),
])
def test_what_an_entry_already_says(stored: str, line: str, known: bool) -> None:
    assert Known.of([stored]).restated(line) is known


def test_the_models_entry_is_the_same_fact_and_never_supersedes_a_persons(workspace: Workspace) -> None:
    store = workspace.store
    with frozen("2025-03-01 02:00:00"):
        store.append_long_term("My gym locker is number 217.")
    with frozen():
        written = store.append_long_term(models_entry("My gym locker is number 305.", "cli:test"))
        again = store.append_long_term("my gym locker is number 305")  # the same words, found by their fingerprint
        mine = store.append_long_term(models_entry("My dog is called Bob.", "cli:test"))
        update = store.append_long_term(models_entry("My dog is now called Max.", "cli:test"))

    text = store.read_long_term()
    assert written.new and not again.new and mine.new and update.new
    assert "My gym locker is number 217.\n\n" in text  # the person's entry is not marked
    # The model's own entry is marked by its own update, with the update's words only.
    assert "My dog is called Bob.\nSource: the assistant, not the user's words; session cli:test (memory_append)\n" \
           "> superseded by the 2025-03-10 entry: My dog is now called Max.\n" in text


# A real 1.5B model's flush of "My sister Lin lives in Hangzhou." wrote "Lin's sister is named Lin.": each of its
# words is the user's, but it names a thing after itself. A telling word (name, number, term) used more often
# than the user used it makes up a relation; the same facts paraphrased use each as often.
@pytest.mark.parametrize(("said", "line", "expected"), [
    ("I am not allergic to peanuts.", "I am allergic to peanuts.", False),
    ("I am not allergic to peanuts.", "The user is not allergic to peanuts.", True),
    ("I'm not allergic to peanuts, but my daughter Inês is.", "The user is not allergic to peanuts.", True),
    ("I don't like tea. I like coffee.", "I like coffee.", True),
    ("I don't like tea. I like coffee.", "I like tea.", False),
    ("I like tea.", "I don't like tea.", False),  # a denial the user never made
    ("No, my daughter is seven.", "The user's daughter is seven.", True),  # "No," denies nothing after it
    ("我不喜欢咖啡。", "我喜欢咖啡。", False),
    ("我不喜欢咖啡。", "用户不喜欢咖啡。", True),
    ("我没有车。", "用户有车。", False),
    ("我的咖啡要燕麦奶拿铁，不加糖，中杯。", "用户的咖啡要燕麦奶拿铁，不加糖。", True),
    ("我们的孩子是我们的未来；他们应该拥有最好的。", "我们的孩子是我们的未来；他们应该拥有最好的。", True),
    ("My coffee is an oat-milk latte, 不加糖.", "My coffee is an oat-milk latte, 加糖.", False),
    # A polarity belongs to its clause; an adverb after 不 is skipped; words that only look negative deny nothing.
    ("I don't like coffee but I like tea.", "The user likes tea.", True),
    ("我不喜欢咖啡，我喜欢茶。", "用户喜欢茶。", True),
    ("我不喜欢咖啡但是喜欢茶", "用户喜欢茶", True),
    ("我不太喜欢咖啡", "用户不喜欢咖啡", True),
    ("我不太喜欢咖啡", "用户喜欢咖啡", False),
    ("我未来想去日本工作", "用户未来想去日本工作", True),
    ("I no longer smoke.", "The user smokes.", False),
    ("I haven't got a car.", "The user has got a car.", False),
], ids=lambda value: value if isinstance(value, bool) else None)
def test_a_line_that_says_the_opposite_of_the_user_is_not_grounded(said: str, line: str, expected: bool) -> None:
    assert grounded(line, Said.of([said])) is expected


@pytest.mark.parametrize(("said", "line", "expected"), [
    ("My sister Lin lives in Hangzhou.", "Lin's sister is named Lin.", False),
    ("My sister is called Lin. She lives in Hangzhou.", "Lin's sister is called Lin.", False),
    ("My sister Lin lives in Hangzhou.", "Lin lives in Hangzhou.", True),
    ("My sister Lin lives in Hangzhou.", "Lin is my sister", True),
    ("My sister Lin lives in Hangzhou.", "My sister is Lin", True),
    ("My sister Lin lives in Hangzhou.", "The user's sister Lin lives in Hangzhou", True),
    ("My sister Lin lives in Hangzhou.", "The user has a sister named Lin.", True),
    ("My sister Lin is a teacher. Lin lives in Hangzhou.", "Lin, the user's sister, is a teacher; Lin lives in "
                                                            "Hangzhou.", True),  # the user named her twice too
    ("I have 2 cats and 2 dogs.", "The user has 2 cats and 2 dogs.", True),
    ("I have 2 cats.", "The user has 2 cats aged 2.", False),
    ("我妹妹林林住在杭州", "林林的妹妹叫林林", False),
    ("我妹妹叫林林，她住在杭州。", "林林的妹妹叫林林", False),  # every pair of it is the user's: only the count tells
    ("我妹妹林林住在杭州", "林林住在杭州", True),
    ("我妹妹林林住在杭州", "用户的妹妹林林住在杭州", True),
    ("我妹妹叫林林，她住在杭州。", "用户的妹妹叫林林", True),
    ("我妹妹叫Lin，她住在杭州。", "Lin的妹妹叫Lin", False),
    ("我妹妹叫Lin，她住在杭州。", "用户的妹妹叫Lin", True),
    ("我妹妹Lin住在杭州", "用户的妹妹Lin住在杭州", True),
    # A count in words is as telling as one in digits (a 1.5B flush wrote the first of these, for real).
    ("Please remember: my daughter Inês is allergic to peanuts.",
     "She has two daughters: Inês, who is allergic to peanuts.", False),
    ("I have two daughters; Inês is allergic to peanuts.", "The user has two daughters.", True),
    ("我的女儿叫小雨，对花生过敏。", "用户有两个女儿，小雨对花生过敏。", False),
    ("我有两个女儿。", "用户有两个女儿。", True),
], ids=lambda value: value if isinstance(value, bool) else None)
def test_a_telling_word_used_more_often_than_the_user_used_it_is_a_garble(said: str, line: str,
                                                                          expected: bool) -> None:
    assert grounded(line, Said.of([said])) is expected


def test_an_edit_adds_what_it_writes_in_a_quote_a_title_or_a_new_heading_but_not_the_frame() -> None:
    old = "## 2025-03-10\n\nMy dog is called Bob.\n"
    assert added_text(old, old + "> I am allergic to penicillin.\n") == "I am allergic to penicillin."
    assert "4821" in added_text(old, old + "### My bank PIN is 4821\n")
    assert "4821" in added_text(old, old.replace("2025-03-10", "我的银行密码是4821"))
    assert added_text(old, old + "> superseded by the 2025-03-11 entry: My dog is called Rex.\n") == ""


def test_known_works_out_each_entrys_statements_once_however_many_lines_it_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    real = Statement.of

    def counted(text: str) -> Statement:
        made.append(text)
        return real(text)

    monkeypatch.setattr(Statement, "of", staticmethod(counted))
    known = Known.of(["My dog is called Bob. He is five.", "我住在杭州。", "I work at Acme."])
    lines = ["My cat is called Mimi.", "我的猫叫咪咪。", "I like green tea.", "My bank is Chase."]
    for line in lines:
        known.contradicted(line)
    known.plus("My sister is Lin.").contradicted("My brother is Tom.")
    assert "He is five." in made and "我住在杭州。" in made and "My sister is Lin." in made
    assert len(made) == len(set(made))  # each entry's sentence (and each line) once
