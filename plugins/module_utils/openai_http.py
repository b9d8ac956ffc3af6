# -*- coding: utf-8 -*-
"""Talk to an OpenAI-compatible server (vLLM): wait for health, list models, time classes of requests.

Shipped to targets with the openai_probe module, so standard library only.
"""

from __future__ import annotations

import json
import math
import ssl
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Error bodies are cut to this length in messages: enough for the server's reason, never a whole page.
ERROR_EXCERPT = 300
# Common words: a prompt of N of them is N to 2N tokens for most tokenizers.
PROMPT_WORDS = (
    "the model server answers a request with tokens while the fleet keeps every node warm and ready "
    "for long prompts short prompts fast replies and slow replies from one two three four five six"
).split()


@dataclass(frozen=True)
class Server:
    """Where the server is and how to reach it."""

    base_url: str
    api_key: str = ""
    timeout: float = 120.0
    ca_path: str = ""
    validate_certs: bool = True

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")


@dataclass
class Reply:
    """One HTTP exchange. status is 0 when no HTTP answer came (refused, timed out, TLS failure)."""

    status: int
    body: Any
    elapsed: float
    error: str = ""
    first_byte: Optional[float] = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and not self.error


@dataclass
class RequestClass:
    """A class of identical requests: `count` of them, `concurrency` at a time."""

    name: str
    endpoint: str = "completions"
    count: int = 1
    concurrency: int = 1
    prompt: str = ""
    prompt_words: int = 8
    max_tokens: int = 16
    temperature: float = 0.0
    stream: bool = False
    extra_body: Dict[str, Any] = field(default_factory=dict)


def ssl_context(server: Server) -> Optional[ssl.SSLContext]:
    if not server.base_url.startswith("https://"):
        return None
    if not server.validate_certs:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=server.ca_path or None)


def _headers(server: Server, has_body: bool) -> Dict[str, str]:
    headers = {"Accept": "application/json", "User-Agent": "gpufleet-openai-probe"}
    if has_body:
        headers["Content-Type"] = "application/json"
    if server.api_key:
        headers["Authorization"] = "Bearer " + server.api_key
    return headers


def _decode(raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text) if text.strip() else ""
    except ValueError:
        return text


def _excerpt(body: Any) -> str:
    text = body if isinstance(body, str) else json.dumps(body)
    return text[:ERROR_EXCERPT]


def call(server: Server, method: str, path: str, payload: Optional[Dict[str, Any]] = None) -> Reply:
    """One request; never raises for HTTP or network errors, they are reported in the Reply."""
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(
        server.url(path), data=data, method=method, headers=_headers(server, data is not None)
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=server.timeout, context=ssl_context(server)) as response:
            if payload is not None and payload.get("stream"):
                return _read_stream(response, started)
            body = _decode(response.read())
            return Reply(response.status, body, time.monotonic() - started)
    except urllib.error.HTTPError as error:
        body = _decode(error.read())
        excerpt = _excerpt(body)
        message = f"HTTP {error.code}: {excerpt}" if excerpt else f"HTTP {error.code}"
        return Reply(error.code, body, time.monotonic() - started, message)
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return Reply(0, "", time.monotonic() - started, f"{type(error).__name__}: {reason}")


def _read_stream(response: Any, started: float) -> Reply:
    """Reads a server-sent-events answer; the body is the last chunk that carried usage, if any."""
    first_byte = None
    usage_chunk: Any = {}
    for raw_line in response:
        line = raw_line.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if first_byte is None:
            first_byte = time.monotonic() - started
        if data == "[DONE]":
            break
        chunk = _decode(data.encode())
        if isinstance(chunk, dict) and chunk.get("usage"):
            usage_chunk = chunk
    return Reply(response.status, usage_chunk, time.monotonic() - started, first_byte=first_byte)


def never_gives_up() -> str:
    return ""


def wait_for_health(
    server: Server,
    path: str,
    timeout: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    given_up: Callable[[], str] = never_gives_up,
) -> Dict[str, Any]:
    """Polls `path` until it answers 2xx or `timeout` seconds pass (0: one attempt); stops early when `given_up`
    names a reason the server will not answer (its service manager stopped restarting it)."""
    started = clock()
    attempts = 0
    while True:
        attempts += 1
        reply = call(server, "GET", path)
        waited = round(clock() - started, 3)
        if reply.ok:
            return {"ok": True, "status": reply.status, "waited_s": waited, "attempts": attempts, "error": ""}
        reason = given_up()
        if reason or clock() - started + interval > timeout:
            return {
                "ok": False,
                "status": reply.status,
                "waited_s": waited,
                "attempts": attempts,
                "error": reply.error or f"HTTP {reply.status}",
                "given_up": reason,
            }
        sleep(interval)


def model_ids(server: Server) -> Tuple[List[str], Reply]:
    """The ids /v1/models lists, and the reply (for its error when it failed)."""
    reply = call(server, "GET", "/v1/models")
    if not reply.ok or not isinstance(reply.body, dict):
        return [], reply
    return [str(entry.get("id")) for entry in reply.body.get("data", []) if isinstance(entry, dict)], reply


def make_prompt(words: int, index: int) -> str:
    """A prompt of `words` common words; `index` shifts it so concurrent requests are not identical."""
    return " ".join(PROMPT_WORDS[(index + position) % len(PROMPT_WORDS)] for position in range(words))


def build_payload(spec: RequestClass, model: str, index: int) -> Dict[str, Any]:
    text = spec.prompt or make_prompt(spec.prompt_words, index)
    payload: Dict[str, Any] = {"model": model, "max_tokens": spec.max_tokens, "temperature": spec.temperature}
    if spec.endpoint == "chat":
        payload["messages"] = [{"role": "user", "content": text}]
    else:
        payload["prompt"] = text
    if spec.stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    payload.update(spec.extra_body)
    return payload


def percentile(sorted_values: List[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (fraction in 0..1)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_summary(values: List[float]) -> Dict[str, float]:
    """min, p50, p90, p99, max and mean in seconds, rounded to the millisecond."""
    ordered = sorted(values)
    if not ordered:
        return {}
    summary = {
        "min": ordered[0],
        "p50": percentile(ordered, 0.5),
        "p90": percentile(ordered, 0.9),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1],
        "mean": sum(ordered) / len(ordered),
    }
    return {key: round(value, 4) for key, value in summary.items()}


def _usage(reply: Reply, key: str) -> int:
    usage = reply.body.get("usage") if isinstance(reply.body, dict) else None
    return int((usage or {}).get(key) or 0)


def run_class(server: Server, spec: RequestClass, model: str) -> Dict[str, Any]:
    """Sends the class's requests, `concurrency` at a time; returns counts, latencies and throughput."""
    path = ENDPOINTS[spec.endpoint]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, spec.concurrency)) as pool:
        replies = list(pool.map(lambda i: call(server, "POST", path, build_payload(spec, model, i)), range(spec.count)))
    wall = time.monotonic() - started
    good = [reply for reply in replies if reply.ok]
    completion_tokens = sum(_usage(reply, "completion_tokens") for reply in good)
    result: Dict[str, Any] = {
        "name": spec.name,
        "endpoint": spec.endpoint,
        "count": spec.count,
        "concurrency": spec.concurrency,
        "succeeded": len(good),
        "failed": len(replies) - len(good),
        "errors": sorted({reply.error for reply in replies if not reply.ok})[:5],
        "latency_s": latency_summary([reply.elapsed for reply in good]),
        "wall_s": round(wall, 4),
        "requests_per_s": round(len(good) / wall, 3) if wall > 0 else 0.0,
        "prompt_tokens": sum(_usage(reply, "prompt_tokens") for reply in good),
        "completion_tokens": completion_tokens,
        "completion_tokens_per_s": round(completion_tokens / wall, 2) if wall > 0 else 0.0,
    }
    if spec.stream:
        result["ttft_s"] = latency_summary([r.first_byte for r in good if r.first_byte is not None])
    return result
