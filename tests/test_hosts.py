"""hosts: the one rule for whether an endpoint is on this machine or its network, or on the internet."""

from __future__ import annotations

import pytest

from picoclaw.hosts import host_of, is_internet_name, is_local_host


@pytest.mark.parametrize("url", [
    "http://localhost:11434/v1", "http://LOCALHOST./v1", "http://box.localhost/v1", "http://127.0.0.1:8080/v1",
    "http://127.8.9.10/v1", "http://[::1]:8000/v1", "http://0.0.0.0:8080/v1", "http://10.0.0.5:8000/v1",
    "http://172.16.3.4/v1", "http://192.168.1.20:1234/v1", "http://169.254.1.1/v1", "http://[fd00::7]/v1",
    "http://[fe80::1%25eth0]:8080/v1",
    "http://100.64.0.1/v1", "http://100.101.102.103:8080/v1", "http://100.127.255.254/v1",  # Tailscale's range
    "http://gpu-box:8000/v1", "http://GPU-BOX./v1", "http://llama.local:8080/v1", "http://nas.lan/v1",
    "http://vllm.svc.internal/v1", "http://box.home.arpa/v1", "http://gpu.tail1234.ts.net/v1",
    "http://服务器:8000/v1",  # a single-label name in Chinese
])
def test_this_machine_and_its_network_are_local(url: str) -> None:
    assert is_local_host(url) is True
    assert is_internet_name(url) is False


@pytest.mark.parametrize(("url", "name"), [
    ("https://api.openai.com/v1", True), ("https://llm.example.com/v1", True), ("http://模型.中国/v1", True),
    ("http://8.8.8.8:8000/v1", False), ("http://100.128.0.1/v1", False), ("http://[2001:4860::8888]/v1", False),
])
def test_the_internet_is_not_local(url: str, name: bool) -> None:
    assert is_local_host(url) is False
    assert is_internet_name(url) is name  # an IP address is on the internet, but not a name there


@pytest.mark.parametrize("url", ["", "not a url", "http://", "http://[::1/v1", "/v1/models"])
def test_no_host_is_neither(url: str) -> None:
    assert host_of(url) == ""
    assert is_local_host(url) is False
    assert is_internet_name(url) is False
