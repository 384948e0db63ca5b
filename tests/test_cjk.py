"""The one CJK rule (picoclaw/cjk.py), and that every module asking "is this Chinese, Japanese or Korean?"
answers alike: search terms, token estimates, key facts, updates and job delays."""

from __future__ import annotations

from pathlib import Path

import pytest

from picoclaw import cjk
from picoclaw.jobs import JobError, parse_relative
from picoclaw.memory.rewrite_guard import missing_facts
from picoclaw.memory.supersede import supersedes
from picoclaw.memory.terms import terms
from picoclaw.tokens import estimate_tokens

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "picoclaw"


@pytest.mark.parametrize("character", [
    "中", "猫",  # Han
    "\u3400", "\u4db5",  # extension A
    "\uf900", "\ufa11",  # compatibility ideographs
    "ひ", "の", "カ", "ー",  # hiragana, katakana, the long vowel mark
    "한", "국", "\uac00", "\ud7a3",  # Hangul syllables
])
def test_han_kana_and_hangul_are_cjk_letters(character: str) -> None:
    assert cjk.is_cjk(character)
    assert cjk.has_cjk(f"abc {character} def")


@pytest.mark.parametrize("character", ["A", "z", "1", "é", "ß", " ", "🎉",
                                       "，", "。", "「", "！", "Ａ", "１", "\u3000"])  # CJK punctuation, full-width
def test_latin_digits_and_cjk_punctuation_are_not_letters(character: str) -> None:
    assert not cjk.is_cjk(character)
    assert not cjk.has_cjk(f"plain text {character}")


def test_letters_runs_and_counts() -> None:
    assert cjk.letters("我的猫 Tom 很乖。") == ["我", "的", "猫", "很", "乖"]
    assert cjk.runs("我的猫 Tom 很乖。") == ["我的猫", "很乖"]
    assert cjk.runs("私の猫はタマ, 내 고양이") == ["私の猫はタマ", "내", "고양이"]
    assert cjk.runs("no CJK here, 2025-03-10") == []
    # Punctuation and full-width forms are counted where a caller asks for them (token estimates).
    assert cjk.count_cjk("你好，世界！") == 6
    assert cjk.count_cjk("Ａ１ ok") == 2
    assert cjk.count_cjk("hello") == 0


def test_no_other_module_spells_a_cjk_range() -> None:
    spelled = sorted(
        path.relative_to(PACKAGE_ROOT.parent).as_posix()
        for path in PACKAGE_ROOT.rglob("*.py")
        if any(code in path.read_text(encoding="utf-8") for code in ("\\u4e00", "\\u3040", "\\uac00", "\\u3400"))
    )
    assert spelled == ["picoclaw/cjk.py"]


# -- the callers, Japanese and Korean beside Chinese and English ------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("宠物狗", ["宠", "宠物", "物", "物狗", "狗"]),
    ("東京タワー", ["東", "東京", "京", "京タ", "タ", "タワ", "ワ", "ワー", "ー"]),
    ("서울역", ["서", "서울", "울", "울역", "역"]),
    ("running dogs", ["run", "dog"]),
])
def test_search_terms_read_every_cjk_script_by_characters_and_pairs(text: str, expected: list[str]) -> None:
    assert terms(text) == expected


@pytest.mark.parametrize(("text", "tokens"), [
    ("你好世界", 4), ("こんにちは", 5), ("안녕하세요", 5), ("你好，世界！", 6), ("hello world!", 3),
])
def test_token_estimates_count_each_cjk_character(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


@pytest.mark.parametrize("original", [
    "我每周三晚上打网球。",
    "私は毎週水曜日の夜にテニスをします。",
    "저는 매주 수요일 저녁에 테니스를 칩니다.",
])
def test_a_cjk_sentence_translated_into_english_is_lost_in_every_script(original: str) -> None:
    assert missing_facts(original, "I play tennis every Wednesday evening.") == [f"“{original}”"]
    assert missing_facts(original, original) == []


@pytest.mark.parametrize(("old", "new"), [
    ("My weight is 62 kg.", "My weight is 58 kg."),
    ("体重62公斤。", "体重58公斤。"),
    ("体重は62キロです。", "体重は58キロです。"),
    ("몸무게는 62킬로입니다.", "몸무게는 58킬로입니다."),
    ("ジムのロッカーは217番です。", "ジムのロッカーは305番です。"),
    ("헬스장 사물함은 217번입니다.", "헬스장 사물함은 305번입니다."),
])
def test_the_same_fact_with_a_new_number_is_an_update_in_every_language(old: str, new: str) -> None:
    assert supersedes(new, old)


@pytest.mark.parametrize(("old", "new"), [
    ("My weight is 62 kg.", "My cat weighs 4 kg."),
    ("体重62公斤。", "猫的体重4公斤。"),
    ("体重は62キロです。", "猫の体重は4キロです。"),
    ("몸무게는 62킬로입니다.", "고양이 몸무게는 4킬로입니다."),
    ("体重は62キロです。", "体重は62キロです。"),  # the same numbers: nothing changed
])
def test_another_fact_or_the_same_numbers_is_no_update_in_every_language(old: str, new: str) -> None:
    assert not supersedes(new, old)


@pytest.mark.parametrize(("text", "message"), [
    ("20分钟后", None),
    ("20 minutes", None),
    ("20ふん", "unknown time unit 'ふん'"),  # read as a unit word, as a Chinese one is, and not known
    ("20분", "unknown time unit '분'"),
    ("20 fortnights", "unknown time unit 'fortnights'"),
])
def test_a_delay_reads_a_unit_in_any_cjk_script(text: str, message: str | None) -> None:
    if message is None:
        assert parse_relative(text).total_seconds() == 1200
        return
    with pytest.raises(JobError, match=message):
        parse_relative(text)
