"""Tool calls written as text by a small local model: every real reply of the corpus, and hostile inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from picoclaw.memory.workspace import Workspace
from picoclaw.tools.registry import TOOL_CLASSES, build_tools
from picoclaw.tools.text_tool_calls import MAX_CHARS, TextToolCall, find_text_tool_call, offered_tools

CORPUS_PATH = Path(__file__).resolve().parent / "data" / "real-model" / "text_tool_calls.json"
CORPUS: list[dict[str, Any]] = json.loads(CORPUS_PATH.read_text(encoding="utf-8"))
ALL_TOOLS: dict[str, type[BaseModel]] = {cls.name: cls.Args for cls in TOOL_CLASSES}


def offered(names: list[str]) -> dict[str, type[BaseModel]]:
    return {name: ALL_TOOLS[name] for name in names}


class Text:
    """Expectation: the reply stays text, for this reason."""

    def __init__(self, reason: str):
        self.reason = reason


class Call:
    """Expectation: the reply becomes this call."""

    def __init__(self, name: str, arguments: dict[str, Any], before: str = ""):
        self.name, self.arguments, self.before = name, arguments, before


# Written by reading each reply of text_tool_calls.json, in its order.
EXPECTED: list[tuple[str, Call | Text]] = [
    ("00-functions-search-no-args", Text("`functions.memory_search:` without arguments; query is required")),
    ("01-fenced-append-long-term", Call("memory_append", {
        "content": "my dog is called Bob and my coffee is an oat-milk latte.", "slot": "long_term"})),
    ("02-fenced-search-dog", Call("memory_search", {"query": "dog name", "limit": 10})),
    ("03-python-call-syntax", Text("Python call syntax `memory_search(query=..., limit=1)` is not a recognised form")),
    ("04-fenced-search-chinese", Call("memory_search", {"query": "女儿在哪里读书?", "limit": 10})),
    ("05-fenced-search-then-explanation", Call("memory_search", {"query": "dog name", "limit": 10})),
    ("06-tools-tag-chinese", Call("memory_search", {"query": "我女儿在哪里读书？"})),
    ("07-dot-positional-call", Text("`.memory_search(\"…\", 10)`: positional call syntax is not a recognised form")),
    ("08-fenced-append-then-fake-result", Call("memory_append", {
        "content": "I am planning a trip to Japan in April.", "slot": "today"})),
    ("09-fenced-append-kyoto-osaka", Call("memory_append", {
        "content": "I want to visit Kyoto and Osaka, 5 days total.", "slot": "today"})),
    ("10-fenced-append-budget", Call("memory_append", {
        "content": "My budget is 2000 euros, without flights.", "slot": "today"})),
    ("11-no-tools-offered-summary", Text("no tools offered (a summary request); the call is invented")),
    ("12-fenced-append-trains", Call("memory_append", {"content": "I prefer trains over buses.", "slot": "today"})),
    ("13-no-tools-offered", Text("no tools offered; the call is invented")),
    ("14-fenced-search-then-fake-answer", Call("memory_search", {"query": "Kyoto days", "limit": 10})),
    ("15-fenced-search-chinese-fake-answer", Call("memory_search", {"query": "京都有多少天", "limit": 10})),
    ("16-fenced-search-no-limit", Call("memory_search", {"query": "number of days in Kyoto"})),
    ("17-fenced-search-then-fake-json-result", Call("memory_search", {"query": "京都有多少天？"})),
    ("18-fenced-append-mixed-script", Call("memory_append", {
        "content": "I want to go see the deer in奈良.", "slot": "today"})),
    ("19-fenced-append-chinese", Call("memory_append", {"content": "我还想去奈良看鹿，可以吗？", "slot": "today"})),
    ("20-no-tools-offered-clean-call", Text("no tools offered; the call is invented")),
    ("21-fenced-append-mixed-script", Call("memory_append", {
        "content": "My trip plan is to visit Kyoto and Osaka, with a total of 5 days, and I plan to also see鹿 in奈良.",
        "slot": "today"})),
    ("22-functions-append-no-args", Text("`functions.memory_append:` without arguments; content is required")),
    ("23-fenced-search-dog", Call("memory_search", {"query": "my dog called", "limit": 10})),
    ("24-tools-tag-trailing-space", Call("memory_search", {"query": "女儿在哪里读书? ", "limit": 10})),
    ("25-lead-in-then-fenced-search", Call("memory_search", {"query": "女儿读书哪里", "limit": 10}, before=(
        "To find the school your daughter is attending, I'll search through your memory for any relevant details."))),
]


def test_the_table_covers_the_whole_corpus() -> None:
    assert len(CORPUS) == len(EXPECTED) == 26
    calls = sum(isinstance(expected, Call) for _, expected in EXPECTED)
    assert (calls, len(EXPECTED) - calls) == (19, 7)


@pytest.mark.parametrize(("index", "expected"), list(enumerate(e for _, e in EXPECTED)),
                         ids=[name for name, _ in EXPECTED])
def test_corpus_reply(index: int, expected: Call | Text) -> None:
    entry = CORPUS[index]
    found = find_text_tool_call(entry["assistant_message"]["content"], offered(entry["tools_offered"]))
    if isinstance(expected, Text):
        assert found is None, expected.reason
        return
    assert found is not None
    assert (found.name, json.loads(found.arguments), found.before) == (
        expected.name, expected.arguments, expected.before)
    # The registry will validate exactly this text again, and non-ASCII text travels unescaped.
    assert ALL_TOOLS[found.name].model_validate_json(found.arguments)
    assert found.arguments == json.dumps(expected.arguments, ensure_ascii=False)


def test_the_corpus_calls_are_recognised_when_every_tool_is_offered() -> None:
    """The three replies to requests without tools are well-formed calls: only the empty offer keeps them text."""
    for index in (11, 13, 20):
        found = find_text_tool_call(CORPUS[index]["assistant_message"]["content"], ALL_TOOLS)
        assert found is not None and found.name == "memory_append"


def test_offered_tools_from_a_registry(workspace: Workspace) -> None:
    assert offered_tools(build_tools(workspace)) == ALL_TOOLS


# --- hand-written replies -------------------------------------------------------------------------------------

def call_text(name: str, arguments: Any) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def fenced(body: str, lang: str = "json") -> str:
    return f"```{lang}\n{body}\n```"


def find(content: Any) -> TextToolCall | None:
    return find_text_tool_call(content, ALL_TOOLS)


def as_pair(found: TextToolCall | None) -> tuple[str, dict[str, Any]] | None:
    return None if found is None else (found.name, json.loads(found.arguments))


SEARCH = call_text("memory_search", {"query": "dog name"})


@pytest.mark.parametrize("content", [
    fenced(SEARCH),
    fenced(SEARCH, lang=""),
    fenced(SEARCH, lang="JSON"),
    f"```json\n{SEARCH}```",
    f"<tool_call>\n{SEARCH}\n</tool_call>",
    f"<tools>{SEARCH}</tools>",
    f"  \n{SEARCH}\n  ",
    'functions.memory_search: {"query": "dog name"}',
    'functions.memory_search {"query": "dog name"}',
    'functions.memory_search:\n{"query": "dog name"}\nThe assistant found: your dog is Rex.',
    'functions.memory_search{"query": "dog name"}',
    fenced(call_text("memory_search", json.dumps({"query": "dog name"}))),
], ids=["fenced-json", "fenced-bare", "fenced-JSON", "fence-closed-on-same-line", "tool_call-tag", "tools-tag",
        "bare-object", "functions-colon", "functions-space", "functions-next-line-then-invented", "functions-glued",
        "arguments-as-json-string"])
def test_recognised_forms(content: str) -> None:
    assert as_pair(find(content)) == ("memory_search", {"query": "dog name"})


def test_chinese_arguments_are_kept_exactly() -> None:
    found = find(fenced(call_text("memory_append", {"content": "我的狗叫 Bob"})))
    assert found is not None
    assert found.arguments == '{"content": "我的狗叫 Bob"}'


def test_escaped_chinese_arguments_come_out_unescaped() -> None:
    found = find('<tool_call>{"name": "memory_append", "arguments": {"content": "\\u6211\\u7684\\u72d7"}}</tool_call>')
    assert found is not None and found.arguments == '{"content": "我的狗"}'


def test_arguments_are_the_validated_dict_not_the_model_dump() -> None:
    """The query validator strips and `limit` has a default: neither shows in the arguments sent on."""
    found = find(fenced(call_text("memory_search", {"query": "  dog  "})))
    assert found is not None and found.arguments == '{"query": "  dog  "}'


def test_functions_without_arguments_only_when_the_tool_needs_none() -> None:
    assert as_pair(find("functions.list_dir:")) == ("list_dir", {})
    assert as_pair(find("functions.list_dir")) == ("list_dir", {})
    assert as_pair(find("functions.list_dir:\nThe workspace holds memory/ and notes.md.")) == ("list_dir", {})
    assert find("functions.memory_search:") is None  # query is required
    assert find("functions.memory_search: dog name") is None  # words, not a JSON object
    assert find("functions.memory_search(query='dog')") is None
    assert find("functions.list_dir.extra:") is None


def test_trailing_invented_text_is_dropped() -> None:
    content = fenced(SEARCH) + "\n\nThe assistant found: your dog is called Rex.\n\n```json\n[{\"score\": 1.0}]\n```"
    found = find(content)
    assert as_pair(found) == ("memory_search", {"query": "dog name"})
    assert found is not None and found.before == ""


def test_two_calls_take_the_first_and_drop_the_second() -> None:
    second = call_text("memory_append", {"content": "dog is Bob"})
    assert as_pair(find(fenced(SEARCH) + "\n\n" + fenced(second))) == ("memory_search", {"query": "dog name"})
    assert as_pair(find(f"<tool_call>{second}</tool_call>\n<tool_call>{SEARCH}</tool_call>")) == (
        "memory_append", {"content": "dog is Bob"})


def test_two_calls_after_a_lead_in_stay_text() -> None:
    """With a lead-in the call must end the reply."""
    assert find("Let me look.\n" + fenced(SEARCH) + "\n" + fenced(SEARCH)) is None


def test_a_bare_object_must_be_the_whole_reply() -> None:
    assert find(SEARCH + "\nThe assistant found: Rex.") is None
    assert find(SEARCH + SEARCH) is None
    assert find("Let me look.\n" + SEARCH) is None


def test_a_bare_object_closed_by_a_fence_is_a_call_and_the_prose_after_it_is_dropped() -> None:
    """Verbatim from llama.cpp's server with Qwen2.5-Coder-1.5B (2026-11-24, asked "Remind me in 2 minutes to
    stand up and stretch."): the call, a closing fence whose opening one is missing, then prose about it."""
    real = ('{"name": "cron", "arguments": "{\\"action\\": \\"add\\", \\"in\\": \\"2 minutes\\", '
            '\\"prompt\\": \\"站立起来伸展\\"}"}\n```\nThis response is a bit unusual, as the `cron` function '
            "typically takes time in seconds. However, I've adjusted it to be more consistent with common usage "
            "and have included the prompt for the reminder.")
    assert as_pair(find(real)) == ("cron", {"action": "add", "in": "2 minutes", "prompt": "站立起来伸展"})
    assert as_pair(find(SEARCH + "\n```")) == ("memory_search", {"query": "dog name"})
    assert find("Let me look.\n" + SEARCH + "\n```\nmore words") is None  # after a lead-in it must end the reply


def test_a_bare_object_then_an_invented_tool_response_is_a_call_and_the_rest_is_dropped() -> None:
    """Verbatim from llama-cpp-python's server with Qwen2.5-Coder-1.5B (2026-11-28, asked "What am I allergic to,
    and what is my gym locker number?"): the call, a tool result it made up, and a question built on that."""
    real = ('{"name": "memory_search", "arguments": "{\\"query\\": \\"allergy\\", \\"limit\\": 1}"}\n'
            '<tool_response>\n{"data": ["I am allergic to peanuts"]}\n</tool_response>\nWhat is my gym locker number?')
    assert as_pair(find(real)) == ("memory_search", {"query": "allergy", "limit": 1})
    chinese = SEARCH + '\n<tool_response>\n{"data": ["我对花生过敏"]}\n</tool_response>\n你的储物柜号码是多少？'
    assert as_pair(find(chinese)) == ("memory_search", {"query": "dog name"})
    assert find("Let me look.\n" + SEARCH + "\n<tool_response>{}</tool_response>") is None  # a lead-in: must end
    assert find(SEARCH + "\n<tool_call>" + SEARCH + "</tool_call>") is None  # only the invented result's tag


def test_a_short_lead_in_line_is_kept_as_before() -> None:
    found = find("I'll search your memory.\n\n" + fenced(SEARCH) + "\n")
    assert found is not None and found.before == "I'll search your memory."
    found = find("Saving it.\n<tool_call>" + call_text("memory_append", {"content": "x"}) + "</tool_call>")
    assert found is not None and (found.name, found.before) == ("memory_append", "Saving it.")


@pytest.mark.parametrize("name", ["unknown_tool", "Memory_Search", "functions.memory_search", ""])
def test_unknown_tool_names_stay_text(name: str) -> None:
    assert find(fenced(call_text(name, {"query": "dog"}))) is None


def test_a_tool_not_offered_in_this_request_stays_text() -> None:
    assert find_text_tool_call(fenced(SEARCH), offered(["memory_append"])) is None
    assert find_text_tool_call(fenced(SEARCH), {}) is None


@pytest.mark.parametrize("arguments", [
    {},  # query missing
    {"query": "   "},  # blank query (the tool's own validator)
    {"query": 42},  # wrong type
    {"query": "dog", "limit": "ten"},
    {"query": "dog", "limit": 0},
    {"query": "dog", "extra": True},  # extra key: the Args forbid it
    ["dog"],
    "dog name",  # a string that is not JSON
    "[1, 2]",  # a JSON string holding a list
    '{"query": "dog"} trailing',
    None,
    {"query": "dog", "limit": float("nan")},
], ids=["missing-required", "blank", "wrong-type", "limit-not-int", "limit-out-of-range", "extra-key", "list",
        "plain-string", "string-holding-list", "string-with-trailing", "null", "nan"])
def test_arguments_that_fail_stay_text(arguments: Any) -> None:
    assert find(fenced(json.dumps({"name": "memory_search", "arguments": arguments}))) is None
    assert find(f"<tool_call>{json.dumps({'name': 'memory_search', 'arguments': arguments})}</tool_call>") is None


@pytest.mark.parametrize("content", [
    'Here is the config: ```json {"name": "server", "port": 8080}```',
    '```json\n{"name": "server", "port": 8080}\n```',
    '```json\n{"name": "memory_search", "port": 8080}\n```',
    '{"name": "memory_search", "arguments": {"query": "dog"}, "id": "call_1"}',  # keys other than name/arguments
    '```json\n{"name": "memory_search", "parameters": {"query": "dog"}}\n```',  # not a synonym
    '```python\nmemory_search(query="dog")\n```',
    '```json\n{"name": "memory_search", "arguments": {"query": "dog"}}\n// and a comment\n```',
    '```json\n[{"name": "memory_search", "arguments": {"query": "dog"}}]\n```',
    '<tool_call>{"name": "memory_search", "arguments": {"query": "dog"}}</tools>',
    '<tool_call>{"name": "memory_search", "arguments": {"query": "dog"}}',
    "To search your memory I would call memory_search with the query 'dog name'.",
    "The tool call looks like this:\n\n" + fenced(SEARCH) + "\n\nIt returns the best passages with a score.",
    "Your dog is called Bob. I remember because you told me on Monday.",
], ids=["config-in-answer", "config-fenced-alone", "name-without-arguments", "extra-keys", "parameters",
        "python-fence", "junk-inside-fence", "list-of-calls", "mismatched-tags", "unclosed-tag",
        "prose-about-a-call", "explanation-with-example", "plain-answer"])
def test_normal_answers_stay_text(content: str) -> None:
    assert find(content) is None


def test_a_call_after_long_prose_stays_text() -> None:
    prose = ("You asked about your dog.\nI keep notes about pets in long-term memory.\n"
             "Let me check them before I answer.\n\n")
    assert find(prose + fenced(SEARCH)) is None
    assert find("x" * 201 + "\n" + fenced(SEARCH)) is None  # one lead-in line, but too long
    assert find("Calling `memory_search`:\n" + fenced(SEARCH)) is None  # backticks: not a plain lead-in


@pytest.mark.parametrize("content", [None, "", "   \n\t", 42, b"functions.list_dir:", ["functions.list_dir:"],
                                     {"content": "x"}], ids=["none", "empty", "whitespace", "int", "bytes", "list",
                                                             "dict"])
def test_empty_and_non_string_content(content: Any) -> None:
    assert find(content) is None


@pytest.mark.parametrize("content", [
    "```json\n{",
    '```json\n{"name": "memory_search", "arguments": {"query": "dog"}\n```',
    '```json\n{"name": "memory_search", "arguments": {"query": "dog",}}\n```',
    "<tool_call>{{{{</tool_call>",
    "functions.memory_search: {",
    'functions.memory_search: {"query": "\\ud800"}',  # a lone surrogate: not valid text to send on
    "```json\n" + '{"a":' * 50_000,
    "```json\n" + "[" * 15_000 + "]" * 15_000 + "\n```",
    '{"name": "memory_search", "arguments": ' + "[" * 5_000,
    '{"name": "memory_search", "arguments": "' + "{" * 5_000 + '"}',
], ids=["unterminated", "missing-brace", "trailing-comma", "braces", "functions-unterminated", "lone-surrogate",
        "deep-objects", "deep-lists", "deep-arguments", "arguments-string-of-braces"])
def test_broken_and_hostile_json_stays_text(content: str) -> None:
    assert find(content) is None


def test_a_megabyte_of_text() -> None:
    assert find("lorem ipsum " * 90_000) is None
    assert find("{" * 1_000_000) is None
    assert find(" " * 1_000_000 + fenced(SEARCH)) is None  # the call starts beyond what is looked at


def test_a_call_followed_by_a_megabyte_is_still_found() -> None:
    """Invented text after the call is dropped, however long; only the call must lie in the first characters."""
    assert as_pair(find(fenced(SEARCH) + "\n" + "invented " * 120_000)) == ("memory_search", {"query": "dog name"})


def test_forms_that_must_end_the_reply_need_the_whole_reply_in_view() -> None:
    padding = " " * (MAX_CHARS - len(SEARCH) - 1)
    assert find(SEARCH + padding) is not None
    assert find(SEARCH + padding + "    x") is None
    lead_in = "Let me look.\n" + fenced(SEARCH)
    assert find(lead_in + " " * 50) is not None
    assert find(lead_in + " " * MAX_CHARS + "x") is None


# --- a call wrapped in <response> … </response> ----------------------------------------------------------------


@pytest.mark.parametrize("content", [
    f"<response>{SEARCH}</response>",
    f"<response>\n{fenced(SEARCH)}\n</response>\n",
    f"  <response>\n<tool_call>{SEARCH}</tool_call>\n</response>",
    f"<response><tools>\n{SEARCH}\n</tools></response>",
    '<response>functions.memory_search: {"query": "dog name"}</response>',
    f"Let me look.\n<response>{SEARCH}</response>",
    f"<response>{SEARCH}</response>\nThe assistant found: your dog is Rex.",
], ids=["object", "fenced", "tool_call-inside", "tools-inside", "functions", "lead-in", "invented-after"])
def test_a_call_wrapped_in_response_tags(content: str) -> None:
    found = find(content)
    assert as_pair(found) == ("memory_search", {"query": "dog name"})
    assert found is not None and found.before == ("Let me look." if content.startswith("Let") else "")


def test_a_chinese_call_wrapped_in_response_tags() -> None:
    call = call_text("memory_append", {"content": "我的狗叫旺财", "slot": "long_term"})
    content = f"<response>\n{call}\n</response>"
    found = find(content)
    assert found is not None and found.arguments == '{"content": "我的狗叫旺财", "slot": "long_term"}'


@pytest.mark.parametrize("content", [
    "<response>Your dog is called Bob.</response>",
    "<response>你的狗叫旺财。</response>",
    f"<response>{SEARCH} and some words</response>",
    f"<response>{SEARCH}",
    f"<response>{SEARCH}</tools>",
    f"<response><response>{SEARCH}</response></response>",
    f"<response>{call_text('delete_everything', {'path': 'memory'})}</response>",
    f"Here it is:\n<response>{SEARCH}</response>\nand more prose",
], ids=["answer", "chinese-answer", "words-after-the-call", "unclosed", "wrong-closer", "nested", "unknown-tool",
        "lead-in-and-prose-after"])
def test_response_tags_around_anything_else_stay_text(content: str) -> None:
    assert find(content) is None


# --- a call inside doubled braces (tests/data/real-model/doubled_brace_calls.json) ----------------------------

DOUBLED_PATH = CORPUS_PATH.parent / "doubled_brace_calls.json"


def test_the_captured_doubled_brace_call_is_a_call() -> None:
    [entry] = json.loads(DOUBLED_PATH.read_text(encoding="utf-8"))
    found = find(entry["assistant_message"]["content"])
    assert as_pair(found) == ("memory_append", {"content": "我的狗叫旺财", "slot": "long_term"})


@pytest.mark.parametrize(("content", "expected"), [
    ("{{" + SEARCH[1:] + "}", ("memory_search", {"query": "dog name"})),
    ("  { " + call_text("memory_append", {"content": "我的狗叫旺财"}) + " }\n", (
        "memory_append", {"content": "我的狗叫旺财"})),
    ("{{" + SEARCH[1:] + "} and then some words", None),
    ("Let me store it.\n{{" + SEARCH[1:] + "}", None),
    ("{{" + SEARCH[1:], None),
    ("{{" + SEARCH[1:] + "}}", None),
    ('{{"name": "memory_search"}}', None),
    ("{{user_name}} likes tea", None),
], ids=["search", "spaces-around", "prose-after", "lead-in", "unclosed", "two-closers", "no-arguments", "template"])
def test_doubled_braces(content: str, expected: tuple[str, dict[str, Any]] | None) -> None:
    assert as_pair(find(content)) == expected
