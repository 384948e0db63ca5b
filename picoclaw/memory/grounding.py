"""Whether a line the model wants to keep is a fact the user stated: pure functions, no I/O.

A small model asked for "the lasting facts" of a conversation writes whatever it read: the stored entry again
in Markdown bold, a preference invented from the user's question ("我最喜欢的咖啡是什么？" → "My favorite coffee is
black coffee"), the assistant's advice, the user's question itself, its own refusal. So before an automatic
write (the memory flush, `memory_append`) a line is checked here:

- Not facts, whatever the model says: questions (a ? or ？, or a question form: "what is …", "do I …", 什么, 吗,
  呢, 哪, 谁, 几, 多少 …), advice ("try …", "you should …", 建议, 可以试试), apologies and refusals ("sorry", "I
  can't answer …", 抱歉, 我不能回答), and statements about the assistant ("The assistant …", "As an AI …").
- Already known: the line says again what a stored entry says, once Markdown emphasis, quotes, case, width
  and punctuation are set aside (its words are a run of the entry's words), or every telling term of it is in
  one entry (with the same negation). Nothing is written; it is no rejection either.
- Grounded: its telling content is in the user's own statements. Questions the user asked are not statements
  ("what is my favourite coffee?" states no coffee), and the assistant's replies, tool results and the
  `<context>` block of injected memory in front of a user's turn are not the user's words. Telling content is
  the key facts of memory/rewrite_guard.py (names, numbers, dates, phone numbers, identifiers), each of which must be
  there; the Latin content words (stemmed, stop words and the words a restatement adds, "user", "name", aside),
  all but one in four of which must be there; and the CJK characters (common ones aside), all but one in
  five of which must be there, with half the CJK bigrams at least (so the user's characters in the user's
  order). None of those key facts may stand in the line more often than in the user's statements: "Lin's sister
  is named Lin" from "My sister Lin lives in Hangzhou" uses only the user's words, but relates Lin to herself.
  A line saying "the user"/"用户"/"您" for the user is compared as if it said "I"/"我".

A line that is none of these and not grounded is refused as "not in the user's words", or as contradicting a
stored entry when it is about what one is about (the update rule's subject). Rules live here once; the flush
(curation/flush.py) and the memory_append tool apply them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from picoclaw import cjk
from picoclaw.memory.entries import (
    SECTION_HEADING,
    SUPERSEDED,
    LongTermEntry,
    entry_body,
    long_term_entries,
    recent_entries,
)
from picoclaw.memory.learnings import SOURCE_PREFIX
from picoclaw.memory.rewrite_guard import Fact, Rewrite, key_facts, normalise, sentences
from picoclaw.memory.supersede import Statement
from picoclaw.memory.terms import CJK_STOP_CHARS, STOP_WORDS, stem

# Why a line was not written: stable words, counted by `picoclaw memory stats` and logged.
QUESTION = "question"
ADVICE = "advice"
REFUSAL = "apology or refusal"
ABOUT_ASSISTANT = "about the assistant"
UNGROUNDED = "not in the user's words"
CONTRADICTS = "contradicts a stored entry"
REASONS = (QUESTION, ADVICE, REFUSAL, ABOUT_ASSISTANT, UNGROUNDED, CONTRADICTS)

LATIN_MISSING_PER = 4  # one Latin content word in four may be the restatement's own ("has", "works")
CJK_MISSING_PER = 5  # one CJK character in five
CJK_PAIR_SHARE = 0.5  # half the CJK bigrams, so the characters stand in the user's order
STEM_CHARS = 5  # stems compared by their first five letters: allergic / allergy, studies / studying
# The newest entries a line is compared with to find it already stored in other words (the store finds the same
# words among all of them): years of a person's facts, and a check does not tokenise a huge MEMORY.md.
KNOWN_WINDOW = 2_000

# Words a restatement adds about whose fact it is, not what the fact is ("The user's name is Anna" for "I'm Anna").
FRAMING_WORDS = frozenset({"user", "users", "name", "named", "called", "person"})
# How a fact written about the user says "I" in Chinese; the user's own "你" is the assistant, so only the line's.
_ZH_USER = re.compile(r"该用户|用户|您|你")
_SPELLING = (("favour", "favor"), ("colour", "color"), ("neighbour", "neighbor"), ("centre", "center"))

# Letters only: a contraction's or possessive's tail ("user'll", "Anna's") is no word of its own.
_LATIN_WORD = re.compile(r"[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f]+")
_NEGATION = re.compile(r"\b(?:not|no|never|don't|doesn't|didn't|isn't|aren't|wasn't|won't|can't|cannot)\b|[不没别未非]")
_CONTEXT_BLOCK = re.compile(r"\A\s*<context>.*?</context>\s*", re.DOTALL)


@dataclass(frozen=True)
class Verdict:
    """What to do with one line: "write" it, it is "known" already, or it is "rejected" (`reason` says why)."""

    action: Literal["write", "known", "rejected"]
    reason: str | None = None


# -- the user's words -------------------------------------------------------------------------------


def text_of(content: Any) -> str:
    """A message's text: its string, or the text parts of a list of parts (an image's part has none)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text") or "") for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
    return ""


def user_texts(messages: Iterable[dict[str, Any]]) -> list[str]:
    """What the user typed in `messages`: user messages only, without a `<context>` block of injected memory
    in front (a stored message keeps it apart, but an older transcript may carry it in the text)."""
    return [_CONTEXT_BLOCK.sub("", text_of(m.get("content"))) for m in messages if m.get("role") == "user"]


@dataclass(frozen=True)
class Said:
    """The user's statements (their questions left out), indexed for `grounded`."""

    text: str
    stems: frozenset[str]
    characters: frozenset[str]
    pairs: frozenset[str]

    @classmethod
    def of(cls, texts: Iterable[str]) -> Said:
        kept = [plain(sentence) for text in texts for sentence in statement_units(text) if not is_question(sentence)]
        text = "\n".join(kept)
        return cls(text, _latin_stems(text), frozenset(_characters(text)), _pairs(text))

    def __bool__(self) -> bool:
        return bool(self.text.strip())


_ASCII_END_BEFORE_CJK = re.compile(rf"(?<=[!?])(?=[{cjk.LETTERS}])")


def statement_units(text: str) -> list[str]:
    """The sentences of `text` as written (memory/rewrite_guard.py's split, at 。！？ too), and "!"/"?" straight before
    CJK text ("好!你呢?") ends one as well; split before NFKC turns full-width marks into ASCII ones."""
    return [part.strip() for sentence, _ in sentences(text) for part in _ASCII_END_BEFORE_CJK.split(sentence)
            if part.strip()]


# -- not facts --------------------------------------------------------------------------------------

_EMPHASIS = re.compile(r"\*+|`+|~~|(?<![\w])_+|_+(?![\w])")
_QUOTES = "\"'“”‘’「」『』《》"


def plain(line: str) -> str:
    """`line` as a reader sees it: NFKC (full-width forms as ASCII), no Markdown emphasis, no quotes around it."""
    text = _EMPHASIS.sub("", normalise(line)).strip()
    return text.strip(_QUOTES + " ").strip()


# A question's word order, without its question mark ("What is my favourite coffee", "do I like tea"). A line
# ending in "." or "!" is read as the statement it says it is ("What can I say, I love turtles.").
_EN_QUESTION_FORM = re.compile(
    r"^(?:(?:what|which|who|whom|whose|where|when|why|how)(?:'s|\s+(?:is|are|was|were|do|does|did|can|could|will"
    r"|would|should|shall|has|have|am|much|many|long|often|old|far)\b)"
    r"|(?:what|which|whose)\s+(?!i\b|we\b|you\b|they\b|he\b|she\b|it\b)\w+\s+(?:is|are|was|were|do|does|did|can"
    r"|will|should)\b"
    r"|(?:do|does|did|is|are|am|can|could|will|would|should|shall|have|has)\s+(?:i|you|we|they|he|she|my|your"
    r"|our)\b)", re.IGNORECASE)
# Said of a question anywhere: "I wonder …", "The user asked about …", "用户想知道 …".
_ASKED = re.compile(r"^i\s+(?:wonder|want\s+to\s+know|would\s+like\s+to\s+know)\b"
                    r"|\buser\s+(?:asked|asks|inquired|enquired|(?:is|was)\s+curious)\s+(?:about|what|which|who|whom"
                    r"|whether|if|how|when|where|why)\b|\buser\s+(?:wants?|wanted)\s+to\s+know\b"
                    r"|^asked\s+(?:about|what|which|who|whether)\b|用户(?:问|想知道|询问|好奇)|询问", re.IGNORECASE)
_ZH_QUESTION_END = re.compile(r"[吗呢么嘛][\s。.!！~～]*$")
# A question word ending a Chinese sentence ("…是什么", "…在哪里", "…几号"); inside one it is usually part of a
# statement ("让我想起音乐是如何将我们凝聚在一起的", "说不定哪天我会试试").
_ZH_QUESTION_TAIL = re.compile(r"(?:什么|哪[里儿个些种天年]?|谁|多少|几[点号个岁月天年次]?|怎么样?|怎样|如何"
                               r"|为什么|为何|是否|有没有|是不是|要不要|能不能|可不可以)[了呀啊]?$")
# A question form opening a Chinese sentence, with no question mark after it: 能不能帮我查一下…, 请问…, 是否…
_ZH_QUESTION_START = re.compile(r"^(?:请问|能不能|能否|可不可以|可否|是否|有没有|是不是|要不要|会不会|难道)")
_TERMINAL = (".", "!", "。", "！")


def is_question(line: str) -> bool:
    """Whether `line` asks rather than states (English or Chinese)."""
    text = plain(line).rstrip(_QUOTES + ")）] ")
    if text.endswith(("?", "？")) or _ASKED.search(text):
        return True
    if text.endswith(_TERMINAL):
        return False
    if _EN_QUESTION_FORM.search(text):
        return True
    return cjk.has_cjk(text) and (_ZH_QUESTION_END.search(text) is not None
                                  or _ZH_QUESTION_TAIL.search(text) is not None
                                  or _ZH_QUESTION_START.search(text) is not None)


_REFUSAL = re.compile(
    r"^(?:i'?m\s+sorry|i\s+am\s+sorry|so\s+sorry|sorry\b|i\s+apologi[sz]e\b|apologies\b)"
    r"|\bi\s+(?:cannot|can't|can\s+not|am\s+unable\s+to|'m\s+unable\s+to|am\s+not\s+able\s+to|won't\s+be\s+able\s+to)"
    r"\s+(?:help|answer|assist|provide|share|access|do\s+that|comply|fulfil|fulfill|tell|give|find|remember|say"
    r"|discuss|respond|browse|see)\b"
    r"|\bi\s+(?:do\s+not|don't)\s+(?:know\s+(?:your|that|this|the\s+answer)|have\s+(?:access|information"
    r"|the\s+information|that\s+information|personal))\b"
    r"|^(?:抱歉|对不起|很抱歉|非常抱歉|不好意思)"
    r"|我(?:不能|无法|没法|没有办法|不可以)(?:回答|提供|帮|协助|告诉|访问|查到|找到|记住|透露|处理|完成)",
    re.IGNORECASE)
_ABOUT_ASSISTANT = re.compile(
    r"^(?:the\s+|this\s+|your\s+)?(?:ai\s+)?(?:assistant|chatbot|bot|language\s+model)\b"
    r"|\b(?:i\s+am|i'm)\s+(?:an?\s+)?(?:ai|ai\s+assistant|language\s+model|chatbot|virtual\s+assistant)\b"
    r"|\b(?:i\s+am|i'm)\s+your\s+(?:ai\s+)?assistant\b|\bas\s+an\s+ai\b"
    r"|^(?:这个|该)?(?:AI|人工智能)?(?:助手|助理|机器人)"
    r"|我是(?:一个|你的|您的)?(?:AI|人工智能|语言模型|助手|助理|聊天机器人)|作为(?:一个)?(?:AI|人工智能|语言模型|助手)",
    re.IGNORECASE)
_ADVICE = re.compile(
    r"^(?:try|consider|make\s+sure|be\s+sure\s+to|remember\s+to|don't\s+forget\s+to|avoid)\b"
    r"|(?:^|[,;:]\s*)try\s+(?:to\b|\w+ing\b)"
    r"|\byou\s+(?:should|could\s+try|can\s+try|might\s+want\s+to|may\s+want\s+to|might\s+try|need\s+to|ought\s+to"
    r"|'d\s+better|had\s+better)\b"
    r"|\b(?:i|we)\s+(?:recommend|suggest|advise)\b"
    r"|\bit(?:'s|\s+is)\s+(?:recommended|advisable|a\s+good\s+idea|best\s+to)\b"
    r"|^(?:建议|我建议|试试|不妨|可以试试|可以尝试|[你您](?:可以|需要))|可以试试|不妨试试"
    r"|[你您](?:应该|最好|不妨|可以试试|可以尝试)",
    re.IGNORECASE)


_REQUEST = re.compile(r"^(?:please\s+)?(?:tell|remind|show|give|help)\s+me\b|^(?:请|麻烦)?[你您]?(?:告诉|帮)我",
                      re.IGNORECASE)


def not_a_fact(line: str) -> str | None:
    """Why `line` is no fact about the user whoever wrote it (QUESTION, REFUSAL, ABOUT_ASSISTANT, ADVICE), or None.
    A request to the assistant ("Tell me a tip") counts as a question."""
    text = plain(line)
    if is_question(text) or _REQUEST.search(text):
        return QUESTION
    if _REFUSAL.search(text):
        return REFUSAL
    if _ABOUT_ASSISTANT.search(text):
        return ABOUT_ASSISTANT
    if _ADVICE.search(text):
        return ADVICE
    return None


# -- telling content ------------------------------------------------------------------------------------


def _stem(word: str) -> str:
    word = word.lower()
    for british, american in _SPELLING:
        word = word.replace(british, american)
    return stem(word)[:STEM_CHARS]


def _latin_stems(text: str) -> frozenset[str]:
    return frozenset(_stem(word) for word in _LATIN_WORD.findall(text)
                     if len(word) >= 3 and word.lower() not in STOP_WORDS | FRAMING_WORDS)


def _characters(text: str) -> list[str]:
    return [ch for ch in cjk.letters(text) if ch not in CJK_STOP_CHARS]


def _pairs(text: str) -> frozenset[str]:
    return frozenset(run[i:i + 2] for run in cjk.runs(text) for i in range(len(run) - 1))


# A count written as a word is as telling as one written in digits ("She has two daughters" from "my daughter
# Inês"): it must be the user's. 一 and 十 are left out (一起, 一下, 十分 are how a paraphrase says "together",
# "a little", "very"), and so is "one" ("one of", "the one who").
_NUMBER_WORD = re.compile(r"\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty"
                          r"|fifty|sixty|seventy|eighty|ninety|hundred|thousand|million|dozen|twice)\b"
                          r"|[两三四五六七八九]", re.IGNORECASE)


def _number_words(text: str) -> frozenset[str]:
    return frozenset(word.lower() for word in _NUMBER_WORD.findall(text))


def _as_said_by_user(line: str) -> str:
    """The line with the user named as "I" in Chinese (用户的女儿 → 我的女儿), as the user would say it."""
    return _ZH_USER.sub("我", line)


def _said_more_often(text: str, hard: Sequence[Fact], said: Rewrite) -> bool:
    """Whether a name, number, identifier or CJK term stands in `text` more often than in the user's statements.

    Each of its words may be the user's while the line relates a thing to itself: "My sister Lin lives in
    Hangzhou" → "Lin's sister is named Lin", 我妹妹林林住在杭州 → 林林的妹妹叫林林. Using a telling word twice
    where the user used it once makes up a relation the user never stated; a paraphrase names things as often.
    """
    line = Rewrite(text)
    for fact in hard:
        here = line.count(fact)
        there = said.count(fact)
        if here is not None and there is not None and here > there:
            return True
    return False


def grounded(line: str, said: Said) -> bool:
    """Whether the telling content of `line` is in the user's statements `said` (see the module's rule)."""
    if not said:
        return False
    text = _as_said_by_user(plain(line))
    index = Rewrite(said.text)
    hard = key_facts(text).facts
    if not all(index.keeps(fact) for fact in hard):
        return False
    if _said_more_often(text, hard, index):
        return False
    if not _number_words(text) <= _number_words(said.text):
        return False
    words = _latin_stems(text)
    if words and len(words - said.stems) > (len(words) - 1) // LATIN_MISSING_PER:
        return False
    characters = set(_characters(text))
    if characters:
        if len(characters - said.characters) > (len(characters) - 1) // CJK_MISSING_PER:
            return False
        pairs = _pairs(text)
        if pairs and len(pairs & said.pairs) < CJK_PAIR_SHARE * len(pairs):
            return False
    return bool(hard or words or characters) and _same_polarity(text, said)


# A negation, and the word it denies: "not allergic", "don't really like", "never drink", "no longer smoke", 不喜欢,
# 没有车, 不太喜欢 (an adverb between is skipped). A bare "No," answering a question denies nothing after it, and the
# Chinese words that only look negative (未来, 非常, 不错 …) deny nothing.
_DENIAL = re.compile(r"\b(?:not|no(?:\s+longer)?|never|don't|doesn't|didn't|isn't|aren't|wasn't|weren't|won't"
                     r"|can't|cannot|couldn't|shouldn't|wouldn't|haven't|hasn't|hadn't)\s+"
                     r"(?:(?:really|very|at|all|so|too|much|ever|even|a|an|the|be|been|to|any|got)\s+)*"
                     rf"([A-Za-z\u00c0-\u024f]+)"
                     rf"|[不没别未非](?:太|大|很|是很|怎么|再|是)?([{cjk.LETTERS}])", re.IGNORECASE)
_NOT_DENIALS = re.compile(r"未来|别人|别的|非常|不错|不过|不少|不但|不仅|差不多|不管|不久|没错|无论")
# Where one clause ends and the next begins: a polarity belongs to its clause ("I don't like coffee but I like tea").
_CLAUSE = re.compile(r"[,;，；、]|\b(?:but|however|although|though|yet|whereas)\b|但是|但|可是|不过|而是|却",
                     re.IGNORECASE)


def _terms(text: str) -> frozenset[str]:
    """Every word of `text` (stemmed) and every CJK character: what a negation may deny."""
    return frozenset(_stem(word) for word in _LATIN_WORD.findall(text)) | frozenset(cjk.letters(text))


def _denied(text: str) -> frozenset[str]:
    return frozenset(_stem(latin) if latin else han for latin, han in _DENIAL.findall(_NOT_DENIALS.sub(" ", text)))


def overlap(line: str, text: str) -> int:
    """How much telling content `line` shares with `text`: content words (stemmed) and CJK characters."""
    plain_line, plain_text = plain(line), plain(text)
    return len((_latin_stems(plain_line) | frozenset(_characters(plain_line)))
               & (_latin_stems(plain_text) | frozenset(_characters(plain_text))))


def _same_polarity(text: str, said: Said) -> bool:
    """Whether each clause of `text` denies only what the user denied, and states nothing the user's clause closest
    to it denies: "I am allergic to peanuts" from "I am not allergic to peanuts", 我喜欢咖啡 from 我不喜欢咖啡, has
    every word of the user's and says the opposite. The closest clause shares most telling content with the
    line's clause (the bag of words compares the whole span; a polarity belongs to one clause)."""
    theirs = [clause for sentence in said.text.split("\n") for clause in _CLAUSE.split(sentence) if clause.strip()]
    told = [(_latin_stems(clause) | frozenset(_characters(clause)), _denied(clause)) for clause in theirs]
    for clause in _CLAUSE.split(text):
        telling = _latin_stems(clause) | frozenset(_characters(clause))
        if not telling:
            continue
        scored = [(len(telling & content), denied) for content, denied in told] or [(0, frozenset())]
        denied = _denied(clause)
        if not denied <= frozenset().union(*(them for score, them in scored if score)):
            return False
        stated = _terms(clause) - denied
        best = max(score for score, _ in scored)
        if all(them & stated for score, them in scored if score == best):
            return False
    return True


# -- what memory already holds ------------------------------------------------------------------------------

_TOKEN = re.compile(rf"[{cjk.LETTERS}]|[^\W_]+")


def _tokens(text: str) -> str:
    """The words and CJK characters of `text`, lower-cased, one space apart and around: for run look-ups."""
    return " " + " ".join(token.casefold() for token in _TOKEN.findall(plain(text))) + " "


def added_text(old: str, new: str) -> str:
    """What an edit replacing `old` with `new` says that `old` did not: the sentences of `new` that are in no
    sentence of `old`, without the entries' frame (their `## ` headings as in `old`, superseded marks).

    Only the real frame is skipped: a `> ` quote, a `# ` title or a `## ` heading the edit wrote is read like
    any line, and a `Source:` line is guarded by `sources_changed`."""
    before = {_tokens(sentence) for sentence, _ in sentences(old)}
    headings = {line for line in old.splitlines() if SECTION_HEADING.match(line)}
    body = "\n".join(line for line in new.splitlines() if line not in headings and not line.startswith(SUPERSEDED))
    return " ".join(sentence for sentence, _ in sentences(body) if _tokens(sentence) not in before)


def _provenance(entry: LongTermEntry) -> tuple[str, tuple[str, ...]]:
    """What an entry says (its words, any line that reads as a `Source:` line aside) and its `Source:`-like lines
    as written, so a line dressed differently ("**Source:**", indented) still counts as one."""
    lines = entry.text.rstrip("\n").split("\n")[1:]
    sources = tuple(line for line in lines if plain(line).casefold().startswith(SOURCE_PREFIX.casefold()))
    said = "\n".join(line for line in lines if line not in sources and not line.startswith(SUPERSEDED))
    return _tokens(said), sources


def sources_changed(old: str, new: str) -> bool:
    """Whether turning MEMORY.md's `old` into `new` drops or changes an entry's `Source:` line while the entry
    still says the same words: who gave an entry is the store's record, and the model's must not pass as the user's."""
    before = Counter(_provenance(entry) for entry in long_term_entries(old))
    said = {words for words, _ in before}
    after = Counter(_provenance(entry) for entry in long_term_entries(new))
    return any(count > before[key] for key, count in after.items() if key[0] in said)


def same_words(one: str, other: str) -> bool:
    """Whether two texts say the same words in the same order once Markdown emphasis, quotes, case, width and
    punctuation are set aside (as a restatement is found)."""
    return _tokens(one) == _tokens(other)


@dataclass(frozen=True)
class Known:
    """Stored entries as `check` compares a line with them: each one's body, worked out once, and the entry."""

    texts: tuple[str, ...]
    entries: tuple[LongTermEntry | None, ...]  # None: a fact written in this flush, not read from the file
    runs: tuple[str, ...]
    stems: tuple[frozenset[str], ...]
    characters: tuple[frozenset[str], ...]
    negated: tuple[bool, ...]
    # Each entry's sentences as the update rule sees them, worked out when first asked for (`statements`): only
    # an ungrounded line needs them, and then every one, for each such line of a flush.
    _statements: dict[int, tuple[Statement, ...]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, texts: Sequence[str], entries: Sequence[LongTermEntry | None] = ()) -> Known:
        norm = [_as_said_by_user(plain(text)) for text in texts]
        return cls(tuple(texts), tuple(entries) or (None,) * len(texts), tuple(_tokens(text) for text in norm),
                   tuple(_latin_stems(text) for text in norm), tuple(frozenset(_characters(text)) for text in norm),
                   tuple(_NEGATION.search(text.lower()) is not None for text in norm))

    @classmethod
    def of_memory(cls, text: str, window: int = KNOWN_WINDOW) -> Known:
        """The newest `window` entries of MEMORY.md's `text` that nothing superseded."""
        entries = recent_entries(text, window)
        return cls.of([entry_body(entry.text) for entry in entries], entries)

    def plus(self, text: str) -> Known:
        """These entries and one more (a fact written just now)."""
        one = Known.of([text])
        return Known(self.texts + one.texts, self.entries + one.entries, self.runs + one.runs,
                     self.stems + one.stems, self.characters + one.characters, self.negated + one.negated,
                     dict(self._statements))  # indices stay, so the statements worked out are kept

    def find(self, line: str) -> int | None:
        """The index of an entry that already says what `line` says (its words are a run of the entry's, or every
        telling term of it is in the entry, with the same negation); None if none does."""
        text = _as_said_by_user(plain(line))
        run = _tokens(text)
        if run.strip():
            for n, entry in enumerate(self.runs):
                if run in entry:
                    return n
        words, characters = _latin_stems(text), frozenset(_characters(text))
        if not words and not characters:
            return None
        hard = key_facts(text).facts
        negated = _NEGATION.search(text.lower()) is not None
        for n, entry in enumerate(self.texts):
            if words <= self.stems[n] and characters <= self.characters[n] and negated == self.negated[n] \
                    and all(Rewrite(entry).keeps(fact) for fact in hard):
                return n
        return None

    def restated(self, line: str) -> bool:
        """Whether an entry already says what `line` says (see `find`)."""
        return self.find(line) is not None

    def contradicted(self, line: str) -> bool:
        """Whether `line` is about what a stored entry is about (the update rule's subject, two words at least)."""
        new = Statement.of(_as_said_by_user(plain(line)))
        for n in range(len(self.texts)):
            for old in self.statements(n):
                if len(new.subject & old.words) >= 2 or new.updates(old):
                    return True
        return False

    def statements(self, n: int) -> tuple[Statement, ...]:
        """Entry `n`'s sentences as the update rule sees them, worked out once."""
        if n not in self._statements:
            self._statements[n] = tuple(Statement.of(sentence) for sentence, _ in sentences(self.texts[n]))
        return self._statements[n]


def check(line: str, said: Said, known: Known) -> Verdict:
    """Whether to write `line`, a fact the model proposes: not a fact, known already, grounded, or not."""
    reason = not_a_fact(line)
    if reason is not None:
        return Verdict("rejected", reason)
    if known.restated(line):
        return Verdict("known")
    if grounded(line, said):
        return Verdict("write")
    return Verdict("rejected", CONTRADICTS if known.contradicted(line) else UNGROUNDED)
