"""secrets.excerpt and redact: a secret never survives an excerpt, wherever the cut falls."""

from __future__ import annotations

import pytest

from picoclaw.redact import MASK, excerpt, redact

# The shape of a real bot token: a public bot id, a colon, 35 secret characters.
TOKEN = "7234567890:AAHq3ZkT9vWxR2mYpL8nB4cJ6dF0gS1hKeU"
SECRET = TOKEN.split(":", 1)[1]
SECRETS = (TOKEN, SECRET)


def leaked(text: str, secret: str = SECRET, run: int = 4) -> list[str]:
    """Every run of `run` characters of `secret` that appears in `text`."""
    return [secret[i:i + run] for i in range(len(secret) - run + 1) if secret[i:i + run] in text]


@pytest.mark.parametrize("before", ["Upstream timeout for POST /bot", "上游服务器超时：POST /bot"],
                         ids=["english", "chinese"])
def test_no_cut_leaves_any_of_the_secret(before: str) -> None:
    text = f"{before}{TOKEN}/getMe 之后 and more text after the path"
    for limit in range(1, len(text) + 5):  # every cut: before, inside and after the token
        shown = excerpt(text, limit, SECRETS)
        assert len(shown) <= max(limit, 1) and leaked(shown) == [], (limit, shown)
    assert excerpt(text, 200, SECRETS) == f"{before}{MASK}/getMe 之后 and more text after the path"


def test_a_percent_encoded_colon_still_hides_the_secret_half() -> None:
    text = f"GET /bot{TOKEN.replace(':', '%3A')}/getUpdates failed"
    assert excerpt(text, 200, SECRETS) == f"GET /bot7234567890%3A{MASK}/getUpdates failed"


def test_a_token_at_the_start_and_the_end() -> None:
    assert excerpt(f"{TOKEN} was refused", 200, SECRETS) == f"{MASK} was refused"
    assert excerpt(f"refused: {TOKEN}", 200, SECRETS) == f"refused: {MASK}"
    assert excerpt(TOKEN, 5, SECRETS) == MASK  # short enough once redacted: no cut at all


def test_chinese_text_around_a_secret_is_kept_whole() -> None:
    text = f"错误：令牌 {TOKEN} 无效，请检查配置。"
    assert excerpt(text, 200, SECRETS) == f"错误：令牌 {MASK} 无效，请检查配置。"
    assert excerpt(text, 9, SECRETS) == "错误：令牌 **…"


def test_a_piece_of_a_secret_left_at_the_cut_is_masked() -> None:
    # A server that already shortened what it echoed: the piece does not match the whole secret, and the cut
    # ends right after it.
    text = f"invalid key {SECRET[:20]}, try again with another one"
    cut = excerpt(text, len("invalid key ") + 20 + 1, SECRETS)
    assert cut == f"invalid key {MASK}…" and leaked(cut) == []
    # Three characters are too few to tell anything from: kept, as they would be in any word.
    assert excerpt(f"invalid key {SECRET[:3]}, try again", len("invalid key ") + 3 + 1, SECRETS) == \
        f"invalid key {SECRET[:3]}…"


@pytest.mark.parametrize("placeholder", ["ollama", "sk-", "x", "EMPTY", "lm-studio"])
def test_short_placeholders_are_not_secrets(placeholder: str) -> None:
    text = f"provider ollama: model not found (key {placeholder}); 模型 ollama 不存在"
    assert excerpt(text, 200, [placeholder]) == text
    assert redact(text, [placeholder]) == text


def test_an_excerpt_is_one_line() -> None:
    assert excerpt(f"<h1>502</h1>\r\n\t{TOKEN}\n\n 上游\n", 200, SECRETS) == f"<h1>502</h1> {MASK} 上游"


def test_redact_replaces_the_longest_secret_first() -> None:
    # The token contains its secret half: replaced whole, not as "7234567890:***".
    assert redact(f"a {TOKEN} b {SECRET} c", SECRETS) == f"a {MASK} b {MASK} c"
    assert redact("nothing to hide", ["", TOKEN]) == "nothing to hide"
