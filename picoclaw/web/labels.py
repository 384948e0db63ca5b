"""The console's words in English and Chinese, chosen from the browser's language or the `lang` cookie."""

from __future__ import annotations

LANGUAGES = ("en", "zh")
LANG_COOKIE = "picoclaw_lang"

LABELS: dict[str, dict[str, str]] = {
    "en": {
        "title": "picoclaw console",
        "nav_memory": "Memory",
        "nav_why": "Why this answer",
        "why_title": "Why this answer",
        "why_help": ("Every turn keeps what memory it carried, what found it, with which score, and the policy "
                     "values that decided how much."),
        "conversation": "Conversation",
        "messages": "messages",
        "archived": "archived",
        "no_conversations": "No conversations yet.",
        "you": "You",
        "found_by": "found by",
        "where": "where",
        "policy_values": "policy values",
        "search_method": "search",
        "searched_for": "searched for",
        "nothing_injected": "No memory was injected.",
        "no_record": "No record: this turn was taken before picoclaw kept one.",
        "prompt_tokens": "prompt tokens",
        "cached_tokens": "served from the provider's cache",
        "chart_title": "Prompt tokens (grey) and cached tokens (green) per reply",
        "reply": "Reply",
        "login_title": "Log in",
        "login_help": "Open the login link that `picoclaw web` printed in its terminal.",
        "link_refused": "This login link is wrong or was already used. Restart `picoclaw web` for a new one.",
        "memory_title": "Long-term memory",
        "entries": "entries",
        "superseded": "superseded",
        "search": "Search",
        "search_placeholder": "search memory",
        "results_for": "Results for",
        "no_results": "Nothing in memory matches.",
        "score": "score",
        "add_entry": "Add an entry",
        "add": "Add",
        "added": "Added to MEMORY.md.",
        "already_there": "Memory already holds this; nothing was written.",
        "empty_entry": "Write something first: an empty entry is not added.",
        "newer": "Newer",
        "older": "Older",
        "page": "page",
        "of": "of",
        "language": "中文",
    },
    "zh": {
        "title": "picoclaw 控制台",
        "nav_memory": "记忆",
        "nav_why": "为什么这样回答",
        "why_title": "为什么这样回答",
        "why_help": "每一轮都记录了注入了哪些记忆、由哪种搜索找到、得分多少，以及决定注入多少的策略值。",
        "conversation": "对话",
        "messages": "条消息",
        "archived": "已归档",
        "no_conversations": "还没有对话。",
        "you": "你",
        "found_by": "来源",
        "where": "位置",
        "policy_values": "策略值",
        "search_method": "搜索方式",
        "searched_for": "搜索词",
        "nothing_injected": "这一轮没有注入记忆。",
        "no_record": "没有记录：这一轮发生在 picoclaw 开始记录之前。",
        "prompt_tokens": "提示词 token",
        "cached_tokens": "命中服务商缓存",
        "chart_title": "每次回复的提示词 token（灰）与缓存命中 token（绿）",
        "reply": "回复",
        "login_title": "登录",
        "login_help": "请打开 `picoclaw web` 在终端里打印的登录链接。",
        "link_refused": "登录链接无效或已被使用。请重新运行 `picoclaw web` 获取新链接。",
        "memory_title": "长期记忆",
        "entries": "条",
        "superseded": "已被更新",
        "search": "搜索",
        "search_placeholder": "搜索记忆",
        "results_for": "搜索结果：",
        "no_results": "记忆中没有匹配的内容。",
        "score": "得分",
        "add_entry": "添加一条记忆",
        "add": "添加",
        "added": "已写入 MEMORY.md。",
        "already_there": "记忆中已有这条内容，未重复写入。",
        "empty_entry": "内容为空，未添加。",
        "newer": "较新",
        "older": "较早",
        "page": "第",
        "of": "页，共",
        "language": "English",
    },
}


def language_of(cookie: str | None, accept_language: str) -> str:
    """The cookie's language when it names one, else the first of the browser's that we speak, else English."""
    if cookie in LANGUAGES:
        return cookie
    for part in accept_language.split(","):
        code = part.split(";")[0].strip().lower()
        if code.startswith("zh"):
            return "zh"
        if code.startswith("en"):
            return "en"
    return "en"
