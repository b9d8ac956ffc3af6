# -*- coding: utf-8 -*-
"""The attributes every gpufleet module documents, described once; each module says how far it supports them."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and report what it would change without changing the node.
  diff_mode:
    description: Returns what changed (or would change, in check mode) when run with C(--diff).
  platform:
    description: The systems the module can run on.
    support: full
    platforms: posix
"""
