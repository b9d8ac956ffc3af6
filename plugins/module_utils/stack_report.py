# -*- coding: utf-8 -*-
"""The report every stack check returns: {schema, compatible, errors, warnings, facts}, each fact with its source.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

REPORT_SCHEMA = "gpufleet.stack-report/v1"


class Report(object):
    """Collects errors, warnings and the facts (with sources) that a check used."""

    def __init__(self):
        self.errors = []
        self.warnings = []
        self.facts = []
        self._fact_ids = set()

    def error(self, link: str, message: str) -> None:
        self.errors.append({"link": link, "message": message})

    def warn(self, link: str, message: str) -> None:
        entry = {"link": link, "message": message}
        if entry not in self.warnings:
            self.warnings.append(entry)

    def fact(self, fact_id: str, statement: str, source: str) -> None:
        if fact_id in self._fact_ids:
            return
        self._fact_ids.add(fact_id)
        self.facts.append({"id": fact_id, "statement": statement, "source": source or "unverified"})

    def as_dict(self, extra=None) -> dict:
        result = {
            "schema": REPORT_SCHEMA,
            "compatible": not self.errors,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "facts": list(self.facts),
        }
        result.update(extra or {})
        return result
