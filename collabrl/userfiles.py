"""Files a user names or edits (configs, data, a run's records and state), read so that
no file can hang, exhaust memory or crash the reader: regular files only, sizes and
nesting bounded before anything is built, and every failure one line naming the file."""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from collabrl.errors import UserError

T = TypeVar("T")

# A config is a page of keys: a mebibyte is far past any real one, and a bounded read
# cannot exhaust memory on a runaway file.
MAX_CONFIG_BYTES = 1 << 20
# Our configs nest four deep; past this, Python's recursive readers, copies and merges
# would raise RecursionError instead of an error that names the file.
MAX_DEPTH = 64
# Values a YAML document may hold once its aliases (`*name`) are expanded: anchors whose
# values alias other anchors expand exponentially ("billion laughs", ~100 bytes for
# 10^9 values), and every reader downstream (checks, copies, the saved config) expands them.
MAX_YAML_VALUES = 100_000


def check_regular_file(path: Path, what: str) -> None:
    """Refuse anything but a regular file (`what`: "config", "data file", ...) before it is
    opened: a FIFO would block forever and a device such as /dev/zero never ends."""
    try:
        regular = stat.S_ISREG(Path(path).stat().st_mode)
    except OSError as err:
        raise UserError(
            f"cannot read {what} {path}: {err.strerror or err}", "check the path"
        ) from err
    if not regular:
        raise UserError(
            f"cannot read {what} {path}: not a regular file (a folder, FIFO or device)",
            f"pass a {what} file",
        )


def read_user_bytes(path: Path, what: str, limit: int | None = None) -> bytes:
    """The bytes of the regular file `path` a user named (`check_regular_file`); a file
    over `limit` bytes is refused without reading it whole."""
    check_regular_file(path, what)
    try:
        with Path(path).open("rb") as file:
            data = file.read() if limit is None else file.read(limit + 1)
    except OSError as err:
        raise UserError(
            f"cannot read {what} {path}: {err.strerror or err}", "check the path"
        ) from err
    if limit is not None and len(data) > limit:
        raise UserError(f"{what} {path} is over {limit:,} bytes", f"pass a {what} of at most that")
    return data


def decode_text(data: bytes, where: str) -> str:
    """`data` as UTF-8 text; otherwise a one-line error naming the line of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UserError(f"{where}:{line} is not UTF-8 text", "save the file as UTF-8") from err


def read_user_text(path: Path, what: str, limit: int | None = None) -> str:
    """`read_user_bytes` decoded as UTF-8."""
    return decode_text(read_user_bytes(path, what, limit), f"{what} {path}")


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader (no Python tags), bounded before anything is built: nesting
    depth, and the values its aliases expand to (each node's expanded size is counted as
    the composer finishes it, so a shared node is counted in linear time)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values it expands to

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        mark = self.peek_event().start_mark
        alias = self.check_event(yaml.AliasEvent)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels", mark
                )
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if not alias:
            self._sizes[id(node)] = self._expanded_size(node)
        elif id(node) not in self._sizes:  # an alias inside its own anchor: endless
            raise yaml.composer.ComposerError(
                None, None, "an alias refers to the value that holds it", mark
            )
        return node

    def _expanded_size(self, node: yaml.Node) -> int:
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        size = 1 + sum(self._sizes[id(child)] for child in children)
        if size > MAX_YAML_VALUES:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"its aliases expand to over {MAX_YAML_VALUES:,} values",
                node.start_mark,
            )
        return size

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError as err:  # past Python's int_max_str_digits
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(node.value):,} digits", node.start_mark
            ) from err


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


def _yaml_error(where: str, err: yaml.YAMLError) -> str:
    """One line for a YAML error: PyYAML's own spans lines, with a caret drawing."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or getattr(err, "context", None) or str(err)
    return f"{where}{line} is not valid YAML ({problem.splitlines()[0]})"


def parse_yaml(text: str, where: str, fix: str = "fix the file") -> Any:
    """`text` read as YAML by the bounded safe loader; every failure one line naming `where`."""
    return load_yaml(text, where, fix, BoundedLoader.get_single_data)


def load_yaml(text: str, where: str, fix: str, step: Callable[[BoundedLoader], T]) -> T:
    """`step` (compose or construct) of a bounded loader over `text`, its errors one line."""
    loader = BoundedLoader(text)
    try:
        return step(loader)
    except yaml.YAMLError as err:
        raise UserError(_yaml_error(where, err), fix) from err
    finally:
        loader.dispose()


def parse_json(text: str | bytes, where: str, fix: str = "fix the file") -> Any:
    """`text` read as JSON; every failure one line naming `where`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{where} is not valid JSON ({err.msg})", fix) from err
    except ValueError as err:  # an integer past Python's int_max_str_digits
        digits = sys.get_int_max_str_digits()
        raise UserError(f"{where} holds an integer of over {digits} digits", fix) from err
    except RecursionError as err:
        raise UserError(f"{where} is nested too deeply to read", fix) from err


def read_json(path: Path, what: str, fix: str = "fix the file") -> Any:
    """A JSON file a user may have named or edited (a run's state, a checkpoint's)."""
    return parse_json(read_user_text(path, what), f"{what} {path}", fix)
