"""Session keys (picoclaw/session_key.py): the one place that writes and reads `telegram:<chat>[:<user>]` and
`cli:<name>`: round trips, the refusals with their messages, Chinese terminal names, the byte limit."""

from __future__ import annotations

import pytest

from picoclaw.session_key import (
    CLI,
    MAX_SESSION_KEY_BYTES,
    TELEGRAM,
    SessionKey,
    channel_of,
    is_stored_form,
    terminal_key,
)

NOT_A_KEY = ("is not a session key (expected telegram:<chat_id>, telegram:<chat_id>:<user_id>, "
             "telegram:<chat_id>:t<topic_id>[:<user_id>], cli:<name> or web:<name>; a name has letters, digits, _ . -)")
NOT_AN_ID = "is not a Telegram id (a whole number without leading zeros that fits in 64 bits)"


@pytest.mark.parametrize(("text", "key"), [
    ("telegram:42", SessionKey.telegram(42)),
    ("telegram:-1001234567890", SessionKey.telegram(-1001234567890)),
    ("telegram:-100500:1001", SessionKey.telegram(-100500, 1001)),
    ("telegram:-9223372036854775808:9223372036854775807", SessionKey.telegram(-(2**63), 2**63 - 1)),
    ("telegram:-1001234567890:t7", SessionKey.telegram(-1001234567890, topic_id=7)),  # a forum topic
    ("telegram:-1001234567890:t7:1001", SessionKey.telegram(-1001234567890, 1001, topic_id=7)),  # a member's, in it
    ("cli:default", SessionKey.cli("default")),
    ("cli:work.notes_2-b", SessionKey.cli("work.notes_2-b")),
    ("cli:工作", SessionKey.cli("工作")),
    ("cli:仕事", SessionKey.cli("仕事")),
    ("cli:업무", SessionKey.cli("업무")),
])
def test_a_key_reads_and_writes_back_the_same_text(text: str, key: SessionKey) -> None:
    assert SessionKey.parse(text) == key
    assert str(key) == text
    assert SessionKey.parse(str(key)) == key


def test_the_parts_of_a_key() -> None:
    member = SessionKey.parse("telegram:-100500:1001")
    assert (member.channel, member.chat_id, member.user_id, member.name) == (TELEGRAM, -100500, 1001, None)
    chat = SessionKey.parse("telegram:42")
    assert (chat.channel, chat.chat_id, chat.user_id) == (TELEGRAM, 42, None)
    terminal = SessionKey.parse("cli:工作")
    assert (terminal.channel, terminal.chat_id, terminal.user_id, terminal.name) == (CLI, None, None, "工作")
    assert terminal.topic_id is None and chat.topic_id is None and member.topic_id is None  # older keys: no topic
    topic = SessionKey.parse("telegram:-100500:t9")
    assert (topic.chat_id, topic.topic_id, topic.user_id) == (-100500, 9, None)
    in_topic = SessionKey.parse("telegram:-100500:t9:1001")
    assert (in_topic.chat_id, in_topic.topic_id, in_topic.user_id) == (-100500, 9, 1001)


@pytest.mark.parametrize(("text", "message"), [
    ("whatsapp:1", f"'whatsapp:1' {NOT_A_KEY}"),
    ("telegram:", f"'telegram:' {NOT_A_KEY}"),
    ("telegram:abc", f"'telegram:abc' {NOT_A_KEY}"),
    ("telegram:1:-2", f"'telegram:1:-2' {NOT_A_KEY}"),  # a user id is never negative
    ("telegram:1:2:3", f"'telegram:1:2:3' {NOT_A_KEY}"),
    ("telegram:1:t", f"'telegram:1:t' {NOT_A_KEY}"),
    ("telegram:1:t-7", f"'telegram:1:t-7' {NOT_A_KEY}"),
    ("telegram:1:2:t7", f"'telegram:1:2:t7' {NOT_A_KEY}"),  # the topic comes before the member
    ("telegram:1:t7:t9", f"'telegram:1:t7:t9' {NOT_A_KEY}"),
    ("telegram:1:T7", f"'telegram:1:T7' {NOT_A_KEY}"),
    ("telegram:-100:t07", f"'07' in 'telegram:-100:t07' {NOT_AN_ID}"),  # another session than t7's
    ("cli:", f"'cli:' {NOT_A_KEY}"),
    ("cli:two words", f"'cli:two words' {NOT_A_KEY}"),
    ("cli:工作 计划", f"'cli:工作 计划' {NOT_A_KEY}"),
    ("cli:a:b", f"'cli:a:b' {NOT_A_KEY}"),
    ("cli:default\n", f"'cli:default\\n' {NOT_A_KEY}"),
    ("default", f"'default' {NOT_A_KEY}"),
    ("telegram:042", f"'042' in 'telegram:042' {NOT_AN_ID}"),  # another session than telegram:42's
    ("telegram:-0", f"'-0' in 'telegram:-0' {NOT_AN_ID}"),
    ("telegram:1:9223372036854775808", f"'9223372036854775808' in 'telegram:1:9223372036854775808' {NOT_AN_ID}"),
    ("telegram:-9223372036854775809", f"'-9223372036854775809' in 'telegram:-9223372036854775809' {NOT_AN_ID}"),
])
def test_a_key_no_channel_delivers_to_is_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        SessionKey.parse(text)
    assert str(caught.value) == message


def test_an_id_of_thousands_of_digits_is_refused_before_int_reads_it() -> None:
    text = "telegram:" + "1" * 5000  # int() itself refuses 4,300 digits and more with an error of its own
    with pytest.raises(ValueError, match="is not a Telegram id"):
        SessionKey.parse(text)


def test_the_byte_limit_counts_utf8_bytes_so_a_chinese_name_reaches_it_sooner() -> None:
    longest_english = "cli:" + "a" * (MAX_SESSION_KEY_BYTES - 4)
    assert str(SessionKey.parse(longest_english)) == longest_english
    longest_chinese = "cli:" + "工" * ((MAX_SESSION_KEY_BYTES - 4) // 3)  # 20 characters, 60 bytes
    assert SessionKey.parse(longest_chinese).name == "工" * 20
    too_long = longest_chinese + "作"  # 21 characters: 67 bytes
    with pytest.raises(ValueError) as caught:
        SessionKey.parse(too_long)
    assert str(caught.value) == (f"the session key {too_long!r} is too long: 67 bytes in UTF-8, at most 64 (a "
                                 "Chinese character takes 3), since it names the chat's file")
    with pytest.raises(ValueError, match="is too long: 65 bytes"):
        SessionKey.cli("a" * (MAX_SESSION_KEY_BYTES - 3))


def test_a_huge_key_is_quoted_short_in_its_error() -> None:
    with pytest.raises(ValueError) as caught:
        SessionKey.parse("cli:" + "长" * 100_000)
    assert len(str(caught.value)) < 300 and "…" in str(caught.value)


def test_the_constructors_refuse_what_would_not_read_back() -> None:
    with pytest.raises(ValueError, match="is not a session key"):
        SessionKey.cli("two words")
    with pytest.raises(ValueError, match="is not a session key"):
        SessionKey.telegram(5, -3)
    with pytest.raises(ValueError, match="is not a Telegram id"):
        SessionKey.telegram(2**63)
    with pytest.raises(ValueError, match="is not a session key"):
        SessionKey(TELEGRAM, chat_id=1, name="x")  # a Telegram key has no name
    with pytest.raises(ValueError, match="is not a session key"):
        SessionKey(CLI, name="x", user_id=7)  # nor a terminal key a user
    with pytest.raises(ValueError, match="is not a session key"):
        SessionKey("whatsapp", name="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not a session key"):
        SessionKey.web("two words")
    with pytest.raises(ValueError, match="is not a session key"):
        SessionKey(CLI, name="x", topic_id=7)  # only a Telegram key has a topic
    with pytest.raises(ValueError, match="is not a session key"):
        SessionKey.telegram(5, topic_id=-7)


def test_a_web_console_conversation_has_its_own_key() -> None:
    key = SessionKey.parse("web:家里")
    assert key == SessionKey.web("家里") and str(key) == "web:家里" and key.channel == "web"
    assert key.scope("per_user") is None  # the console speaks for the shared memory


def test_the_per_user_scope_of_a_session() -> None:
    assert SessionKey.parse("telegram:42").scope("shared") is None
    assert SessionKey.parse("telegram:42").scope("per_user") == "42"  # a private chat's id is its user's
    assert SessionKey.parse("telegram:-100123:7").scope("per_user") == "7"  # a group member's own
    assert SessionKey.parse("telegram:-100123:7").scope("shared") is None
    assert SessionKey.parse("telegram:-100123:t5:7").scope("per_user") == "7"  # a member's own, in a forum topic
    assert SessionKey.parse("telegram:-100123:t5:7").scope("shared") is None
    assert SessionKey.parse("cli:default").scope("per_user") is None
    assert SessionKey.parse("cli:工作").scope("per_user") is None


def test_the_channel_of_a_key_even_one_that_does_not_parse() -> None:
    assert channel_of("telegram:-100123:7") == TELEGRAM
    assert channel_of("telegram:042") == TELEGRAM
    assert channel_of("cli:工作") == CLI
    assert channel_of("default") == "default"


@pytest.mark.parametrize(("text", "stored"), [
    ("telegram:42", True), ("telegram:-100:7", True), ("cli:工作", True),
    ("telegram:-100:t7", True), ("telegram:-100:t7:1001", True),  # forum topics (jobs set in one)
    ("telegram:042", True),  # older versions stored it: listed as undeliverable, not a broken file
    ("cli:" + "长" * 30, True),  # over the byte limit, but of the stored shape
    ("telegram:abc", False), ("telegram:-100:7:t9", False), ("cli:two words", False), ("whatsapp:1", False),
    ("", False),
])
def test_what_older_versions_stored(text: str, stored: bool) -> None:
    assert is_stored_form(text) is stored


def test_a_bare_session_name_is_a_terminal_session() -> None:
    assert terminal_key("work") == "cli:work"
    assert terminal_key("工作") == "cli:工作"
    assert terminal_key("cli:work") == "cli:work"
    assert terminal_key("telegram:42") == "telegram:42"
