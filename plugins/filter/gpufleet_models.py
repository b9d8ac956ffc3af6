# -*- coding: utf-8 -*-
"""Filter model_version_dir: where model_store stages one version of a model — the one place the naming
rule lives (the role, the drift layer and rebuild use it); model_versions_to_prune: which staged versions the
role's prune removes."""

from __future__ import annotations

DOCUMENTATION = r"""
name: model_version_dir
short_description: The directory model_store stages a model's version in
description:
  - "C(<root>/<name>-<the first 16 hex digits of its sha256>): a new sha256 is a new directory, and the link
    C(<root>/<name>) is switched to it once it is complete."
positional: root
options:
  _input:
    description: The model, a dict with C(name) and C(sha256).
    type: dict
    required: true
  root:
    description: The model root (model_store_root).
    type: path
    required: true
"""

EXAMPLES = r"""
version_dir: "{{ model_store_model | model_version_dir(model_store_root) }}"
"""

RETURN = r"""
_value:
  description: The version directory.
  type: path
"""


def model_version_dir(model: dict, root: str) -> str:
    return "%s/%s-%s" % (str(root).rstrip("/"), model["name"], str(model["sha256"]).lower()[:16])


def model_version_dirs(models: list, root: str) -> dict:
    """name -> version directory for every model."""
    return dict((str(model["name"]), model_version_dir(model, root)) for model in models)


def model_versions_to_prune(versions: list, keep: int, in_service: list, protected: list) -> list:
    """The version directories to remove, given find's results for one model (path, mtime).

    Never removed: the versions in service (now, and before this run: the one a failed upgrade's rollback points
    back at) and every version an upgrade's snapshot names (`protected`). Of the others, the newest are kept until
    `keep` versions in all remain (the one in service counts); 0 keeps everything.
    """
    if keep <= 0:
        return []
    kept = [path for path in in_service if path]
    others = sorted(
        (item for item in versions if item["path"] not in kept and item["path"] not in protected),
        key=lambda item: item["mtime"],
        reverse=True,
    )
    room = max(keep - len(set(kept)), 0)
    return [item["path"] for item in others[room:]]


class FilterModule(object):
    def filters(self):
        return {
            "model_version_dir": model_version_dir,
            "model_version_dirs": model_version_dirs,
            "model_versions_to_prune": model_versions_to_prune,
        }
