# -*- coding: utf-8 -*-
"""Filter url_without_credentials: a URL as it may be recorded (a node's marker, a message): without the user
and password before the host, and without the query and fragment, where presigned URLs carry their signature."""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.urls import url_without_credentials

DOCUMENTATION = r"""
name: url_without_credentials
short_description: A URL without its credentials, query and fragment
description:
  - "C(https://user:secret@mirror/m.tar.gz?X-Amz-Signature=...) becomes C(https://mirror/m.tar.gz). Anything that
    is not a URL with a scheme (a path) is returned as it is."
options:
  _input:
    description: The URL or path.
    type: str
    required: true
"""

EXAMPLES = r"""
source: "{{ model.url | gpufleet.fleet.url_without_credentials }}"
"""

RETURN = r"""
_value:
  description: The URL without user information, query and fragment.
  type: str
"""


class FilterModule(object):
    def filters(self):
        return {"url_without_credentials": url_without_credentials}
