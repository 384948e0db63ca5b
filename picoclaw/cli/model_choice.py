"""The questions `picoclaw onboard` asks on a terminal: which model to use (a local server found on this machine
first, then the hosted APIs), its key (read without echo), one check that it answers, and the choice as it goes
into config.json. The terminal is a Prompter, so tests drive the same questions with scripted answers."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from picoclaw.cli import model_probe
from picoclaw.cli.model_probe import Check, FoundServer, LocalServer, check_endpoint, find_local_servers
from picoclaw.cli.output import echo
from picoclaw.config import provider_env_name
from picoclaw.printable import printable

# Hosted APIs offered by name, with the model a new user starts on.
HOSTED: dict[str, tuple[str, str]] = {"openai": ("OpenAI", "gpt-4o-mini"), "deepseek": ("DeepSeek", "deepseek-chat")}
# What a local server's entry gets: it ignores the key but the client needs one, and a CPU needs patience
# (docs/models.md, "Choosing the model"): no retry piled on a request it is still working on.
LOCAL_KEYS = {"ollama": "ollama", "llamacpp": "sk-local", "lmstudio": "lm-studio"}
LOCAL_SETTINGS: dict[str, Any] = {"timeout": 600, "max_retries": 0}
MODELS_SHOWN = 5  # per local server; more would bury the hosted choices
YES = frozenset({"y", "yes", "是", "是的", "好", "对"})


class Prompter(Protocol):
    """Where the questions go: a terminal, or a test's script. `ask` and `secret` raise EOFError on Ctrl-D
    and KeyboardInterrupt on Ctrl-C."""

    def say(self, text: str = "") -> None: ...

    def ask(self, question: str) -> str: ...

    def secret(self, question: str) -> str: ...


class TerminalPrompter:
    """This terminal: text freed of escape sequences (model names come from a server), keys read without echo."""

    def say(self, text: str = "") -> None:
        echo(text)

    def ask(self, question: str) -> str:
        return input(printable(question))

    def secret(self, question: str) -> str:
        return getpass.getpass(printable(question))  # never echoed, never in a log


@dataclass(frozen=True)
class Option:
    """One line of the menu: a provider entry and a model."""

    label: str
    name: str  # the server or API as people call it: "Ollama", "OpenAI"
    provider: str
    model: str
    api_base: str
    settings: Mapping[str, Any] = field(default_factory=dict)  # written into providers.NAME
    needs_key: bool = False


@dataclass(frozen=True)
class ModelChoice:
    """What the user chose, as it goes into config.json; `problem` is the failed check they kept it despite."""

    provider: str
    model: str
    api_base: str
    settings: Mapping[str, Any]  # the providers.NAME keys to set (api_key only when one was typed)
    key_source: str  # "typed", "the environment (NAME_API_KEY)", "config.json", "none needed"
    problem: str = ""


Checker = Callable[[str, str, str], Check]


def needs_a_choice(data: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> bool:
    """Whether config.json's provider lacks a key (in its entry and in NAME_API_KEY): only then is an existing
    config offered the questions, so a choice already made is never asked again."""
    env = os.environ if environ is None else environ
    provider = str(_dig(data, "agents", "defaults", "provider") or "openai")
    entry = _dig(data, "providers", provider)
    key = entry.get("api_key") if isinstance(entry, dict) else None
    return not (isinstance(key, str) and key) and not env.get(provider_env_name(provider, "API_KEY"))


def choose_model(data: Mapping[str, Any], prompter: Prompter, *, servers: Sequence[LocalServer] | None = None,
                 find: Callable[[Sequence[LocalServer]], list[FoundServer]] = find_local_servers,
                 check: Checker = check_endpoint, environ: Mapping[str, str] | None = None) -> ModelChoice | None:
    """Ask which model to use until a choice passes the check or is kept anyway; None: skipped (config as it is).
    `data` is config.json's content (or the example's, for a new one)."""
    env = os.environ if environ is None else environ
    wanted = model_probe.LOCAL_SERVERS if servers is None else tuple(servers)  # looked up now: tests replace it
    prompter.say("picoclaw needs a language model. Looking for a model server on this machine …")
    found = find(wanted)
    for line in _found_lines(found, wanted):
        prompter.say(line)
    options = _options(data, found, env)
    current = (f"{_dig(data, 'agents', 'defaults', 'provider') or 'openai'}, "
               f"{_dig(data, 'agents', 'defaults', 'model') or HOSTED['openai'][1]}")
    while True:
        prompter.say("")
        prompter.say("Which model should picoclaw use?")
        for number, option in enumerate(options, 1):
            prompter.say(f"  {number}) {option.label}")
        prompter.say(f"  {len(options) + 1}) skip: keep {current} (a key or a server can go into config.json later)")
        picked = _pick(prompter, len(options) + 1)
        if picked == len(options):
            return None
        choice = _settle(options[picked], data, prompter, check, env)
        if choice is not None:
            return choice


def apply_choice(data: dict[str, Any], choice: ModelChoice) -> dict[str, Any]:
    """config.json's content with `choice` in it: agents.defaults.provider and .model, and its providers entry
    (other settings of that entry, and everything else, as they were)."""
    defaults = data.setdefault("agents", {}).setdefault("defaults", {})
    defaults["provider"], defaults["model"] = choice.provider, choice.model
    providers = data.setdefault("providers", {})
    entry = providers.get(choice.provider)
    providers[choice.provider] = {**(entry if isinstance(entry, dict) else {}), **choice.settings}
    return data


# -- the steps -------------------------------------------------------------------------------------------


def _found_lines(found: list[FoundServer], looked: Sequence[LocalServer]) -> list[str]:
    if not found:
        where = ", ".join(f"{server.label} on port {server.port}" for server in looked)
        return [f"No model server answers on this machine (looked for {where})." if looked else
                "No model server answers on this machine."]
    lines = []
    for each in found:
        if each.models:
            count = len(each.models)
            lines.append(f"Found {each.server.label} at {each.api_base} ({count} model{'s' if count != 1 else ''}).")
        else:
            hint = " (e.g. `ollama pull qwen2.5:7b`)" if each.server.provider == "ollama" else ""
            lines.append(f"Found {each.server.label} at {each.api_base}, but it offers no model yet{hint}.")
    return lines


def _options(data: Mapping[str, Any], found: list[FoundServer], env: Mapping[str, str]) -> list[Option]:
    options = []
    for each in found:
        # Embedding models cannot chat: listed after the others, when there are others.
        models = sorted(each.models, key=lambda name: "embed" in name.lower())[:MODELS_SHOWN]
        for model in models:
            key = _entry_key(data, each.server.provider) or LOCAL_KEYS.get(each.server.provider, "local")
            options.append(Option(f"{model} on {each.server.label} (this machine, no key needed)", each.server.label,
                                  each.server.provider, model, each.api_base,
                                  {"api_key": key, "api_base": each.api_base, **LOCAL_SETTINGS}))
    configured = str(_dig(data, "agents", "defaults", "provider") or "openai")
    hosted = [configured] if configured not in LOCAL_KEYS else []
    hosted += [name for name in HOSTED if name not in hosted]
    for name in hosted:
        label, model = HOSTED.get(name, (name, ""))
        if name == configured:
            model = str(_dig(data, "agents", "defaults", "model") or model)
        entry = _dig(data, "providers", name)
        api_base = (str(entry.get("api_base") or "") if isinstance(entry, dict) else "") or env.get(
            provider_env_name(name, "API_BASE"), "")
        if model and api_base:
            options.append(Option(f"{model} on {label} (needs an API key)", label, name, model, api_base,
                                  needs_key=True))
    return options


def _pick(prompter: Prompter, count: int) -> int:
    """The index of the option the user picks (Enter: the first); asks again after anything else."""
    while True:
        answer = prompter.ask(f"Choose 1-{count} [1]: ").strip()
        if not answer:
            return 0
        try:
            number = int(answer)  # takes full-width digits too ("２"), as a Chinese input method types them
        except ValueError:
            number = 0
        if 1 <= number <= count:
            return number - 1
        prompter.say(f"Please answer with a number from 1 to {count}.")


def _settle(option: Option, data: Mapping[str, Any], prompter: Prompter, check: Checker,
            env: Mapping[str, str]) -> ModelChoice | None:
    """The key for `option` (when it needs one), the check, and what the user makes of a failed check.
    None: back to the menu."""
    settings = dict(option.settings)
    key, source = str(settings.get("api_key") or ""), "none needed"
    if option.needs_key:
        found = _key(option, data, prompter, env)
        if found is None:
            return None
        key, source = found
        if source == "typed":
            settings["api_key"] = key
    prompter.say(f"Checking {option.model} at {option.api_base} …")
    result = check(option.api_base, key, option.model)
    if result.ok:
        prompter.say(f"OK: {option.api_base} answered and offers {option.model}.")
        problem = ""
    else:
        prompter.say(f"That did not work: {result.problem}.")
        if prompter.ask("Keep this choice anyway? [y/N] ").strip().lower() not in YES:
            prompter.say("Then choose again.")
            return None
        problem = result.problem
    return ModelChoice(option.provider, option.model, option.api_base, settings, source, problem)


def _key(option: Option, data: Mapping[str, Any], prompter: Prompter,
         env: Mapping[str, str]) -> tuple[str, str] | None:
    """(key, where it came from) for a hosted option, or None (back to the menu)."""
    variable = provider_env_name(option.provider, "API_KEY")
    kept = _entry_key(data, option.provider)
    fallback = ((kept, "config.json") if kept else (env[variable], f"the environment ({variable})")
                if env.get(variable) else None)
    where = ("config.json's key" if kept else variable) if fallback else ""
    while True:
        question = f"API key for {option.name} (not shown as you type"
        question += f"; Enter keeps {where}): " if fallback else "): "
        typed = prompter.secret(question).strip()
        if not typed:
            if fallback is not None:
                return fallback
            prompter.say(f"No key given; {option.provider} cannot be used without one.")
            return None
        if typed.isascii() and typed.isprintable() and " " not in typed:
            return typed, "typed"
        prompter.say("That is not an API key (one word of letters, digits and punctuation); try again.")


def _entry_key(data: Mapping[str, Any], provider: str) -> str:
    entry = _dig(data, "providers", provider)
    key = entry.get("api_key") if isinstance(entry, dict) else None
    return key if isinstance(key, str) else ""


def _dig(data: Mapping[str, Any], *keys: str) -> Any:
    value: Any = data
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value
