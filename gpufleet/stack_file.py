"""Reading a stack file (`gpufleet plan --stack FILE`) as untrusted input.

A stack file describes one node in a dozen lines. Anything far from that shape is refused with one clear
StackFileError before it can cost time or memory: the size is capped before parsing, the YAML event stream
(PyYAML's parser is iterative) is checked for depth, node count, scalar length and anchors before the
recursive composer builds anything, duplicate keys are refused instead of silently taking the last, and the
result goes through the one validator (stack_spec.normalize_stack), whose version patterns are ASCII only.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from gpufleet import compat
from gpufleet.errors import GpufleetError

MAX_BYTES = 64 * 1024
MAX_DEPTH = 8
MAX_NODES = 2000
# The longest value a stack holds is a GPU name; versions are a few characters. Also keeps integers far
# below Python's 4300-digit conversion limit.
MAX_SCALAR_CHARS = 200
INVALID_EXIT_CODE = 2

_COLLECTION_START = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_COLLECTION_END = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


class StackFileError(GpufleetError):
    """The stack file cannot be used; the message says where and why."""

    def __init__(self, path: Path, problem: str) -> None:
        # One line: PyYAML's own messages span several.
        super().__init__(f"stack file {path} {' '.join(problem.split())}", INVALID_EXIT_CODE)


def load_stack_file(path: Path | str) -> dict[str, Any]:
    """The normalised stack of a stack file; every problem is one StackFileError."""
    path = Path(path)
    text = _read_text(path)
    _check_events(path, text)
    raw = _construct(path, text)
    spec = compat.stack_spec()
    try:
        return spec.normalize_stack(raw)
    except spec.StackError as error:
        raise StackFileError(path, f"is not a valid stack: {error}") from error


def _read_text(path: Path) -> str:
    try:
        # stat first: reading a FIFO or a device would block or never end.
        if not stat.S_ISREG(path.stat().st_mode):
            raise StackFileError(path, "is not a regular file")
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError as error:
        raise StackFileError(path, "does not exist") from error
    except OSError as error:
        raise StackFileError(path, f"cannot be read: {error.strerror or error}") from error
    if len(data) > MAX_BYTES:
        raise StackFileError(path, f"is larger than {MAX_BYTES // 1024} KiB; a stack file is a few lines")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise StackFileError(path, f"is not UTF-8 text (byte {error.start})") from error


def _where(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _check_events(path: Path, text: str) -> None:
    """Depth, size and shape limits on the parser's events, before anything is constructed."""
    depth = nodes = documents = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise StackFileError(path, f"holds more than one YAML document{_where(event.start_mark)}")
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise StackFileError(path, f"uses a YAML anchor or alias{_where(event.start_mark)}; write values out")
            if isinstance(event, (yaml.ScalarEvent, *_COLLECTION_START)):
                nodes += 1
                if nodes > MAX_NODES:
                    raise StackFileError(path, f"has more than {MAX_NODES} values; a stack file is a few lines")
            if isinstance(event, yaml.ScalarEvent) and len(event.value) > MAX_SCALAR_CHARS:
                raise StackFileError(
                    path, f"has a value longer than {MAX_SCALAR_CHARS} characters{_where(event.start_mark)}"
                )
            if isinstance(event, _COLLECTION_START):
                depth += 1
                if depth > MAX_DEPTH:
                    raise StackFileError(path, f"nests deeper than {MAX_DEPTH} levels{_where(event.start_mark)}")
            elif isinstance(event, _COLLECTION_END):
                depth -= 1
    except yaml.MarkedYAMLError as error:
        raise StackFileError(path, f"is not valid YAML{_where(error.problem_mark)}: {error.problem}") from error
    except yaml.YAMLError as error:
        raise StackFileError(path, f"is not valid YAML: {error}") from error


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML's own rule; PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError as error:  # an unhashable key such as a list
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a plain value", key_node.start_mark
                ) from error
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first{_where(seen[key].start_mark)})", key_node.start_mark
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _construct(path: Path, text: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as error:
        raise StackFileError(path, f"is not valid YAML{_where(error.problem_mark)}: {error.problem}") from error
    except yaml.YAMLError as error:
        raise StackFileError(path, f"is not valid YAML: {error}") from error
    except (ValueError, OverflowError, RecursionError) as error:
        # A value the YAML resolver types but Python cannot build, e.g. the date 2024-13-45.
        raise StackFileError(path, f"has a value that cannot be read: {error}") from error
