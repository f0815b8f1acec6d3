"""The agent's one way out: an OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp's
server, Ollama, hosted APIs), or answers a person pasted, or the response cache.

Settings come from the environment (or the caller): FACT_AGENT_URL (base URL, ".../v1"),
FACT_AGENT_MODEL, FACT_AGENT_KEY (sent as a bearer token, never written anywhere),
FACT_AGENT_JSON_SCHEMA=1 where the server takes `response_format` with a JSON schema.

Modes:
  off     no request is made (the default everywhere in FACT)
  replay  answers come from the response cache only; a miss is an AgentError, not a request
  record  requests go out; every exchange is also written as a transcript file (tests replay them)
  live    requests go out; answers are cached

Every request is checked against the budget first (calls, tokens, wall time). A transport
fault (HTTP error, timeout, a truncated or non-JSON answer) is an AgentError naming it; the
caller falls back to the catalog.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fact.errors import FactError

MODES = ("off", "replay", "record", "live")


class AgentError(FactError):
    """The agent could not get an answer (no endpoint, a transport fault, the budget)."""


class BudgetExhausted(AgentError):
    """A cap on calls, tokens or wall time was reached before a request."""


@dataclass
class Settings:
    url: str = ""
    model: str = ""
    key: str = field(default="", repr=False)
    json_schema: bool = False
    timeout_s: float = 60.0
    temperature: float = 0.0
    max_tokens: int = 2048

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        s = cls(
            url=os.environ.get("FACT_AGENT_URL", ""),
            model=os.environ.get("FACT_AGENT_MODEL", ""),
            key=os.environ.get("FACT_AGENT_KEY", ""),
            json_schema=os.environ.get("FACT_AGENT_JSON_SCHEMA", "") == "1",
        )
        for k, v in overrides.items():
            if v is not None:
                setattr(s, k, v)
        return s

    def public(self) -> dict[str, Any]:
        """What provenance records: never the key."""
        from urllib.parse import urlparse

        return {
            "model": self.model,
            "endpoint_host": urlparse(self.url).hostname or "",
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }


@dataclass
class Budget:
    max_calls: int = 8
    max_tokens: int = 50_000
    max_seconds: float = 600.0
    calls: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)

    def check(self) -> None:
        if self.calls >= self.max_calls:
            raise BudgetExhausted(f"the budget of {self.max_calls} calls is spent")
        if self.tokens >= self.max_tokens:
            raise BudgetExhausted(f"the budget of {self.max_tokens} tokens is spent")
        if time.monotonic() - self.started >= self.max_seconds:
            raise BudgetExhausted(f"the budget of {self.max_seconds:.0f} s is spent")


def digest(settings: Settings, messages: Sequence[Mapping[str, str]], template: str) -> str:
    """The response cache's key: model, messages, sampling settings and prompt template."""
    text = json.dumps(
        {"settings": settings.public(), "messages": list(messages), "template": template},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()


class Client:
    def __init__(
        self,
        settings: Settings,
        mode: str,
        cache_dir: Path,
        budget: Budget,
        log: Callable[[str], None] = lambda line: None,
        transcripts: Path | None = None,
    ):
        if mode not in MODES:
            raise AgentError(f"agent mode {mode!r}: one of {', '.join(MODES)}")
        if mode in ("record", "live") and not (settings.url and settings.model):
            raise AgentError(
                "no endpoint: set FACT_AGENT_URL (an OpenAI-compatible base URL, e.g. "
                "http://localhost:8000/v1) and FACT_AGENT_MODEL, or use --answers FILE"
            )
        self.settings, self.mode, self.budget, self.log = settings, mode, budget, log
        self.cache_dir, self.transcripts = cache_dir, transcripts

    def complete(
        self, messages: Sequence[Mapping[str, str]], template: str, schema: Mapping | None = None
    ) -> str:
        """The assistant's text for `messages`."""
        key = digest(self.settings, messages, template)
        cached = self.cache_dir / f"{key}.json"
        if self.mode == "off":
            raise AgentError("the agent is off")
        if cached.is_file():
            self.log(f"answer from the response cache ({key[:12]})")
            return json.loads(cached.read_text())["content"]
        if self.mode == "replay":
            raise AgentError(f"replay: no cached answer for this request ({key[:12]})")
        self.budget.check()
        self.budget.calls += 1
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": list(messages),
            "temperature": self.settings.temperature,
            "max_tokens": self.settings.max_tokens,
        }
        if schema is not None and self.settings.json_schema:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "proposal", "schema": schema},
            }
        reply = self._post(body)
        try:
            content = reply["choices"][0]["message"]["content"]
            if not isinstance(content, str):
                raise TypeError("content is not text")
        except (KeyError, IndexError, TypeError) as exc:
            raise AgentError(f"the endpoint's answer has no message ({exc})") from None
        usage = reply.get("usage") or {}
        self.budget.tokens += int(usage.get("total_tokens") or (len(content) // 4 + 1))
        if reply["choices"][0].get("finish_reason") == "length":
            raise AgentError("the answer was cut off (finish_reason length)")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps({"content": content, "template": template}))
        if self.transcripts is not None:
            self.transcripts.mkdir(parents=True, exist_ok=True)
            record = {"request": body, "response": reply}
            (self.transcripts / f"{key[:16]}.json").write_text(json.dumps(record, indent=1))
        return content

    def _post(self, body: Mapping[str, Any]) -> dict[str, Any]:
        url = self.settings.url.rstrip("/") + "/chat/completions"
        headers = {"Content-Type": "application/json"}
        if self.settings.key:
            headers["Authorization"] = f"Bearer {self.settings.key}"
        request = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        self.log(f"request {self.budget.calls} to {self.settings.public()['endpoint_host']}")
        try:
            with _NO_REDIRECTS.open(request, timeout=self.settings.timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as exc:
            raise AgentError(f"the endpoint answered HTTP {exc.code} ({exc.reason})") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AgentError(f"the endpoint could not be reached ({reason})") from None
        try:
            reply = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise AgentError(
                f"the endpoint's answer is not JSON ({len(raw)} bytes: {raw[:60]!r})"
            ) from None
        if not isinstance(reply, dict):
            raise AgentError("the endpoint's answer is not a JSON object")
        return reply


class _Refuse(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: following it would send the key to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl}", headers, fp)


_NO_REDIRECTS = urllib.request.build_opener(_Refuse)


class Answers:
    """Answers a person pasted from any chat model: {"<op>": "<the model's answer>"}, read
    from a JSON file; used instead of the endpoint, through the same parsing and gates."""

    def __init__(self, path: Path):
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise AgentError(f"answers file {path} cannot be read ({exc})") from None
        if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
            raise AgentError(f"answers file {path}: a JSON object of op name -> answer text")
        self.by_op: dict[str, str] = doc

    def complete(self, op: str) -> str:
        if op not in self.by_op:
            raise AgentError(f"the answers file has no answer for {op}")
        return self.by_op[op]
