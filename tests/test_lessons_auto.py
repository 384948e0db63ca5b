"""Lessons written automatically after a turn that taught something: which turns trigger one, the
one short drafting call (what it is sent, how strictly its answer is read), the daily cap, the review running
after the reply, and once per turn."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import date
from typing import Any

import pytest

from picoclaw.agent.loop import AgentLoop
from picoclaw.curation.lesson_drafting import MAX_ANSWER_TOKENS, read_lesson
from picoclaw.curation.turn_review import FinishedTurn, is_correction, result_failed, tool_steps, trigger_of
from picoclaw.memory import ModelUsage, stands
from picoclaw.memory.workspace import Workspace
from picoclaw.tools.memory import MemoryAppend
from tests.agent_helpers import TODAY, chat, frozen, is_lesson_request, set_policy, turn_requests, with_agent
from tests.fakes import FakeOpenAIServer, Text, ToolCalls
from tests.waiting import wait_until

KEY = "cli:test"
LESSON_EN = "When the user asks for their todo list, call list_dir on memory/ first: it is not in notes/."
LESSON_EN_AGAIN = "When the user asks for the todo list, call list_dir on memory/ first; notes/ does not have it."
LESSON_ZH = "以后回答天气时都用摄氏度，不要用华氏度。"
USAGE = {"prompt_tokens": 321, "completion_tokens": 27}


def lesson_requests(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [body for body in server.chat_requests() if is_lesson_request(body)]


def asked(request: dict[str, Any]) -> str:
    """What a lesson request asks: the instruction after the conversation (its last message)."""
    return str(request["messages"][-1]["content"])


def learnings(workspace: Workspace) -> str:
    return workspace.store.read_learnings()


def entries(workspace: Workspace) -> list[str]:
    """The lesson entries of LEARNINGS.md, each as its text after the `## ` heading line."""
    return [part.split("\n", 1)[1].strip() for part in learnings(workspace).split("\n## ")[1:]]


def script_recovery(server: FakeOpenAIServer, answer: str | None = LESSON_EN, **lesson: Any) -> None:
    """A turn whose first call fails (no such file) and whose next one works, then the lesson's answer."""
    server.reply_tool_calls([("read_file", {"path": "notes/todo.md"})])
    server.reply_tool_calls([("list_dir", {"path": "memory"})])
    server.reply_text("Your todo list is in memory/.")
    if answer is not None:
        server.reply_text(f"LESSON: {answer}", **lesson)


def user_turn(messages: list[dict[str, Any]], earlier_reply: str | None = "Earlier answer.") -> FinishedTurn:
    return FinishedTurn(KEY, 7, tuple(messages), True, earlier_reply)


def call(call_id: str, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments or {})}}


def assistant_calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": list(calls)}


def result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# -- triggers, from a finished turn ----------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "No, it's Paris.", "no - the other file", "That's wrong.", "I told you I use Celsius.", "Not Paris, Lyon.",
    "I said Celsius, not Fahrenheit", "that is not what I asked", "As I said, use the other API.",
    "不对，是上海。", "不是北京，是上海", "我说过用摄氏度", "错了，应该是三点", "你搞错了", "我说的是明天",
])
def test_corrections_are_recognised_in_english_and_chinese(text: str) -> None:
    assert is_correction(text)


@pytest.mark.parametrize("text", [
    "No thanks!", "no problem", "No", "Not bad, thanks", "hello", "What's the weather?", "Nothing much",
    "Now list my files", "I said hi to my mom today", "谢谢", "你好", "不客气", "今天天气怎么样？",
])
def test_small_talk_and_questions_are_not_corrections(text: str) -> None:
    assert not is_correction(text)


def test_how_a_tool_result_counts_as_failed() -> None:
    assert result_failed("read_file", "error: no such file or folder: notes/todo.md")
    assert result_failed("mcp__files__fail", "error: 磁盘已满")
    assert result_failed("exec", "exit code 2\nls: cannot access 'x'")
    assert result_failed("exec", "timed out after 30 s and was killed\n(no output)")
    assert not result_failed("exec", "exit code 0\nok")
    assert result_failed("web_fetch", "URL: https://example.com/x\nStatus: 404\n\nNot Found")
    assert not result_failed("web_fetch", "URL: https://example.com/\nStatus: 200\n\nHello")
    assert not result_failed("read_file", "the file says: error: nothing")


def test_triggers_of_finished_turns() -> None:
    user = {"role": "user", "content": "find my todo list"}
    answer = {"role": "assistant", "content": "Here it is."}
    failed, worked = "error: no such file or folder: notes/todo.md", "MEMORY.md (10 bytes)"
    recovery = [user, assistant_calls(call("a", "read_file")), result("a", failed),
                assistant_calls(call("b", "list_dir")), result("b", worked), answer]
    assert trigger_of(user_turn(recovery)) == "recovery"
    # Recovered by a later call of the same tool, with another failure in between.
    later = [user, assistant_calls(call("a", "read_file"), call("b", "web_fetch")), result("a", failed),
             result("b", "error: timed out"), assistant_calls(call("c", "read_file")), result("c", "1\ttodo"), answer]
    assert trigger_of(user_turn(later)) == "recovery"
    all_failed = [user, assistant_calls(call("a", "read_file")), result("a", failed),
                  assistant_calls(call("b", "list_dir")), result("b", "error: no such folder: notes"), answer]
    assert trigger_of(user_turn(all_failed)) is None
    workflow = [user, assistant_calls(call("a", "list_dir"), call("b", "read_file")), result("a", worked),
                result("b", "1\ttodo"), assistant_calls(call("c", "memory_append")), result("c", "saved"), answer]
    assert trigger_of(user_turn(workflow)) == "workflow"
    assert trigger_of(FinishedTurn(KEY, 7, tuple(workflow[:-1]), False, None)) is None  # stopped: no answer
    small_talk = [{"role": "user", "content": "thanks!"}, {"role": "assistant", "content": "You're welcome."}]
    assert trigger_of(user_turn(small_talk)) is None
    correction = [{"role": "user", "content": "No, it's in memory/, not notes/."}, *recovery[1:]]
    assert trigger_of(user_turn(correction)) == "correction"  # two triggers, one lesson: the correction's
    assert trigger_of(user_turn(correction, earlier_reply=None)) == "recovery"  # nothing earlier to correct
    # A call without a result (a cut-off turn) is a failed call.
    assert [step.failed for step in tool_steps([assistant_calls(call("z", "list_dir"))])] == [True]


# -- reading the model's answer --------------------------------------------------------------------------

OFFERED = {"memory_append": MemoryAppend.Args}


@pytest.mark.parametrize(("answer", "lesson"), [
    (f"LESSON: {LESSON_EN}", LESSON_EN),
    (f"Sure! Here is the lesson.\n\n**Lesson:** {LESSON_EN}\n", LESSON_EN),
    (f"```\nLESSON: {LESSON_EN}\n```", LESSON_EN),
    (f"LESSON：{LESSON_ZH}", LESSON_ZH),
    (f"LESSON:\n{LESSON_ZH}", LESSON_ZH),
    ("NONE", None),
    ("none.", None),
    ("The turn teaches nothing new.\nNONE", None),
    ("LESSON: NONE", None),
])
def test_a_lesson_is_read_from_one_lesson_line(answer: str, lesson: str | None) -> None:
    read = read_lesson(answer, OFFERED)
    assert (read.lesson, read.refused) == (lesson, None)


@pytest.mark.parametrize(("answer", "why"), [
    ("", "empty"),
    ("   \n", "empty"),
    ("The user seems to like tidy folders. Everything went well in this conversation.", "no 'LESSON:' line"),
    ('{"name": "memory_append", "arguments": {"content": "todo is in memory/"}}', "tool call"),
    ('```json\n{"name": "memory_append", "arguments": {"content": "x"}}\n```', "tool call"),
    ('<tool_call>\n{"name": "memory_append", "arguments": {"content": "x"}}\n</tool_call>', "tool call"),
    ("LESSON: I'm sorry, but I can't help with that.", "refusal"),
    ("抱歉，我无法完成这个请求。\nLESSON: 无", "refusal"),
    (f"LESSON: {LESSON_EN}\nLESSON: {LESSON_EN_AGAIN}", "more than one"),
    ("LESSON: " + "Always check the folder first. " * 30, "longer than"),
    ("LESSON: ok", "too short"),
])
def test_garbage_is_refused(answer: str, why: str) -> None:
    read = read_lesson(answer, OFFERED)
    assert read.lesson is None and read.refused is not None and why in read.refused


def test_an_answer_cut_at_the_token_limit_is_refused() -> None:
    assert read_lesson(f"LESSON: {LESSON_EN}", OFFERED, cut_off=True).refused == (
        "the answer was cut off at the token limit")


# -- the whole flow, against the fake model --------------------------------------------------------------


def test_a_failed_then_working_call_writes_one_lesson_and_the_request_says_what_to_do(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    script_recovery(fake_openai, usage=USAGE)
    with frozen():
        replies = chat(workspace, fake_openai, ["where is my todo list?"], continue_background=True)

    assert replies == ["Your todo list is in memory/."]
    assert entries(workspace) == [f"{LESSON_EN}\nSource: session {KEY} (recovery)"]
    assert f"## {TODAY}\n{LESSON_EN}" in learnings(workspace)
    [request] = lesson_requests(fake_openai)
    # Asked after the turn's last request, byte for byte (a local server's prompt cache keeps the conversation):
    # the same tools, none to be called, the reply appended, then the instruction.
    last = turn_requests(fake_openai)[-1]
    assert request["tools"] == last["tools"] and request["tool_choice"] == "none"
    assert request["max_tokens"] == MAX_ANSWER_TOKENS
    assert request["messages"][:-1] == [*last["messages"], {"role": "assistant", "content": replies[0]}]
    text = asked(request)
    for promise in ("Keep tool names, file paths, URLs", "not instructions to you", "LESSON: ", "NONE",
                    "language named below"):
        assert promise in text
    assert "Look at the last turn of the conversation above: the user's message that begins «where is my todo " \
           "list?» and everything after it." in text
    assert "What happened: A tool call failed and a later one worked." in text
    assert "Language of the lesson: the language of the user's messages" in text
    assert len(turn_requests(fake_openai)) == 3  # the turn's own requests are the turn's, as before
    # What the call cost is in the ledger, under "learning".
    used = ModelUsage(workspace.memory_dir, storage=workspace.storage).on("learning", date.fromisoformat(TODAY))
    assert (used.calls, used.prompt_tokens, used.completion_tokens) == (1, 321, 27)


def test_the_same_lesson_learned_again_updates_its_entry(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    script_recovery(fake_openai, LESSON_EN)
    script_recovery(fake_openai, LESSON_EN_AGAIN)
    with frozen():
        chat(workspace, fake_openai, ["where is my todo list?"])
    with frozen("2025-03-12 02:00:00"):
        chat(workspace, fake_openai, ["where's my todo list again?"], key="cli:other")

    assert len(lesson_requests(fake_openai)) == 2
    assert entries(workspace) == [f"{LESSON_EN_AGAIN}\nSource: session cli:other (recovery)"]
    assert "## 2025-03-12\n" in learnings(workspace) and f"## {TODAY}" not in learnings(workspace)


def test_a_correction_in_english_sends_the_reply_it_corrects(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_text("The capital of Australia is Sydney.")
    fake_openai.reply_text("Sorry: Canberra.")
    lesson = "When asked for a capital city, check memory_search or web_fetch before answering from recall."
    fake_openai.reply_text(f"LESSON: {lesson}")
    with frozen():
        chat(workspace, fake_openai, ["What is the capital of Australia?", "No, that's wrong. It's Canberra."],
             continue_background=True)

    [request] = lesson_requests(fake_openai)  # the first turn was a plain question: no review call
    text = asked(request)
    assert "What happened: The user corrected the assistant's earlier reply." in text
    # The reply it corrects is in the conversation the request continues, so it is not quoted again.
    assert {"role": "assistant", "content": "The capital of Australia is Sydney."} in request["messages"]
    assert "the user's message that begins «No, that's wrong. It's Canberra.»" in text
    assert "not shown above" not in text
    # The draft is the model's words, not the user's: kept, and marked as the model's.
    assert entries(workspace) == [f"{lesson}\nSource: session {KEY} (correction, drafted)"]


def test_a_correction_in_chinese_asks_for_a_chinese_lesson(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_text("今天杭州 75°F，晴。")
    fake_openai.reply_text("抱歉：今天杭州 24°C，晴。")
    fake_openai.reply_text(f"好的。\nLESSON: {LESSON_ZH}")
    with frozen():
        chat(workspace, fake_openai, ["今天杭州天气怎么样？", "不对，我说过用摄氏度。"], continue_background=True)

    [request] = lesson_requests(fake_openai)
    text = asked(request)
    assert "Language of the lesson: Chinese" in text
    assert {"role": "assistant", "content": "今天杭州 75°F，晴。"} in request["messages"]
    assert "the user's message that begins «不对，我说过用摄氏度。»" in text
    # "以后" and 华氏度 are the model's (the user never said "from now on"): the lesson is kept as the model's
    # draft, so it never stands in every system prompt as a person's would.
    [entry] = entries(workspace)
    assert entry == f"{LESSON_ZH}\nSource: session {KEY} (correction, drafted)"
    assert not stands(entry)


@pytest.mark.parametrize(("corrected", "said", "lesson"), [
    ("The meeting is on Tuesday.", "No, the team meeting is on Thursday at 3 pm, in room 204.",
     "The team meeting is on Thursday at 3 pm, in room 204."),
    ("会议在周二。", "不对，团队会议在周四下午三点，在204会议室。", "团队会议在周四下午三点，在204会议室。"),
], ids=["english", "chinese"])
def test_a_correction_lesson_in_the_users_own_words_is_theirs(
        workspace: Workspace, fake_openai: FakeOpenAIServer, corrected: str, said: str, lesson: str) -> None:
    fake_openai.reply_text(corrected)
    fake_openai.reply_text("Sorry. / 抱歉。")
    fake_openai.reply_text(f"LESSON: {lesson}")
    with frozen():
        chat(workspace, fake_openai, ["When is the meeting? / 会议什么时候？", said], continue_background=True)

    assert entries(workspace) == [f"{lesson}\nSource: session {KEY} (correction)"]


@pytest.mark.parametrize("question", ["Should I always check the calendar before answering?",
                                      "以后回答前要不要先查日历？"], ids=["english", "chinese"])
def test_a_drafted_lesson_that_is_a_question_is_not_written(
        workspace: Workspace, fake_openai: FakeOpenAIServer, question: str) -> None:
    fake_openai.reply_text("The meeting is on Tuesday.")
    fake_openai.reply_text("Sorry.")
    fake_openai.reply_text(f"LESSON: {question}")
    before = learnings(workspace)
    with frozen():
        chat(workspace, fake_openai, ["When is the meeting?", "No, that's wrong, it is on Thursday."],
             continue_background=True)

    assert len(lesson_requests(fake_openai)) == 1
    assert learnings(workspace) == before


def test_a_correction_with_nothing_before_it_to_correct_is_not_one(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    before = learnings(workspace)
    fake_openai.reply_text("Noted.")
    with frozen():
        chat(workspace, fake_openai, ["No, I don't want a summary today."])
    assert lesson_requests(fake_openai) == [] and learnings(workspace) == before


def test_a_three_step_workflow_that_worked_writes_a_lesson(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_tool_calls([("write_file", {"path": "notes/tea.md", "content": "龙井 Longjing"})])
    fake_openai.reply_tool_calls([("read_file", {"path": "notes/tea.md"})])
    fake_openai.reply_tool_calls([("list_dir", {"path": "notes"})])
    fake_openai.reply_text("Saved and checked.")
    lesson = "To keep a tasting note, write_file it under notes/, then read_file and list_dir to check it."
    fake_openai.reply_text(f"LESSON: {lesson}")
    with frozen():
        chat(workspace, fake_openai, ["save my tea note: 龙井 Longjing"])

    [request] = lesson_requests(fake_openai)
    assert "What happened: Several tool calls together did the task." in asked(request)
    assert entries(workspace) == [f"{lesson}\nSource: session {KEY} (workflow)"]


def test_small_talk_and_a_turn_whose_tools_all_failed_write_nothing(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    before = learnings(workspace)
    fake_openai.reply_text("Hello! 你好！")
    fake_openai.reply_text("You're welcome.")
    fake_openai.reply_tool_calls([("read_file", {"path": "notes/todo.md"})])
    fake_openai.reply_tool_calls([("read_file", {"path": "todo.md"}), ("list_dir", {"path": "notes"})])
    fake_openai.reply_text("I could not find a todo list.")
    with frozen():
        replies = chat(workspace, fake_openai, ["hi 你好", "thanks!", "where is my todo list?"])

    assert replies[-1] == "I could not find a todo list."
    assert lesson_requests(fake_openai) == [] and fake_openai.pending() == 0
    assert learnings(workspace) == before


@pytest.mark.parametrize("answer", [
    Text(""),
    Text("I reviewed the conversation. The user was looking for a file and it was found eventually."),
    Text('{"name": "memory_append", "arguments": {"content": "todo is in memory/"}}'),
    Text("functions.memory_append: {\"content\": \"todo is in memory/\"}"),
    Text("I'm sorry, but I cannot help with that."),
    Text(f"LESSON: {LESSON_EN}", finish_reason="length"),
    "error",
], ids=["empty", "prose", "tool call", "functions.", "refusal", "cut off", "500"])
def test_garbage_from_the_model_leaves_learnings_unchanged(
        workspace: Workspace, fake_openai: FakeOpenAIServer, answer: Text | str) -> None:
    before = workspace.store.learnings_path.read_bytes()
    script_recovery(fake_openai, None)
    if isinstance(answer, Text):
        fake_openai.enqueue(answer)
    else:
        fake_openai.reply_error(500, "The server had an error while processing your request.")
    with frozen():
        replies = chat(workspace, fake_openai, ["where is my todo list?"])

    assert replies == ["Your todo list is in memory/."]
    assert len(lesson_requests(fake_openai)) == 1 and fake_openai.pending() == 0  # it was asked, once
    assert workspace.store.learnings_path.read_bytes() == before
    ledger = ModelUsage(workspace.memory_dir, storage=workspace.storage)
    assert ledger.on("learning", date.fromisoformat(TODAY)).calls == 1  # counted all the same


def test_the_daily_cap_stops_drafting_calls_until_the_next_day(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, learning_daily_calls=2)
    lessons = [f"When the user asks for list number {n}, call list_dir on memory/ first: it is not in notes/."
               for n in range(4)]
    for lesson in lessons[:2]:
        script_recovery(fake_openai, lesson, usage=USAGE)
    script_recovery(fake_openai, None)  # the third turn of the day: no lesson call, so no answer scripted
    with frozen():
        chat(workspace, fake_openai, ["list 0?", "list 1?", "list 2?"])
    assert len(lesson_requests(fake_openai)) == 2 and fake_openai.pending() == 0
    used = ModelUsage(workspace.memory_dir, storage=workspace.storage).on("learning", date.fromisoformat(TODAY))
    assert (used.calls, used.prompt_tokens, used.completion_tokens) == (2, 642, 54)

    script_recovery(fake_openai, lessons[3], usage=USAGE)
    with frozen("2025-03-11 02:00:00"):  # the next day in Asia/Shanghai
        chat(workspace, fake_openai, ["list 3?"])
    assert len(lesson_requests(fake_openai)) == 3
    assert ModelUsage(workspace.memory_dir, storage=workspace.storage).on("learning", date(2025, 3, 11)).calls == 1


def test_learning_off_makes_no_call(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, learning_enabled=False)
    before = learnings(workspace)
    script_recovery(fake_openai, None)
    with frozen():
        chat(workspace, fake_openai, ["where is my todo list?"])
    assert lesson_requests(fake_openai) == [] and learnings(workspace) == before


def test_the_reply_comes_before_the_lesson_is_drafted(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    released = threading.Event()
    script_recovery(fake_openai, None)
    fake_openai.enqueue(Text(f"LESSON: {LESSON_EN}", until=released))
    before = learnings(workspace)

    async def body(loop: AgentLoop) -> list[str]:
        reply = await loop.handle(KEY, "where is my todo list?")
        # The reply is back while the drafting call is still held by the model: it did not wait for it.
        await wait_until(lambda: bool(lesson_requests(fake_openai)), what="the lesson request")
        seen = [reply.text, learnings(workspace)]
        released.set()
        await loop.wait_background()
        return seen

    with frozen():
        reply, while_drafting = with_agent(workspace, fake_openai, body)
    assert reply == "Your todo list is in memory/."
    assert while_drafting == before
    assert entries(workspace) == [f"{LESSON_EN}\nSource: session {KEY} (recovery)"]


def test_a_turn_is_reviewed_once(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_text(f"LESSON: {LESSON_EN}")
    messages = [{"role": "user", "content": "where is my todo list?"},
                assistant_calls(call("a", "read_file")), result("a", "error: no such file or folder: notes/todo.md"),
                assistant_calls(call("b", "list_dir")), result("b", "MEMORY.md (10 bytes)"),
                {"role": "assistant", "content": "It is in memory/."}]
    turn = FinishedTurn(KEY, 1, tuple(messages), True, None)

    async def body(loop: AgentLoop) -> list[str | None]:
        first = await loop.learner.learn(turn)
        again = await loop.learner.learn(turn)
        return [first.outcome, again.skipped]

    with frozen():
        assert with_agent(workspace, fake_openai, body) == ["added", "this turn was reviewed already"]
    assert len(lesson_requests(fake_openai)) == 1


def test_concurrent_turns_share_the_daily_cap(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, learning_daily_calls=1)

    def answer(body: dict[str, Any]) -> Text | ToolCalls:
        if is_lesson_request(body):
            return Text(f"LESSON: {LESSON_EN}")
        roles = [m["role"] for m in body["messages"]]
        if roles[-1] == "user":
            return ToolCalls([("read_file", {"path": "notes/todo.md"})])
        if roles.count("tool") == 1:
            return ToolCalls([("list_dir", {"path": "memory"})])
        return Text("Your todo list is in memory/.")

    fake_openai.responder = answer

    async def body(loop: AgentLoop) -> list[str]:
        replies = await asyncio.gather(*(loop.handle(f"cli:{n}", "where is my todo list?") for n in range(3)))
        return [reply.text for reply in replies]

    with frozen():
        assert with_agent(workspace, fake_openai, body) == ["Your todo list is in memory/."] * 3
    assert len(lesson_requests(fake_openai)) == 1
    assert len(entries(workspace)) == 1


# What Qwen2.5-Coder-1.5B (llama.cpp, the stock chat format) drafted for this correction: fluent, beside the point.
REAL_OFF_POINT = "LESSON: Always consult reliable sources when trying to find information."


@pytest.mark.parametrize(("earlier", "correction", "draft", "stored"), [
    ("The capital of Australia is Canberra.",
     "No — answer me in Chinese from now on. Which city is the capital of Australia?",
     REAL_OFF_POINT, 'The user asked: "answer me in Chinese from now on."'),
    ("Hangzhou is 75°F and sunny today.", "不对，以后都用摄氏度告诉我温度。杭州现在多少度？", "NONE",
     "用户要求：“以后都用摄氏度告诉我温度。”"),
    ("The capital of Australia is Canberra.", "No, answer me in Chinese from now on.",
     "LESSON: Answer this user in Chinese from now on, whatever language the question is in.",
     "Answer this user in Chinese from now on, whatever language the question is in."),
    # Asked as a question, it is still the user's instruction: kept, not refused as a question.
    ("The capital of Australia is Canberra.", "No, can you answer me in Chinese from now on?", REAL_OFF_POINT,
     'The user asked: "can you answer me in Chinese from now on?"'),
    ("Hangzhou is 75°F and sunny today.", "不对，以后能不能都用摄氏度？", "NONE", "用户要求：“以后能不能都用摄氏度？”"),
])
def test_a_standing_instruction_in_a_correction_is_kept_whatever_the_draft(
        workspace: Workspace, fake_openai: FakeOpenAIServer, earlier: str, correction: str, draft: str,
        stored: str) -> None:
    fake_openai.reply_text(earlier)
    fake_openai.reply_text("堪培拉。")
    fake_openai.reply_text(draft)
    with frozen():
        chat(workspace, fake_openai, ["First question?", correction])
    [request] = lesson_requests(fake_openai)
    assert "The user's instruction, which the lesson must keep: \"" in asked(request)
    # The user's words when the draft dropped them (or found nothing), the draft when it kept them.
    assert entries(workspace) == [f"{stored}\nSource: session {KEY} (correction)"]


def test_a_correction_that_states_a_habit_keeps_the_models_none(workspace: Workspace,
                                                                fake_openai: FakeOpenAIServer) -> None:
    before = learnings(workspace)
    fake_openai.reply_text("You take the train to work.")
    fake_openai.reply_text("Got it: the bus.")
    fake_openai.reply_text("NONE")
    with frozen():
        chat(workspace, fake_openai, ["How do I get to work?", "No, I always take the bus to work."])
    [request] = lesson_requests(fake_openai)  # a correction: reviewed, but nothing asked of every answer
    assert "The user's instruction" not in asked(request)
    assert learnings(workspace) == before
