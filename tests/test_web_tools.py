"""web_fetch and web_search against local servers only: extraction, the SSRF guard, limits, search backends."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from picoclaw.config import ToolsConfig, WebConfig, WebSearchConfig
from picoclaw.html_text import html_text, html_title, one_line
from picoclaw.memory.workspace import Workspace
from picoclaw.tools.base import ToolRegistry
from picoclaw.tools.registry import build_tools
from picoclaw.tools.web import IPAddress, WebFetch, WebSearch, is_public
from tests.fakes.http_server import BackgroundHTTPServer

ARTICLE = """<!doctype html><html><head><title>Tea notes</title></head><body>
<nav><a href="/">Home</a> | <a href="/about">About</a> | <a href="/login">Login</a></nav>
<article><h1>Brewing Longjing</h1>
<p>Longjing is a green tea from Hangzhou. Brew it at about eighty degrees Celsius, never with boiling water,
because boiling water cooks the leaves and makes the cup bitter.</p>
<p>Use three grams of leaves for one hundred and fifty millilitres of water, and steep the first infusion for
about two minutes. Later infusions can be a little longer; a good Longjing gives three or four cups.</p>
<p>Store the leaves in an airtight tin, away from light and strong smells, ideally in the refrigerator.</p>
</article>
<footer>Copyright 2024 Example Tea Shop. All rights reserved.</footer>
<script>var tracking = "SCRIPT-CONTENT";</script>
</body></html>"""

CHINESE = """<!doctype html><html><head><meta charset="gbk"><title>龙井茶的冲泡</title></head><body>
<nav>首页 | 关于我们 | 登录</nav>
<article><h1>如何冲泡龙井</h1>
<p>龙井是产自杭州的绿茶。冲泡时水温以八十度左右为宜，不要用沸水，否则茶叶会被烫熟，茶汤变得苦涩。</p>
<p>一般用三克茶叶配一百五十毫升水，第一泡大约两分钟，之后每泡可以稍微延长时间，好的龙井可以泡三到四次。</p>
<p>茶叶应放在密封罐中，避光、远离异味，最好冷藏保存。</p>
</article></body></html>"""


class FakeWeb(BackgroundHTTPServer):
    """Pages, redirects, a huge page, a slow page, and the three search APIs; records what it was sent."""

    name = "fake-web"

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []
        self.redirect_to = ""

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/article", self._article)
        app.router.add_get("/zh", self._chinese)
        app.router.add_get("/plain", self._plain)
        app.router.add_get("/host", self._host)
        app.router.add_get("/image", self._image)
        app.router.add_get("/hop", self._hop)
        app.router.add_get("/loop", self._endless)
        app.router.add_get("/big", self._big)
        app.router.add_get("/slow", self._slow)
        app.router.add_get("/res/v1/web/search", self._brave)
        app.router.add_post("/search", self._tavily)
        app.router.add_get("/searx/search", self._searxng)

    def _record(self, request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        # `peer` (the client's address and port) tells which connection a request came on.
        self.requests.append({"path": request.path, "query": dict(request.query),
                              "headers": dict(request.headers), "peer": request.transport and
                              request.transport.get_extra_info("peername")})
        if isinstance(response, web.HTTPException):
            raise response
        return response

    async def _article(self, request: web.Request) -> web.StreamResponse:
        return self._record(request, web.Response(text=ARTICLE, content_type="text/html"))

    async def _chinese(self, request: web.Request) -> web.StreamResponse:
        # No charset in the header: only the page's <meta charset="gbk"> says how to read it.
        return self._record(request, web.Response(body=CHINESE.encode("gbk"), headers={"Content-Type": "text/html"}))

    async def _plain(self, request: web.Request) -> web.StreamResponse:
        return self._record(request, web.Response(text="just text", content_type="text/plain"))

    async def _host(self, request: web.Request) -> web.StreamResponse:
        return self._record(request, web.Response(text=f"host={request.host}"))

    async def _image(self, request: web.Request) -> web.StreamResponse:
        return self._record(request, web.Response(body=b"\x89PNG", content_type="image/png"))

    async def _endless(self, request: web.Request) -> web.StreamResponse:
        return self._record(request, web.HTTPFound("/loop"))

    async def _hop(self, request: web.Request) -> web.StreamResponse:
        return self._record(request, web.HTTPFound(self.redirect_to))

    async def _big(self, request: web.Request) -> web.StreamResponse:
        self._record(request, web.Response())
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        for _ in range(300):  # 3 MB, then a marker that a size-limited fetch must never see
            await response.write(b"a" * 10_000)
        await response.write(b"END-MARKER")
        return response

    async def _slow(self, request: web.Request) -> web.StreamResponse:
        self._record(request, web.Response())
        await self.pause(30)  # cut short when the server stops
        return web.Response(text="too late")

    async def _brave(self, request: web.Request) -> web.StreamResponse:
        self._record(request, web.Response())
        if request.headers.get("X-Subscription-Token") != "brave-key":
            return web.json_response({"error": "bad token"}, status=401)
        return web.json_response({"web": {"results": [
            {"title": "Longjing - Wikipedia", "url": "https://en.wikipedia.org/wiki/Longjing_tea",
             "description": "Longjing is a   variety of <strong>green</strong> tea &amp; China&#39;s pride "
                            "(&lt;b&gt; is a tag; 2 < 3)."},
            {"title": "<strong>Tea</strong> &amp; water", "url": "https://tea.example/water",
             "description": "Soft water is <span class=\"hl\">best</span>."},
            {"title": "Brewing guide", "url": "https://tea.example/brew", "description": "80 °C water."}]}})

    async def _tavily(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"path": request.path, "json": body, "headers": dict(request.headers)})
        if request.headers.get("Authorization") != "Bearer tvly-key":
            return web.json_response({"detail": "unauthorized"}, status=401)
        return web.json_response({"query": body["query"], "results": [
            {"title": "龙井茶", "url": "https://zh.example/longjing", "content": "西湖龙井是绿茶。", "score": 0.9}]})

    async def _searxng(self, request: web.Request) -> web.StreamResponse:
        self._record(request, web.Response())
        if request.query.get("format") != "json":
            return web.Response(status=403)
        return web.json_response({"query": request.query["q"], "results": [
            {"title": f"Result {n}", "url": f"https://r.example/{n}", "content": f"snippet {n}"} for n in range(8)]})


@pytest.fixture(scope="module")
def server() -> Iterator[FakeWeb]:
    with FakeWeb() as running:
        yield running


def with_tools(workspace: Workspace, **tools: Any) -> Workspace:
    config = workspace.config.model_copy(update={"tools": ToolsConfig(**tools)})
    return dataclasses.replace(workspace, config=config)


def call(tools: ToolRegistry, name: str, **arguments: Any) -> str:
    return asyncio.run(tools.execute(name, json.dumps(arguments, ensure_ascii=False)))


def fetcher(workspace: Workspace, *, resolver: dict[str, str | list[str]] | None = None,
            loopback_is_public: bool = False, also_public: tuple[str, ...] = (), **web_config: Any) -> ToolRegistry:
    """A registry with only web_fetch; `resolver` maps host names to one address or several (no real DNS in
    tests). With `loopback_is_public`, 127.0.0.1 and the addresses in `also_public` count as public."""
    names = resolver or {}

    def resolve(host: str) -> list[str]:
        if host not in names:
            raise OSError(f"unknown host {host}")
        answer = names[host]
        return [answer] if isinstance(answer, str) else answer

    stand_ins = {ipaddress.ip_address(address) for address in ("127.0.0.1", *also_public)}

    def allowed(address: IPAddress) -> bool:  # 127.0.0.1 stands in for a public server
        return (loopback_is_public and address in stand_ins) or is_public(address)

    ws = with_tools(workspace, web=WebConfig(**web_config))
    return ToolRegistry([WebFetch(ws, resolver=resolve, allowed=allowed if loopback_is_public else None)])


# -- web_fetch: reading pages ----------------------------------------------------------------------


def test_fetch_extracts_the_main_text(workspace: Workspace, server: FakeWeb) -> None:
    out = call(fetcher(workspace, allow_private=True), "web_fetch", url=f"{server.origin}/article")
    assert out.startswith(f"URL: {server.origin}/article\nStatus: 200\nTitle: Tea notes\n")
    assert "eighty degrees Celsius" in out and "airtight tin" in out
    assert "SCRIPT-CONTENT" not in out and "Login" not in out  # boilerplate and scripts are not main text


def test_fetch_reads_a_chinese_page_by_its_meta_charset(workspace: Workspace, server: FakeWeb) -> None:
    out = call(fetcher(workspace, allow_private=True), "web_fetch", url=f"{server.origin}/zh")
    assert "Title: 龙井茶的冲泡" in out
    assert "龙井是产自杭州的绿茶" in out and "冷藏保存" in out


MIXED = """<!doctype html><html><head><title>茶 &amp; Tea
  notes</title><style>p { color: red }</style><script>var x = "<p>SCRIPT-CONTENT</p>";</script></head><body>
<h1>龙井 Longjing</h1><p>Brew at 80&nbsp;°C &lt;never boiling&gt;.<br>水温八十度&#65292;不要用沸水。</p>
<!-- COMMENT --><ul><li>Three <b>gr</b>ams</li><li>三克<em>茶叶</em></li></ul>
<table><tr><th>泡</th><td>2 min</td></tr></table><noscript>NOSCRIPT</noscript><template><p>TEMPLATE</p></template>
<div>a < b &amp;&amp; c</div><pre>代码 code
  second line</pre></body></html>"""


def test_html_becomes_text_line_by_line_in_chinese_and_english() -> None:
    # Scripts, styles, comments and templates dropped; entities decoded; a block element is a line of its own,
    # an inline tag ("<b>gr</b>ams") splits nothing; a line break in the markup is a space, except in <pre>; a
    # "<" that starts no tag is text.
    assert html_text(MIXED).splitlines() == ["茶 & Tea notes", "龙井 Longjing", "Brew at 80 °C <never boiling>.",
                                             "水温八十度，不要用沸水。", "Three grams", "三克茶叶", "泡 2 min",
                                             "a < b && c", "代码 code", "second line"]
    assert html_title(MIXED) == "茶 & Tea notes"
    assert html_title("<html><body><p>没有标题 no title</p></body></html>") == ""
    assert one_line("<strong>龙井</strong> &amp; <em>green</em>\n tea &#39;s") == "龙井 & green tea 's"


def test_fetch_truncates_long_text(workspace: Workspace, server: FakeWeb) -> None:
    out = call(fetcher(workspace, allow_private=True, max_chars=500, max_bytes=5000), "web_fetch",
               url=f"{server.origin}/big")
    assert out.split("\n\n", 1)[1] == "a" * 500 + "\n[… truncated: 4500 more characters]"


def test_fetch_plain_text_and_refuses_binary(workspace: Workspace, server: FakeWeb) -> None:
    tools = fetcher(workspace, allow_private=True)
    assert call(tools, "web_fetch", url=f"{server.origin}/plain").endswith("\n\njust text")
    assert call(tools, "web_fetch", url=f"{server.origin}/image") == (
        f"error: {server.origin}/image is image/png, not a text or HTML page")


def test_fetch_stops_reading_at_max_bytes(workspace: Workspace, server: FakeWeb) -> None:
    out = call(fetcher(workspace, allow_private=True, max_bytes=1000), "web_fetch", url=f"{server.origin}/big")
    assert "Note: only the first 1000 bytes were read" in out
    assert "END-MARKER" not in out and out.count("a") >= 1000


def test_fetch_gives_up_at_the_time_limit(workspace: Workspace, server: FakeWeb) -> None:
    started = time.monotonic()
    out = call(fetcher(workspace, allow_private=True, timeout=0.5), "web_fetch", url=f"{server.origin}/slow")
    assert out == f"error: timed out after 0.5 s fetching {server.origin}/slow"
    assert time.monotonic() - started < 15  # the time limit ended it, not the page (30 s), on a busy machine too


def test_redirects_are_followed_and_bounded(workspace: Workspace, server: FakeWeb) -> None:
    server.redirect_to = "/article"
    out = call(fetcher(workspace, allow_private=True), "web_fetch", url=f"{server.origin}/hop")
    assert out.startswith(f"URL: {server.origin}/article\n")  # the final URL, after the redirect
    out = call(fetcher(workspace, allow_private=True, max_redirects=3), "web_fetch", url=f"{server.origin}/loop")
    assert out == f"error: more than 3 redirects, stopped at {server.origin}/loop"


# -- web_fetch: the SSRF guard ---------------------------------------------------------------------


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "gopher://127.0.0.1:70/",
                                 "javascript:alert(1)", "example.com/page"])
def test_non_http_schemes_are_refused(workspace: Workspace, url: str) -> None:
    out = call(fetcher(workspace, allow_private=True), "web_fetch", url=url)
    assert out.startswith("error: only http and https URLs can be fetched") or out.startswith("error: not a valid")


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "10.1.2.3", "192.168.1.1", "169.254.169.254", "0.0.0.0",
                                  "[::ffff:127.0.0.1]", "[fe80::1]", "224.0.0.1", "100.64.0.1"])
def test_private_address_literals_are_refused(workspace: Workspace, server: FakeWeb, host: str) -> None:
    before = len(server.requests)
    out = call(fetcher(workspace), "web_fetch", url=f"http://{host}:{server.origin.rsplit(':', 1)[1]}/article")
    assert out.startswith("error: ") and "non-public address" in out and "tools.web.allow_private" in out
    assert len(server.requests) == before  # refused before any connection


def test_a_public_looking_name_that_resolves_to_loopback_is_refused(workspace: Workspace, server: FakeWeb) -> None:
    before = len(server.requests)
    port = server.origin.rsplit(":", 1)[1]
    out = call(fetcher(workspace, resolver={"public.example": "127.0.0.1"}), "web_fetch",
               url=f"http://public.example:{port}/article")
    assert out == ("error: public.example resolves to the non-public address 127.0.0.1; fetching private, "
                   "loopback and link-local addresses is off (tools.web.allow_private)")
    assert len(server.requests) == before


def test_the_checked_address_is_the_one_connected_to(workspace: Workspace, server: FakeWeb) -> None:
    # The test network guard refuses to resolve "public.example": the fetch works only because it connects
    # to the address the resolver gave (pinned), keeping the name in the Host header.
    port = server.origin.rsplit(":", 1)[1]
    tools = fetcher(workspace, resolver={"public.example": "127.0.0.1"}, loopback_is_public=True)
    out = call(tools, "web_fetch", url=f"http://public.example:{port}/host")
    assert out.startswith(f"URL: http://public.example:{port}/host\n")
    assert out.endswith(f"host=public.example:{port}")


def test_each_hop_gets_its_own_connection(workspace: Workspace, server: FakeWeb) -> None:
    # Both names are the same address: a pooled connection of the first hop would match the second one, and
    # over https the second name's certificate would then never be checked.
    port = server.origin.rsplit(":", 1)[1]
    server.redirect_to = f"http://b.example:{port}/host"
    tools = fetcher(workspace, resolver={"a.example": "127.0.0.1", "b.example": "127.0.0.1"},
                    loopback_is_public=True)
    before = len(server.requests)
    out = call(tools, "web_fetch", url=f"http://a.example:{port}/hop")
    assert out.endswith(f"host=b.example:{port}")
    first, second = server.requests[before:]
    assert (first["path"], second["path"]) == ("/hop", "/host")
    assert first["peer"] != second["peer"]  # a new connection (another client port) for the second hop


def test_the_next_checked_address_is_tried_when_one_refuses(workspace: Workspace, server: FakeWeb) -> None:
    # Nothing listens on 127.0.0.2 (the server is bound to 127.0.0.1): the connection is refused there.
    port = server.origin.rsplit(":", 1)[1]
    tools = fetcher(workspace, resolver={"two.example": ["127.0.0.2", "127.0.0.1"],
                                         "dead.example": ["127.0.0.2", "127.0.0.3"]},
                    loopback_is_public=True, also_public=("127.0.0.2", "127.0.0.3"))
    before = len(server.requests)
    out = call(tools, "web_fetch", url=f"http://two.example:{port}/host")
    assert out.startswith(f"URL: http://two.example:{port}/host\n") and out.endswith(f"host=two.example:{port}")
    assert [r["path"] for r in server.requests[before:]] == ["/host"]

    out = call(tools, "web_fetch", url=f"http://dead.example:{port}/host")
    assert out.startswith(f"error: could not fetch http://dead.example:{port}/host: no address of dead.example "
                          "accepted a connection (127.0.0.2: ConnectError: ")
    assert "; 127.0.0.3: ConnectError: " in out


@pytest.mark.parametrize("target", ["http://internal.example:{port}/article", "http://10.0.0.7/admin",
                                    "http://169.254.169.254/latest/meta-data/"])
def test_a_redirect_into_the_private_network_is_refused(workspace: Workspace, server: FakeWeb, target: str) -> None:
    port = server.origin.rsplit(":", 1)[1]
    server.redirect_to = target.format(port=port)
    tools = fetcher(workspace, resolver={"public.example": "127.0.0.1", "internal.example": "127.0.0.2"},
                    loopback_is_public=True)
    before = len(server.requests)
    out = call(tools, "web_fetch", url=f"http://public.example:{port}/hop")
    assert out.startswith("error: ") and "non-public address" in out
    assert [r["path"] for r in server.requests[before:]] == ["/hop"]  # the first hop only


def test_a_redirect_to_a_file_url_is_refused(workspace: Workspace, server: FakeWeb) -> None:
    server.redirect_to = "file:///etc/passwd"
    out = call(fetcher(workspace, allow_private=True), "web_fetch", url=f"{server.origin}/hop")
    assert out.startswith("error: only http and https URLs can be fetched"), out
    assert "root:" not in out


def test_unresolvable_host_is_an_error(workspace: Workspace) -> None:
    out = call(fetcher(workspace), "web_fetch", url="http://nowhere.example/")
    assert out == "error: could not resolve nowhere.example: unknown host nowhere.example"


def test_is_public() -> None:
    assert is_public(ipaddress.ip_address("93.184.216.34"))
    assert is_public(ipaddress.ip_address("2606:4700::1111"))
    for private in ("127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.0.1", "169.254.1.1", "::1", "fc00::1",
                    "::ffff:10.0.0.1", "2002:c0a8:0101::1", "64:ff9b::a00:1", "255.255.255.255", "240.0.0.1"):
        assert not is_public(ipaddress.ip_address(private)), private


def test_web_fetch_is_offered_by_default_and_can_be_turned_off(workspace: Workspace) -> None:
    assert "web_fetch" in build_tools(workspace).tools
    assert "web_fetch" not in build_tools(with_tools(workspace, web=WebConfig(fetch_enabled=False))).tools


# -- web_search ------------------------------------------------------------------------------------


def searcher(workspace: Workspace, **search: Any) -> ToolRegistry:
    tools = build_tools(with_tools(workspace, web=WebConfig(search=WebSearchConfig(**search))))
    assert isinstance(tools.tools["web_search"], WebSearch)
    return tools


def test_web_search_is_absent_when_not_configured(workspace: Workspace) -> None:
    assert "web_search" not in build_tools(with_tools(workspace, web=WebConfig())).tools
    # A new config.json (onboarding's copy of config.example.json) shows a backend, switched off.
    search = workspace.config.tools.web.search
    assert search is not None and not search.enabled
    assert "web_search" not in build_tools(workspace).tools


def test_a_disabled_search_backend_is_not_offered(workspace: Workspace) -> None:
    search = WebSearchConfig(provider="brave", api_key="brave-key", enabled=False)
    assert "web_search" not in build_tools(with_tools(workspace, web=WebConfig(search=search))).tools
    assert WebSearchConfig(provider="brave").enabled  # a backend that is set is on unless said otherwise


def test_brave(workspace: Workspace, server: FakeWeb) -> None:
    tools = searcher(workspace, provider="brave", api_key="brave-key", base_url=server.origin, max_results=2)
    out = call(tools, "web_search", query="longjing tea")
    # Brave marks matches with HTML tags and escapes entities: the model gets plain text.
    assert out == ("1. Longjing - Wikipedia\nhttps://en.wikipedia.org/wiki/Longjing_tea\n"
                   "Longjing is a variety of green tea & China's pride (<b> is a tag; 2 < 3).\n\n"
                   "2. Tea & water\nhttps://tea.example/water\nSoft water is best.")
    sent = server.requests[-1]
    assert sent["path"] == "/res/v1/web/search" and sent["query"] == {"q": "longjing tea", "count": "2"}


def test_brave_key_from_the_environment_and_errors(workspace: Workspace, server: FakeWeb,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tools = searcher(workspace, provider="brave", base_url=server.origin)
    monkeypatch.delenv("BRAVE_API_KEY", raising=False)
    assert call(tools, "web_search", query="x").startswith("error: no API key for brave")
    monkeypatch.setenv("BRAVE_API_KEY", "wrong")
    assert call(tools, "web_search", query="x") == "error: brave search failed: HTTP 401"
    monkeypatch.setenv("BRAVE_API_KEY", "brave-key")
    assert call(tools, "web_search", query="x").startswith("1. Longjing - Wikipedia")


@pytest.mark.parametrize(("provider", "where"), [("brave", "config"), ("brave", "environment"), ("tavily", "config")])
def test_a_key_the_http_library_refuses_is_not_quoted_back(workspace: Workspace, server: FakeWeb,
                                                          monkeypatch: pytest.MonkeyPatch, provider: str,
                                                          where: str) -> None:
    key = "Qk7vX9mL2nPr4tZ8wB3yC6dFhJ\n"  # read from a file, its newline and all: not a valid header value
    if where == "environment":
        monkeypatch.setenv(f"{provider.upper()}_API_KEY", key)
    tools = searcher(workspace, provider=provider, base_url=server.origin, api_key=key if where == "config" else "")
    out = call(tools, "web_search", query="龙井茶 longjing")
    # The library's error quotes the header value: the model sees that it was refused, not the key.
    assert out.startswith(f"error: {provider} search failed: LocalProtocolError: Illegal header value"), out
    secret = key.strip()
    assert [secret[i:i + 4] for i in range(len(secret) - 3) if secret[i:i + 4] in out] == [], out


def test_tavily(workspace: Workspace, server: FakeWeb) -> None:
    tools = searcher(workspace, provider="tavily", api_key="tvly-key", base_url=server.origin)
    out = call(tools, "web_search", query="龙井", count=3)
    assert out == "1. 龙井茶\nhttps://zh.example/longjing\n西湖龙井是绿茶。"
    assert server.requests[-1]["json"] == {"query": "龙井", "max_results": 3}


def test_searxng(workspace: Workspace, server: FakeWeb) -> None:
    tools = searcher(workspace, provider="searxng", base_url=f"{server.origin}/searx/", max_results=3)
    out = call(tools, "web_search", query="tea")
    assert out == ("1. Result 0\nhttps://r.example/0\nsnippet 0\n\n2. Result 1\nhttps://r.example/1\nsnippet 1\n\n"
                   "3. Result 2\nhttps://r.example/2\nsnippet 2")
    assert server.requests[-1]["query"] == {"q": "tea", "format": "json"}


def test_searxng_needs_a_base_url() -> None:
    with pytest.raises(ValueError, match="base_url is required for provider searxng"):
        WebSearchConfig(provider="searxng")
