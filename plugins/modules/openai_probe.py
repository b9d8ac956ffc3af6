#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: probe an OpenAI-compatible inference server (health, models, timed requests)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: openai_probe
short_description: Wait for an OpenAI-compatible server, check the models it serves and time requests against it
description:
  - Waits until the server's health endpoint answers (vLLM's C(/health)), up to a timeout.
  - Reads C(/v1/models) and fails when a model listed in O(expect_models) is not served.
  - Sends classes of requests (C(/v1/completions) or C(/v1/chat/completions)), each a number of identical
    requests sent a given number at a time, and reports latency percentiles, throughput and token counts;
    with O(requests[].stream) also the time to the first streamed chunk.
  - Used after a (re)start to warm a vLLM instance up (a probe, typical requests, a concurrent burst) and by
    drift runs to check a node answers as declared.
  - Read-only, it never changes the server's configuration and never reports C(changed); it runs in check mode.
  - Standard library only on the target (urllib, threads).
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  url:
    description: Base URL of the server, without C(/v1), e.g. C(http://127.0.0.1:8000) or C(https://node.example).
    type: str
    required: true
  api_key:
    description: Bearer token sent as C(Authorization) (vLLM's C(--api-key), or a key of the proxy in front).
    type: str
  validate_certs:
    description: Verify the server's TLS certificate for C(https) URLs.
    type: bool
    default: true
  ca_path:
    description: CA bundle to verify the server's certificate with (default, the system's).
    type: path
  timeout:
    description: Seconds one HTTP request may take.
    type: float
    default: 120
  health_path:
    description: Path polled before anything else; an empty string skips the health check.
    type: str
    default: /health
  health_timeout:
    description: Seconds to keep polling O(health_path) until it answers 2xx; 0 polls once.
    type: float
    default: 0
  health_interval:
    description: Seconds between two health polls.
    type: float
    default: 2
  systemd_unit:
    description:
      - The systemd unit that runs the server. The health wait stops early when the unit is C(failed); with
        C(Restart=always) that means systemd stopped restarting it (a crash loop hit its start limit), so it
        will not answer within any timeout.
    type: str
  expect_models:
    description: Model ids that C(/v1/models) must list (the instance's served model names).
    type: list
    elements: str
    default: []
  model:
    description: Model id the requests use; default, the first of O(expect_models), else the first listed model.
    type: str
  requests:
    description: Classes of requests to send, in order, after the health and model checks.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Name of the class in the results (probe, typical, burst ...).
        type: str
        required: true
      endpoint:
        description: C(completions) (C(/v1/completions)) or C(chat) (C(/v1/chat/completions)).
        type: str
        choices: [completions, chat]
        default: completions
      count:
        description: Number of requests in the class.
        type: int
        default: 1
      concurrency:
        description: How many of them are in flight at once.
        type: int
        default: 1
      prompt:
        description: Prompt text; default, O(requests[].prompt_words) common words.
        type: str
        default: ""
      prompt_words:
        description: Length of the generated prompt in common words (one or two tokens each, depending on the tokenizer) when O(requests[].prompt) is empty.
        type: int
        default: 8
      max_tokens:
        description: Tokens to generate per request.
        type: int
        default: 16
      temperature:
        description: Sampling temperature.
        type: float
        default: 0.0
      stream:
        description: Stream the answer and report the time to the first chunk (C(ttft_s)).
        type: bool
        default: false
      extra_body:
        description: "Further request fields, e.g. vLLM's C({ignore_eos: true}) to always generate O(requests[].max_tokens)."
        type: dict
        default: {}
  fail_on_request_error:
    description: Fail when any request of any class did not succeed (the results are returned either way).
    type: bool
    default: true
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    description: The module only reads; it runs unchanged in check mode.
  diff_mode:
    support: none
notes:
  - The requests generate text, so they load the server; size the classes to the node.
"""

EXAMPLES = r"""
- name: Wait for the instance, check it serves its model and warm it up
  gpufleet.fleet.openai_probe:
    url: http://127.0.0.1:8000
    api_key: "{{ vllm_api_key }}"
    health_timeout: 900
    expect_models: [llama-3-8b]
    requests:
      - {name: probe, max_tokens: 1}
      - {name: typical, count: 4, prompt_words: 200, max_tokens: 256, extra_body: {ignore_eos: true}}
      - {name: burst, count: 16, concurrency: 16, prompt_words: 1500, max_tokens: 128}
  register: warmup

- name: Check a node through its TLS proxy, streaming
  gpufleet.fleet.openai_probe:
    url: https://gpu-07.example.net
    ca_path: /etc/ssl/certs/internal-ca.pem
    api_key: "{{ proxy_api_key }}"
    health_path: ""
    requests:
      - {name: chat, endpoint: chat, stream: true, max_tokens: 32}
"""

RETURN = r"""
health:
  description: Result of the health wait; absent when O(health_path) is empty.
  returned: when health_path is set
  type: dict
  contains:
    ok: {description: Whether the endpoint answered 2xx in time., type: bool}
    status: {description: Last HTTP status (0 when no answer)., type: int}
    waited_s: {description: Seconds spent waiting., type: float}
    attempts: {description: Number of polls., type: int}
    error: {description: Last error when not ok., type: str}
models:
  description: Model ids listed by C(/v1/models).
  returned: when the health check passed or was skipped
  type: list
  elements: str
  sample: [tiny]
missing_models:
  description: Entries of O(expect_models) the server does not list.
  returned: always
  type: list
  elements: str
results:
  description: One entry per request class, in order.
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: The class name., type: str}
    endpoint: {description: completions or chat., type: str}
    count: {description: Requests sent., type: int}
    concurrency: {description: Requests in flight at once., type: int}
    succeeded: {description: Requests answered 2xx., type: int}
    failed: {description: Requests that failed., type: int}
    errors: {description: Distinct error messages (at most 5)., type: list, elements: str}
    latency_s: {description: "min, p50, p90, p99, max, mean of the successful requests' latencies.", type: dict}
    ttft_s: {description: Same figures for the time to the first streamed chunk (stream only)., type: dict}
    wall_s: {description: Seconds from the first request sent to the last answer., type: float}
    requests_per_s: {description: Successful requests per second of wall time., type: float}
    prompt_tokens: {description: Prompt tokens the server counted (usage)., type: int}
    completion_tokens: {description: Generated tokens the server counted (usage)., type: int}
    completion_tokens_per_s: {description: Generated tokens per second of wall time., type: float}
  sample:
    - {name: probe, endpoint: completions, count: 1, concurrency: 1, succeeded: 1, failed: 0, errors: [],
       latency_s: {min: 0.05, p50: 0.05, p90: 0.05, p99: 0.05, max: 0.05, mean: 0.05}, wall_s: 0.05,
       requests_per_s: 20.0, prompt_tokens: 8, completion_tokens: 1, completion_tokens_per_s: 20.0}
"""

from typing import Any, Callable, Dict, List, Optional

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.openai_http import (
    RequestClass,
    Server,
    model_ids,
    run_class,
    wait_for_health,
)

REQUEST_OPTIONS = dict(
    name=dict(type="str", required=True),
    endpoint=dict(type="str", choices=["completions", "chat"], default="completions"),
    count=dict(type="int", default=1),
    concurrency=dict(type="int", default=1),
    prompt=dict(type="str", default=""),
    prompt_words=dict(type="int", default=8),
    max_tokens=dict(type="int", default=16, no_log=False),
    temperature=dict(type="float", default=0.0),
    stream=dict(type="bool", default=False),
    extra_body=dict(type="dict", default={}),
)

ARGUMENT_SPEC = dict(
    url=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    validate_certs=dict(type="bool", default=True),
    ca_path=dict(type="path"),
    timeout=dict(type="float", default=120),
    health_path=dict(type="str", default="/health"),
    health_timeout=dict(type="float", default=0),
    health_interval=dict(type="float", default=2),
    systemd_unit=dict(type="str"),
    expect_models=dict(type="list", elements="str", default=[]),
    model=dict(type="str"),
    requests=dict(type="list", elements="dict", default=[], options=REQUEST_OPTIONS),
    fail_on_request_error=dict(type="bool", default=True),
)


def bad_request_classes(classes: List[Dict[str, Any]]) -> List[str]:
    """Problems in the request classes that would make the numbers meaningless."""
    problems = []
    for spec in classes:
        for key in ("count", "concurrency", "max_tokens"):
            if spec[key] < 1:
                problems.append(f"requests[{spec['name']}].{key} must be at least 1 (got {spec[key]})")
        if not spec["prompt"] and spec["prompt_words"] < 1:
            problems.append(f"requests[{spec['name']}]: give a prompt or prompt_words >= 1")
    return problems


def unit_failed(module: AnsibleModule, unit: Optional[str]) -> Callable[[], str]:
    """A check for wait_for_health: the reason to stop waiting when `unit` is failed, else ''."""

    def check() -> str:
        if not unit:
            return ""
        rc, out, dummy = module.run_command(["systemctl", "show", "--property", "ActiveState", "--value", unit])
        if rc == 0 and out.strip() == "failed":
            return f"{unit} is failed, systemd stopped restarting it"
        return ""

    return check


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    if not params["url"].startswith(("http://", "https://")):
        module.fail_json(msg=f"url must start with http:// or https:// (got {params['url']!r})")
    problems = bad_request_classes(params["requests"])
    if problems:
        module.fail_json(msg="; ".join(problems))
    server = Server(
        params["url"], params["api_key"] or "", params["timeout"], params["ca_path"] or "", params["validate_certs"]
    )
    result: Dict[str, Any] = {"changed": False, "missing_models": [], "results": []}

    if params["health_path"]:
        health = wait_for_health(
            server,
            params["health_path"],
            params["health_timeout"],
            params["health_interval"],
            given_up=unit_failed(module, params["systemd_unit"]),
        )
        result["health"] = health
        if health.get("given_up"):
            module.fail_json(
                msg=f"{server.url(params['health_path'])} did not answer 2xx and will not: "
                f"{health['given_up']} (last: {health['error']})",
                **result,
            )
        if not health["ok"]:
            module.fail_json(
                msg=f"{server.url(params['health_path'])} did not answer 2xx within "
                f"{params['health_timeout']:g} s (last: {health['error']})",
                **result,
            )

    models, reply = model_ids(server)
    result["models"] = models
    if not reply.ok:
        module.fail_json(msg=f"{server.url('/v1/models')} failed: {reply.error}", **result)
    result["missing_models"] = [name for name in params["expect_models"] if name not in models]
    if result["missing_models"]:
        module.fail_json(msg=f"the server lists models {models}; missing {result['missing_models']}", **result)

    model = params["model"] or (params["expect_models"] or models or [""])[0]
    for spec in params["requests"]:
        result["results"].append(run_class(server, RequestClass(**spec), model))
    failed = [entry for entry in result["results"] if entry["failed"]]
    if failed and params["fail_on_request_error"]:
        summary = ", ".join(
            f"{entry['name']}: {entry['failed']}/{entry['count']} failed ({entry['errors'][0]})" for entry in failed
        )
        module.fail_json(msg=f"requests to {params['url']} failed: {summary}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
