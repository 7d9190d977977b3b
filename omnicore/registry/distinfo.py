"""Installed entry points and versions read from ``*.dist-info`` folders, as ``importlib.metadata`` reads them.

Why: ``omnicore plugins`` must start fast, and :mod:`importlib.metadata` costs more than the rest of
the listing. Importing it pulls in ``email``, ``zipfile``, ``csv`` and ``importlib.resources``, and
each ``dist.metadata`` parses a whole ``METADATA`` file, long description included, with the email
parser. This module walks ``sys.path`` as ``importlib.metadata`` does (the same order, the same
"first distribution of a name wins", the same ``entry_points.txt`` grammar) with ``os`` alone. It
reads only the header block of ``METADATA`` (``Name``, ``Version``, ``Keywords``).

It answers only where it can give ``importlib.metadata``'s answer. Everywhere else a function
returns ``None`` and the caller asks ``importlib.metadata`` itself. These cases include:

* ``importlib.metadata`` is already imported. It is then paid for, and it may be patched, as tests
  patch ``entry_points``.
* a finder on ``sys.meta_path`` other than the standard ``PathFinder`` offers distributions.
* a ``sys.path`` entry is not a ``str``, is a file (a zip archive) or is an ``.egg``.
* a metadata folder's suffix is not lower case.
* an ``entry_points.txt`` line is not ``name = value``, or a value is not ``module`` or
  ``module:attr``. ``importlib.metadata`` would then fail or parse leniently, and its own error
  and reading must be the ones shown.
* ``METADATA`` is missing, cannot be read or decoded, or lacks ``Name`` or ``Version``.
* the header block has an unusual line break, an envelope (``From ``) line or a header without a
  name; or ``Name``, ``Version`` or ``Keywords`` is folded over several lines.

``tests/test_startup.py`` compares both readers on the installed environment and on synthetic
layouts.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import re
import sys
from typing import Any

_SUFFIXES = (".dist-info", ".egg-info")
_VALUE = re.compile(r"[\w.]+(:[\w.]+)?")
"""Entry-point values read here: ``module`` or ``module:attr`` (dotted), nothing else."""
_HEADER_NAME = re.compile(r"[\041-\071\073-\176]+")
"""A header name as the email parser accepts it: printable ASCII without ``:`` or space."""
_ODD_BREAKS = ("\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
"""Characters that ``str.splitlines`` (and so the email parser) breaks lines at, besides ``\\n`` and ``\\r``."""
_FOLD_SENSITIVE = ("name", "version", "keywords")
_QUIET = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
"""The errors ``importlib.metadata``'s ``PathDistribution.read_text`` treats as "no such file"."""


class _Unsupported(Exception):
    """The layout is outside what this module mirrors: ask ``importlib.metadata``."""


class Headers:
    """The header block of a ``METADATA`` file. It answers the lookups the registry makes on
    ``importlib.metadata``'s message: ``md["Name"]``, ``md.get(...)`` and ``md.get_all("Keywords")``.
    Names match case-insensitively, the first one wins, and a missing one is ``None``."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items

    def get_all(self, name: str, failobj: Any = None) -> Any:
        """Every value of header ``name``, in file order, or ``failobj`` when there is none."""
        low = name.lower()
        found = [v for k, v in self._items if k.lower() == low]
        return found or failobj

    def get(self, name: str, failobj: Any = None) -> Any:
        """The first value of header ``name``, or ``failobj``."""
        found = self.get_all(name)
        return found[0] if found else failobj

    def __getitem__(self, name: str) -> str | None:
        return self.get(name)


class Distribution:
    """One ``*.dist-info`` (or ``*.egg-info``) folder. ``_path`` is spelled as on
    ``importlib.metadata``'s ``PathDistribution``, and ``metadata`` is its :class:`Headers`."""

    def __init__(self, path: str, metadata: Headers) -> None:
        self._path = path
        self.metadata = metadata

    @property
    def name(self) -> str | None:
        """The ``Name`` header."""
        return self.metadata["Name"]

    @property
    def version(self) -> str | None:
        """The ``Version`` header."""
        return self.metadata["Version"]

    def __repr__(self) -> str:
        return f"<Distribution {self._path!r}>"


class EntryPoint:
    """One entry point, as :class:`importlib.metadata.EntryPoint` offers it: ``name``, ``value``,
    ``group``, ``dist``, ``module``, ``attr`` and :meth:`load`."""

    def __init__(self, name: str, value: str, group: str, dist: Distribution | None = None) -> None:
        self.name, self.value, self.group, self.dist = name, value, group, dist

    @property
    def module(self) -> str:
        """The module part of ``value``."""
        return self.value.partition(":")[0]

    @property
    def attr(self) -> str | None:
        """The attribute part of ``value`` (dotted), or ``None``."""
        return self.value.partition(":")[2] or None

    def load(self) -> Any:
        """Import the module and return the named attribute (or the module), as
        :meth:`importlib.metadata.EntryPoint.load` does; its import errors propagate."""
        obj: Any = importlib.import_module(self.module)
        for part in (self.attr or "").split("."):
            if part:
                obj = getattr(obj, part)
        return obj

    def __repr__(self) -> str:
        return f"EntryPoint(name={self.name!r}, value={self.value!r}, group={self.group!r})"


def entry_points(group: str, *, force: bool = False) -> list[EntryPoint] | None:
    """The installed entry points of ``group`` in ``importlib.metadata.entry_points(group=group)``'s
    order, each with its ``dist`` (``Name``, ``Version`` and ``Keywords`` read), or ``None`` where
    this module cannot promise the same answer (module docstring).

    ``force`` skips the check that ``importlib.metadata`` is not yet imported (for tests that
    compare both readers).
    """
    if not force and "importlib.metadata" in sys.modules:
        return None
    try:
        found = _scan()
        seen: set[str] = set()
        out: list[EntryPoint] = []
        for key, path in found:
            if key in seen:
                continue  # the first distribution of a name on sys.path wins
            seen.add(key)
            eps = _read_entry_points(path, group)
            if eps:
                dist = Distribution(path, _read_headers(path))
                for ep in eps:
                    ep.dist = dist
                out += eps
        return out
    except _Unsupported:
        return None


def version(name: str, *, force: bool = False) -> str | None:
    """The ``Version`` of the installed distribution ``name``, found as
    ``importlib.metadata.version(name)`` finds it, or ``None``: not found, or not answerable here
    (``force`` as for :func:`entry_points`). Then ask ``importlib.metadata``: it raises
    ``PackageNotFoundError`` where there is none."""
    if not force and "importlib.metadata" in sys.modules:
        return None
    want = _normalize(name)
    try:
        for key, path in _scan():
            if key == want:
                return _read_headers(path)["Version"]
    except _Unsupported:
        return None
    return None


def _normalize(name: str) -> str:
    """``importlib.metadata``'s ``Prepared.normalize``: PEP 503, then ``-`` written ``_``."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _scan() -> list[tuple[str, str]]:
    """``(normalized name, metadata folder)`` of every distribution, in the order
    ``importlib.metadata.distributions()`` yields them.

    Raises:
        _Unsupported: the layout is outside what is mirrored (module docstring).
    """
    path_finder = False
    for finder in sys.meta_path:
        if getattr(finder, "find_distributions", None) is None:
            continue
        if finder is not importlib.machinery.PathFinder:
            raise _Unsupported("another finder offers distributions")
        path_finder = True
    if not path_finder:
        return []
    out: list[tuple[str, str]] = []
    for root in sys.path:
        if not isinstance(root, str):
            raise _Unsupported("a sys.path entry that is not a str")
        try:
            children = os.listdir(root or ".")
        except OSError:
            if os.path.isfile(root or "."):
                raise _Unsupported("a file on sys.path (a zip archive)") from None
            continue  # a missing or unreadable folder holds nothing, as for importlib.metadata
        except Exception as exc:  # noqa: BLE001 - an odd entry (an embedded NUL): not mirrored
            raise _Unsupported(str(exc)) from exc
        if os.path.basename(root).lower().endswith(".egg"):
            raise _Unsupported("an .egg on sys.path")
        by_name: dict[str, list[str]] = {}  # grouped by name in first-seen order, as importlib.metadata's Lookup
        for child in children:
            low = child.lower()
            if not low.endswith(_SUFFIXES):
                continue
            if os.path.splitext(child)[1] not in _SUFFIXES:
                raise _Unsupported("a metadata folder whose suffix is not lower case")
            by_name.setdefault(_normalize(low.rpartition(".")[0].partition("-")[0]), []).append(os.path.join(root, child))
        for key, paths in by_name.items():
            out += [(key, p) for p in paths]
    return out


def _read(path: str, name: str) -> str | None:
    """A metadata file's text (UTF-8, universal newlines), or ``None`` where
    ``PathDistribution.read_text`` gives ``None``.

    Raises:
        _Unsupported: any other failure (``importlib.metadata`` would raise it).
    """
    try:
        with open(os.path.join(path, name) if name else path, "rb") as f:
            text = f.read().decode("utf-8")
    except _QUIET:
        return None
    except Exception as exc:  # noqa: BLE001 - undecodable or unreadable: importlib.metadata's error is the one to show
        raise _Unsupported(str(exc)) from exc
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text  # what text mode reads


def _read_entry_points(path: str, group: str) -> list[EntryPoint]:
    """The entry points of ``group`` in ``entry_points.txt`` (``importlib.metadata``'s ``Sectioned``
    grammar: stripped lines, ``#`` comments, ``[group]`` sections, ``name = value`` pairs, none
    before a section).

    Raises:
        _Unsupported: a line (of any group) that is not ``name = value``, or a value of ``group``
            other than ``module[:attr]``.
    """
    text = _read(path, "entry_points.txt")
    out: list[EntryPoint] = []
    section: str | None = None
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
            continue
        if section is None:
            continue
        name, eq, value = line.partition("=")
        if not eq:
            raise _Unsupported("an entry_points.txt line without '='")
        if section != group:
            continue
        value = value.strip()
        if not _VALUE.fullmatch(value):
            raise _Unsupported("an entry-point value other than module[:attr]")
        out.append(EntryPoint(name.strip(), value, group))
    return out


def _read_headers(path: str) -> Headers:
    """The header block of the folder's ``METADATA`` (else ``PKG-INFO``, else the path itself, as
    ``importlib.metadata`` reads them), parsed as the email parser's ``compat32`` policy parses it.

    Raises:
        _Unsupported: no metadata text, or a header block outside the plain case (module docstring).
    """
    text = _read(path, "METADATA") or _read(path, "PKG-INFO") or _read(path, "")
    if not text:
        raise _Unsupported("no metadata")
    head = text.split("\n\n", 1)[0]  # the header block ends at the first blank line, if not before
    if any(c in head for c in _ODD_BREAKS):
        raise _Unsupported("an unusual line break in the header block")
    items: list[tuple[str, str]] = []
    for line in head.split("\n"):
        if not line:
            break  # a blank first line: no headers
        if line[0] in " \t":  # a folded continuation of the header before it
            if items and items[-1][0].lower() in _FOLD_SENSITIVE:
                raise _Unsupported("a folded Name, Version or Keywords header")
            continue
        if line.startswith("From "):
            raise _Unsupported("an envelope line")
        name, colon, value = line.partition(":")
        if not colon or not _HEADER_NAME.fullmatch(name):
            if not name and colon:
                raise _Unsupported("a header without a name")
            break  # not a header: the email parser starts the body here
        items.append((name, value.lstrip(" \t")))
    headers = Headers(items)
    if headers["Name"] is None or headers["Version"] is None:
        raise _Unsupported("no Name or Version header")
    return headers
