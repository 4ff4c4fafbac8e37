"""Reading a YAML job config safely: bounded in size, time and memory, and strict where PyYAML is lenient.

`yaml.safe_load` builds no arbitrary objects, but it still accepts input that hangs or exhausts memory later:
aliases expand by reference, so a "billion laughs" document of a few hundred bytes stands for 10^9 nodes that
any walk over the result (validation, hashing) visits one by one, and a recursive alias (`&a [*a]`) never ends.
It also keeps the last of two equal keys silently. Here the file is capped at MAX_CONFIG_BYTES, the composed
node graph is measured with every alias expanded (memoised, so the measure is linear in the document) and
refused past MAX_EXPANDED_NODES or when it refers to itself, and a repeated key is an error naming its line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from longrope.workers.errors import LongRopeError

MAX_CONFIG_BYTES = 1 << 20
MAX_EXPANDED_NODES = 100_000


class ConfigYamlError(LongRopeError, ValueError):
    """The file is not a YAML document this tool will read; the message says where and why."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise ConfigYamlError(
                        f"key {key!r} given twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1})"
                    )
                seen[key] = key_node.start_mark.line
            except TypeError:  # an unhashable key; SafeLoader reports it itself below
                break
        return super().construct_mapping(node, deep=deep)


def expanded_size(root: Node, limit: int = MAX_EXPANDED_NODES) -> int:
    """Nodes in the document with every alias expanded; ConfigYamlError past `limit` or on a cycle."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise ConfigYamlError(f"line {node.start_mark.line + 1}: an alias refers to a node that contains it")
        open_nodes.add(id(node))
        if isinstance(node, ScalarNode):
            total = 1
        elif isinstance(node, SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        else:
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        open_nodes.discard(id(node))
        if total > limit:
            raise ConfigYamlError(f"holds more than {limit} values once aliases are expanded; a config is far smaller")
        sizes[id(node)] = total
        return total

    return size(root)


def read_yaml(path: Path) -> Any:
    """The YAML document in `path`, or ConfigYamlError (one line) for anything that is not a sane config file."""
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigYamlError(f"{size} bytes; a config is at most {MAX_CONFIG_BYTES} bytes")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigYamlError(f"not UTF-8 text (byte {exc.start}); is it a binary file?") from exc
    return parse_yaml(text)


def parse_yaml(text: str) -> Any:
    """One YAML document (a config file or a `--set` value) through the same guards, as plain JSON values."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigYamlError(f"{len(text)} characters; at most {MAX_CONFIG_BYTES}")
    if "\x00" in text:
        raise ConfigYamlError(f"holds a NUL character at offset {text.index(chr(0))}; is it a binary file?")
    try:
        loader = _StrictLoader(text)  # PyYAML's Reader checks every character here, before any parsing
    except yaml.reader.ReaderError as exc:
        raise ConfigYamlError(unprintable_character(text, exc.position)) from exc
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node)
        return check_plain(loader.construct_document(node))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigYamlError(f"not valid YAML ({getattr(exc, 'problem', None) or exc}{where})") from exc
    except RecursionError as exc:
        raise ConfigYamlError("nested too deeply") from exc
    except ConfigYamlError:
        raise
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        raise ConfigYamlError(f"unreadable value ({str(exc)[:200]})") from exc
    finally:
        loader.dispose()


def unprintable_character(text: str, offset: int) -> str:
    """YAML 1.1 allows tab, line breaks and printable characters only (PyYAML `Reader.check_printable`); say which
    character, where, as a user finds it (offset, and line and column for a file)."""
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return (
        f"not valid YAML: control character U+{ord(text[offset]):04X} at offset {offset} (line {line}, column "
        f"{column}); YAML allows printable characters, tab and line breaks only"
    )


PLAIN = (str, int, float, bool, type(None))


def check_plain(value: Any, where: str = "") -> Any:
    """Only what JSON can hold: a config is hashed and stored as JSON, so a !!binary, date or set value is refused
    by name instead of failing later."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int | float | bool):
                raise ConfigYamlError(f"{where or 'a key'}: a key of type {type(key).__name__} is not allowed")
            check_plain(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_plain(item, f"{where}[{index}]")
    elif not isinstance(value, PLAIN):
        raise ConfigYamlError(f"{where or 'value'}: a {type(value).__name__} value is not allowed (JSON values only)")
    return value
