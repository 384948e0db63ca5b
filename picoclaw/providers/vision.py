"""Whether the chat model can see images: agents.defaults.vision when it says true or false; with "auto",
what the server says (llama.cpp's `/props` lists `modalities.vision`), else the model's name (a known vision
model). Asked once per provider; never raises: a server that cannot be asked is judged by the name."""

from __future__ import annotations

import logging
import re

from picoclaw.hosts import is_local_host
from picoclaw.providers.context_window import server_root

log = logging.getLogger(__name__)

PROBE_SECONDS = 5.0
# Model names that see images: OpenAI's 4o/4.1/5 and o-series, Claude 3+, Gemini, and the open vision models.
_VISION_NAME = re.compile(
    r"gpt-4o|gpt-4\.1|gpt-4-turbo|gpt-4-vision|gpt-5|(?:^|/)o[134](?:-|$)|claude-3|claude-(?:sonnet|opus|haiku)-4"
    r"|gemini|llava|bakllava|[-_.:]vl\b|[-_]vl[-_:]|vision|pixtral|minicpm-v|moondream|gemma-?3|internvl"
    r"|glm-4v|llama-?4|mistral-small-3\.[12]|qwen2?\.?5?-?omni", re.IGNORECASE)


def named_for_vision(model: str) -> bool:
    """Whether `model` is a name of a model known to see images."""
    return _VISION_NAME.search(model) is not None


async def server_sees_images(api_base: str, api_key: str) -> bool | None:
    """llama.cpp's word on it (`/props` → `modalities.vision`); None when the server does not say."""
    import httpx2  # here, not at import: most commands never ask

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx2.AsyncClient(timeout=PROBE_SECONDS, headers=headers, follow_redirects=False,
                                      trust_env=not is_local_host(api_base)) as client:
            response = await client.get(f"{server_root(api_base)}/props")
        if response.status_code != 200:
            return None
        data = response.json()
    except Exception as exc:  # any failure to ask is no answer: the name decides
        log.debug("vision probe of %s: %s", api_base, exc)
        return None
    modalities = data.get("modalities") if isinstance(data, dict) else None
    vision = modalities.get("vision") if isinstance(modalities, dict) else None
    return vision if isinstance(vision, bool) else None
