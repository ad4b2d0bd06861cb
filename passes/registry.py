"""The pass registry, readable without importing the passes.

Each pass declares its name, description and options on its class (see
:mod:`passes.base`), and the classes import onnx_ir, which imports onnx,
sympy and ml_dtypes: seconds of start-up on a loaded machine. ``optimize
--help`` and a command line that fails early (a missing file, an unknown
flag) only need the declarations, so the registry can serve them from a
cache (a small JSON file in the user's cache folder, written the first time
the classes are imported). It is used only while it is current: its key
covers the size and modification time of every module of this package and
the Python version, so an edited pass is read from its class again and the
cache rewritten.

A spec served from the cache imports its class only when it is built, and
an option's ``parse`` and ``check`` defer to the class's own declaration: a
run behaves exactly as with the classes imported up front, it merely imports
only the passes it runs (refimpl comes in with ``fold``, nothing else needs it).

The cache is opt-in per process (:func:`use_cache`, which the ``optimize``
command calls); ``import passes`` as a library always reads the classes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import pathlib
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from passes.options import Option

if TYPE_CHECKING:
    import onnx_ir as ir

    from passes.base import Pass

__all__ = ["PassSpec", "Registry", "cache_file", "use_cache"]

#: Set ``ONNX_OPTIMIZE_CACHE_DIR`` to choose the cache folder, or to an empty string to use none.
CACHE_ENV = "ONNX_OPTIMIZE_CACHE_DIR"
_CACHE_NAME = "declarations.json"
_FORMAT = 1
_PACKAGE = pathlib.Path(__file__).resolve().parent

_enabled = False


def use_cache(enabled: bool = True) -> None:
    """Lets registries in this process serve declarations from the cache."""
    global _enabled
    _enabled = enabled


@dataclasses.dataclass(frozen=True)
class PassSpec:
    """A pass the pipeline can run: its name, a one-line description, its options, how to build it."""

    name: str
    description: str
    build: Callable[[Mapping[str, Any]], ir.passes.PassBase]
    options: tuple[Option, ...] = ()

    @classmethod
    def of(cls, pass_class: type[Pass]) -> PassSpec:
        return cls(pass_class.NAME, pass_class.DESCRIPTION, pass_class.from_options, pass_class.OPTIONS)


def cache_file() -> pathlib.Path | None:
    """Where the declarations are cached, or None if caching is turned off."""
    folder = os.environ.get(CACHE_ENV)
    if folder is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "onnx-optimize")
    return pathlib.Path(folder) / _CACHE_NAME if folder else None


def _fingerprint() -> str:
    """Changes whenever a module of this package (or the interpreter) does."""
    digest = hashlib.sha256(f"{_FORMAT} {sys.version} {_PACKAGE}".encode())
    for root, dirs, files in os.walk(_PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                st = os.stat(path)
                digest.update(f"{os.path.relpath(path, _PACKAGE)} {st.st_size} {st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


class _Deferred:
    """An option's ``parse`` or ``check``, fetched from the pass class on first call."""

    def __init__(self, locator: str, option: str, attribute: str) -> None:
        self.locator, self.option, self.attribute = locator, option, attribute
        self.__name__ = option  # argparse names the type in its messages

    def __call__(self, value: Any) -> Any:
        real = next(o for o in _import(self.locator).OPTIONS if o.name == self.option)
        return getattr(real, self.attribute)(value)


def _import(locator: str) -> type[Pass]:
    module, _, name = locator.partition(":")
    return getattr(importlib.import_module(module), name)


def _is_plain(value: Any) -> bool:
    return value is None or type(value) in (bool, int, float, str) and json.loads(json.dumps(value)) == value


def _declare(locator: str, pass_class: type[Pass]) -> dict[str, Any] | None:
    options = []
    for o in pass_class.OPTIONS:
        if not _is_plain(o.default):
            return None
        options.append({"name": o.name, "default": o.default, "help": o.help, "metavar": o.metavar,
                        "argument": o.argument, "check": o.check is not None})  # fmt: skip
    return {"locator": locator, "name": pass_class.NAME, "description": pass_class.DESCRIPTION, "options": options}


def _from_declaration(d: dict[str, Any]) -> PassSpec:
    locator = d["locator"]
    options = tuple(
        Option(o["name"], o["default"], o["help"], parse=_Deferred(locator, o["name"], "parse"),
               check=_Deferred(locator, o["name"], "check") if o["check"] else None,
               metavar=o["metavar"], argument=o["argument"])
        for o in d["options"]
    )  # fmt: skip

    def build(values: Mapping[str, Any]) -> ir.passes.PassBase:
        return _import(locator).from_options(values)

    return PassSpec(d["name"], d["description"], build, options)


def _read_cache(locators: tuple[str, ...], key: str) -> list[PassSpec] | None:
    path = cache_file()
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key or [d["locator"] for d in data["passes"]] != list(locators):
            return None
        return [_from_declaration(d) for d in data["passes"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(declarations: list[dict[str, Any]], key: str) -> None:
    path = cache_file()
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": key, "passes": declarations}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs start-up time
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass


class Registry(MutableMapping[str, PassSpec]):
    """The passes by CLI name, in their default order, filled on first use.

    Args:
        locators: ``"module:Class"`` of each pass class, in order.
    """

    def __init__(self, locators: tuple[str, ...]) -> None:
        self.locators = locators
        self._specs: dict[str, PassSpec] | None = None

    def _filled(self) -> dict[str, PassSpec]:
        if self._specs is None:
            self._specs = {spec.name: spec for spec in self._load()}
        return self._specs

    def _load(self) -> list[PassSpec]:
        imported = all(loc.partition(":")[0] in sys.modules for loc in self.locators)
        key = _fingerprint() if _enabled and not imported else ""
        if key:
            cached = _read_cache(self.locators, key)
            if cached is not None:
                return cached
        classes = [(loc, _import(loc)) for loc in self.locators]
        if key:
            declarations = [_declare(loc, c) for loc, c in classes]
            if all(d is not None for d in declarations):
                _write_cache(declarations, key)  # type: ignore[arg-type]
        return [PassSpec.of(c) for _, c in classes]

    def __getitem__(self, name: str) -> PassSpec:
        return self._filled()[name]

    def __setitem__(self, name: str, spec: PassSpec) -> None:
        self._filled()[name] = spec

    def __delitem__(self, name: str) -> None:
        del self._filled()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._filled())

    def __len__(self) -> int:
        return len(self._filled())

    def __repr__(self) -> str:
        return f"Registry({list(self)!r})"
