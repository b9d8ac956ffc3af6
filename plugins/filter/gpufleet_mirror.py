# -*- coding: utf-8 -*-
"""Filter mirror_models: what `gpufleet mirror sync` reads of each model_store_models entry (playbooks/preflight.yml
records it per host): where its tarball comes from and which Hugging Face revision it is packed from, with no
credentials (the result goes into the run's job events) and nothing else of the declaration."""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.urls import url_without_credentials

DOCUMENTATION = r"""
name: mirror_models
short_description: The fields of each declared model that mirror sync packs its tarball from
description:
  - "Each mapping of O(_input) becomes C({name, sha256, source, url, hf_repo, hf_revision, strip_components}):
    C(source) is which of C(url), C(path) or C(shared_path) the model declares (C('') for none or several), C(url)
    is without user information, query and fragment. Anything that is not a mapping is left out (the role's own
    preflight names it)."
options:
  _input:
    description: model_store_models.
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
models: "{{ model_store_models | default([]) | gpufleet.fleet.mirror_models }}"
"""

RETURN = r"""
_value:
  description: One mapping per declared model.
  type: list
  elements: dict
"""

SOURCES = ("url", "path", "shared_path")


def mirror_model(model: dict) -> dict:
    sources = [key for key in SOURCES if key in model]
    return {
        "name": str(model.get("name", "")),
        "sha256": str(model.get("sha256", "")).lower(),
        "source": sources[0] if len(sources) == 1 else "",
        "url": url_without_credentials(model["url"]) if "url" in model else "",
        "hf_repo": str(model.get("hf_repo", "")),
        "hf_revision": str(model.get("hf_revision", "")).lower(),
        "strip_components": str(model.get("strip_components", 0)),
    }


def mirror_models(models: list) -> list:
    return [mirror_model(model) for model in models or [] if isinstance(model, dict)]


class FilterModule(object):
    def filters(self):
        return {"mirror_models": mirror_models}
