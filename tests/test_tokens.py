"""tokens: the offline estimate (Chinese is not under-counted) and the tiktoken fallback that never raises."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import tiktoken

from picoclaw import tokens
from picoclaw.tokens import ENCODING_URL, UNAVAILABLE_MARKER, count_tokens, estimate_tokens, is_exact

REPO = Path(__file__).resolve().parents[1]

COFFEE = "我的咖啡偏好是无糖拿铁"  # 11 Han characters


@pytest.fixture(autouse=True)
def fresh_encoder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test loads the encoder anew (it is cached module-wide after the first count), with a cache folder
    of its own (a failure another test remembered there would skip the load)."""
    monkeypatch.setattr(tokens, "_encoder", None)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No cached encoding and no name resolution: what a machine without internet looks like.

    An empty TIKTOKEN_CACHE_DIR keeps a cache from an earlier online run from hiding the fallback, and
    failing DNS makes the test the same on a machine that does have internet (nothing is sent).
    """
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))

    def no_dns(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "offline test: no name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The fallback's notes: INFO, so a machine without the encoding is not warned by every command."""
    return [r for r in caplog.records if r.name == "picoclaw.tokens" and r.levelno >= logging.INFO]


# -- estimate --------------------------------------------------------------------------------------


def test_chinese_character_counts_as_one_token() -> None:
    assert estimate_tokens(COFFEE) == 11
    assert estimate_tokens("，。！") == 3  # full-width punctuation is CJK too
    assert estimate_tokens("ひらがなカタカナ") == 8
    assert estimate_tokens("안녕하세요") == 5


def test_english_counts_as_a_quarter_of_its_length() -> None:
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2  # rounded up: a short word is never 0 tokens
    assert estimate_tokens("hello world!") == 3
    text = "The user prefers oat milk lattes without sugar. " * 10
    assert estimate_tokens(text) == -(-len(text) // 4)


def test_mixed_text_adds_both_parts() -> None:
    # 3 Han characters + " coffee" (7 other characters → 2).
    assert estimate_tokens("我喜欢 coffee") == 5
    # 11 Han + ", oat milk" (10 other → 3).
    assert estimate_tokens(COFFEE + ", oat milk") == 14


def test_chinese_is_not_under_counted_fourfold() -> None:
    # The naive len/4 would count the 11 characters as 3 tokens.
    assert estimate_tokens(COFFEE) > 3 * estimate_tokens("x" * len(COFFEE))


def test_empty_text_is_zero_tokens() -> None:
    assert estimate_tokens("") == 0


# -- count_tokens ----------------------------------------------------------------------------------


def test_offline_count_falls_back_to_the_estimate_and_says_so_once_at_info(
    offline: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="picoclaw.tokens")
    assert count_tokens(COFFEE) == 11
    assert count_tokens("hello world!") == 3
    assert count_tokens("") == 0
    assert is_exact() is False
    warnings = _warnings(caplog)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "estimated" in warnings[0].getMessage() and warnings[0].levelno == logging.INFO


def test_a_count_is_kept_by_the_exact_text_and_the_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The system message is counted at every turn: counted once per counter; another text or counter counts anew,
    and a text over CACHED_CHARS is never kept."""
    calls: list[str] = []

    def counter(text: str) -> int:
        calls.append(text)
        return len(text)

    monkeypatch.setattr(tokens, "_encoder", counter)
    text = f"system prompt {time.monotonic_ns()}"  # not counted by any earlier test
    assert count_tokens(text) == count_tokens(text) == len(text)
    assert count_tokens(text + " ") == len(text) + 1
    assert calls == [text, text + " "]
    long = "x" * (tokens.CACHED_CHARS + 1)
    assert count_tokens(long) == count_tokens(long) == len(long)
    assert calls[2:] == [long, long]
    monkeypatch.setattr(tokens, "_encoder", lambda text: 7)  # tiktoken loaded after an estimate: its own counts
    assert count_tokens(text) == 7


def test_get_encoding_error_falls_back_to_the_estimate(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(name: str) -> Any:
        raise RuntimeError(f"cannot load {name}")

    # tiktoken imports fine but its encoding cannot be loaded (e.g. a corrupt cache).
    monkeypatch.setattr(tiktoken, "get_encoding", broken)
    caplog.set_level(logging.INFO, logger="picoclaw.tokens")
    text = COFFEE + " and some English"
    assert count_tokens(text) == estimate_tokens(text) == 11 + 5
    assert count_tokens(text) == 16
    warnings = _warnings(caplog)
    assert len(warnings) == 1
    assert "RuntimeError" in warnings[0].getMessage()


class _FakeEncoding:
    """Stands in for a loaded tiktoken encoding: one token per character, and records its calls."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        self.calls.append(kwargs)
        return list(range(len(text)))


def test_loaded_encoding_is_used_once_for_all_threads(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    encoding = _FakeEncoding()
    loads: list[str] = []

    def get_encoding(name: str) -> _FakeEncoding:
        loads.append(name)
        return encoding

    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
    caplog.set_level(logging.INFO, logger="picoclaw.tokens")
    results: list[int] = []
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        results.append(count_tokens("<|endoftext|> text"))

    workers = [threading.Thread(target=work) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert results == [18] * 8  # the encoding's count, not the estimate (which would be 5)
    assert loads == ["o200k_base"]  # loaded once, although 8 threads asked at the same moment
    assert is_exact() is True
    # Text that looks like a special token is counted, never rejected.
    assert all(call == {"disallowed_special": ()} for call in encoding.calls)
    assert _warnings(caplog) == []


# -- no network attempt at every start -------------------------------------------------------------

# A process as picoclaw starts: offline (the network guard), logging at DEBUG to stderr; it prints its count,
# whether it is exact, and how many times it reached for the network.
_PROCESS = """
import logging, socket, sys
from tests.fakes import network_guard
network_guard.install()
attempts = []
guarded_lookup, guarded_connect = socket.getaddrinfo, socket.socket.connect
def lookup(*args, **kwargs):
    attempts.append(args[0])
    return guarded_lookup(*args, **kwargs)
def connect(self, address):
    attempts.append(address)
    return guarded_connect(self, address)
socket.getaddrinfo, socket.socket.connect = lookup, connect
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
from picoclaw.tokens import count_tokens, is_exact
print(count_tokens("我的咖啡偏好是无糖拿铁 and oat milk"), is_exact(), len(attempts))
"""


def _start(cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", _PROCESS], env=env, capture_output=True, text=True,
                          encoding="utf-8", timeout=60, cwd=REPO)


@pytest.mark.slow
def test_a_second_process_makes_no_network_attempt_and_logs_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "tiktoken-cache"
    first, second = _start(cache), _start(cache)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    count, exact, attempts = first.stdout.split()
    assert (count, exact) == (str(11 + 4), "False") and int(attempts) >= 1  # tried, and failed
    assert "token counts are estimated" in first.stderr and "not tried again for a day" in first.stderr
    assert (cache / UNAVAILABLE_MARKER).exists()
    assert second.stdout.split() == [str(11 + 4), "False", "0"]  # same estimate, no attempt at all
    assert "picoclaw.tokens" not in second.stderr


@pytest.mark.slow
def test_a_remembered_failure_is_tried_again_after_a_day(tmp_path: Path) -> None:
    cache = tmp_path / "tiktoken-cache"
    _start(cache)
    day_and_more = time.time() - tokens.RETRY_AFTER - 60
    os.utime(cache / UNAVAILABLE_MARKER, (day_and_more, day_and_more))
    later = _start(cache)
    assert int(later.stdout.split()[2]) >= 1  # a day later: the download is tried once more
    assert "token counts are estimated" in later.stderr


def test_an_encoding_put_into_the_cache_is_used_despite_the_marker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    cache.mkdir()
    (cache / UNAVAILABLE_MARKER).write_text("yesterday\n", encoding="utf-8")
    (cache / hashlib.sha1(ENCODING_URL.encode()).hexdigest()).write_bytes(b"the encoding, copied by hand")
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: _FakeEncoding())
    assert count_tokens("我的咖啡") == 4 and is_exact() is True  # loaded (one token per character here)
    assert not (cache / UNAVAILABLE_MARKER).exists()  # and the marker is gone


def test_a_fresh_marker_skips_the_load_in_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    cache.mkdir()
    (cache / UNAVAILABLE_MARKER).write_text("just now\n", encoding="utf-8")
    loads: list[str] = []
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: loads.append(name))
    caplog.set_level(logging.INFO, logger="picoclaw.tokens")
    assert count_tokens(COFFEE) == 11
    assert loads == [] and _warnings(caplog) == []


def _offline(name: str) -> Any:
    raise OSError(f"{name}: offline")


def test_a_marker_from_the_future_does_not_hold_forever(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    cache.mkdir()
    marker = cache / UNAVAILABLE_MARKER
    marker.write_text("written before the clock went back\n", encoding="utf-8")
    next_year = time.time() + 365 * 24 * 3600
    os.utime(marker, (next_year, next_year))
    loads: list[str] = []

    def get_encoding(name: str) -> _FakeEncoding:
        loads.append(name)
        return _FakeEncoding()

    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
    assert count_tokens("咖啡") == 2 and is_exact() is True
    assert loads == ["o200k_base"]  # tried again: a marker dated ahead of the clock is not a fresh failure


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symbolic links here")
def test_the_marker_is_written_without_following_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The default cache (/tmp/data-gym-cache) may have been made by another user, who could leave a link there.
    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    cache.mkdir()
    victim = tmp_path / "someone-elses-file"
    victim.write_text("keep me\n", encoding="utf-8")
    (cache / UNAVAILABLE_MARKER).symlink_to(victim)
    monkeypatch.setattr(tiktoken, "get_encoding", _offline)
    assert count_tokens(COFFEE) == 11
    assert victim.read_text(encoding="utf-8") == "keep me\n"
    marker = cache / UNAVAILABLE_MARKER
    assert not marker.is_symlink() and marker.is_file()  # the link is replaced by the marker itself
    assert tokens._remembered_failure(cache)


def test_the_marker_of_an_unwritable_cache_is_skipped_quietly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "not-a-folder"
    cache.write_text("a file where the cache folder should be\n", encoding="utf-8")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setattr(tiktoken, "get_encoding", _offline)
    assert count_tokens(COFFEE) == 11 and is_exact() is False  # no marker, no crash: the next process tries again


def test_the_encoding_url_is_tiktokens_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """ENCODING_URL copies tiktoken's URL (its cache file is named by the URL's SHA-1): the two must agree."""
    from tiktoken_ext import openai_public

    asked: list[str] = []

    def load(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        asked.append(url)
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", load)
    openai_public.ENCODING_CONSTRUCTORS[tokens.ENCODING_NAME]()
    assert asked == [ENCODING_URL]
