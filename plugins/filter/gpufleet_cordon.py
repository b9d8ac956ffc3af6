# -*- coding: utf-8 -*-
"""Filter cordon_record: what a node's cordon file says — the one reader of it (inference_proxy's cordon_state,
which upgrade, rebuild and drift use), as nginx sees it: any file there is a cordon."""

from __future__ import annotations

import json

DOCUMENTATION = r"""
name: cordon_record
short_description: The cordon a node's cordon file records
description:
  - "gpufleet writes the file as JSON C({reason, since}). nginx answers 503 whenever the file exists, so a file
    that is empty, not JSON, or without a reason (made by hand) is a cordon too, with reason C(unknown)."
options:
  _input:
    description: The file's text.
    type: str
    required: true
"""

EXAMPLES = r"""
inference_proxy_cordon: "{{ cordon_file.content | b64decode | gpufleet.fleet.cordon_record }}"
"""

RETURN = r"""
_value:
  description: "C({reason, since}), each a string."
  type: dict
"""

UNKNOWN = "unknown (the cordon file was not written by gpufleet cordon)"


def cordon_record(text: str) -> dict:
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not str(record.get("reason") or "").strip():
        return {
            "reason": UNKNOWN,
            "since": str(record.get("since", "unknown")) if isinstance(record, dict) else "unknown",
        }
    return {"reason": str(record["reason"]), "since": str(record.get("since") or "unknown")}


class FilterModule(object):
    def filters(self):
        return {"cordon_record": cordon_record}
