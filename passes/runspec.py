"""The run, described once: which passes run, in which order, with which option values.

The command and the API both build a :class:`RunSpec` (:meth:`RunSpec.build`),
so both refuse the same requests with the same message; everything after it
takes the values as they are. Like :mod:`passes.declarations` this imports
neither onnx, onnx_ir nor numpy: a bad request fails before any of them loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from passes import shapes  # light: --input-shape / --fix-dim validated once
from passes.declarations import PASSES
from passes.errors import InputError
from passes.options import Option

if TYPE_CHECKING:
    import onnx_ir as ir

    from passes.report import PassRun

__all__ = ["RunSpec", "pass_options", "select_passes"]


def pass_options() -> list[Option]:
    """Every option the registered passes declare, once each, in pass order."""
    seen: dict[str, Option] = {}
    for spec in PASSES.values():
        for option in spec.options:
            seen.setdefault(option.name, option)
    return list(seen.values())


def select_passes(passes: Iterable[str] | None = None, skip: Iterable[str] = ()) -> list[str]:
    """Validates pass names; returns the ones to run in the order given (default: all).

    Raises:
        InputError: an unknown pass name.
    """
    names = list(PASSES) if passes is None else [p for p in passes if p]
    skip = [s for s in skip if s]
    for name in [*names, *skip]:
        if name not in PASSES:
            known = ", ".join(PASSES) or "none"
            raise InputError(f"unknown pass {name!r} (available: {known})")
    return [n for n in names if n not in skip]


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One validated description of which passes run, with which option values.

    Built once, by the command or the API, with :meth:`build`; everything
    after it takes the values as they are.

    Attributes:
        passes: The passes to run, in order.
        options: Every declared option's value (defaults filled in).
        cleanup: Whether the clean-up runs after the passes.
        types: Whether the ``types`` step (a value_info for every computed value) runs after the
            clean-up: in the default pipeline (no pass list given), and in any run that declares
            static shapes (the step tightens the outputs' shapes); not when the user chose the
            passes (``--passes upgrade`` is the upgrade and its clean-up, nothing more).
        input_shapes: Static shapes of graph inputs (``--input-shape``), declared before the passes.
        fix_dims: Sizes of symbolic dims (``--fix-dim``), set everywhere before the passes.
    """

    passes: tuple[str, ...]
    options: Mapping[str, Any]
    cleanup: bool = True
    types: bool = True
    input_shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    fix_dims: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, passes: Iterable[str] | None = None, skip: Iterable[str] = (), *, cleanup: bool = True,
              input_shapes: Mapping[str, Sequence[int]] | None = None, fix_dims: Mapping[str, int] | None = None,
              **options: Any) -> RunSpec:  # fmt: skip
        """Validates the pass names, option values and static shapes (:mod:`passes.shapes`).

        Raises:
            InputError: an unknown pass or option, a value an option's declaration refuses,
                an option set (to other than its default) for a pass that does not run, option
                values a running pass refuses together (``PassSpec.refuse``), or a static size
                that is not a positive integer.
        """
        names = select_passes(passes, skip)
        static, fixed = shapes.normalize(input_shapes, fix_dims)
        declared = {o.name: o for o in pass_options()}
        unknown = sorted(set(options) - set(declared))
        if unknown:
            raise InputError(f"unknown option {unknown[0]!r} (options: {', '.join(declared) or 'none'})")
        values = {name: option.default for name, option in declared.items()}
        for name, value in options.items():
            option = declared[name]
            reason = option.check(value) if option.check is not None and value is not None else None
            if reason:
                raise InputError(f"{option.flag} {value}: {reason}")
            values[name] = value
        if passes is None:  # the default run: an opt-in pass only when one of its options is set
            names = [n for n in names if not PASSES[n].opt_in
                     or any(values[o.name] != o.default for o in PASSES[n].options)]  # fmt: skip
        running = {option.name for name in names for option in PASSES[name].options}
        for name, spec in PASSES.items():
            for option in spec.options:
                if option.name not in running and values[option.name] != option.default:
                    raise InputError(f"{option.flag} is an option of {name}, which does not run")
        for name in names:
            reason = PASSES[name].refuse(values) if PASSES[name].refuse is not None else None
            if reason:
                raise InputError(reason)
        return cls(tuple(names), values, cleanup, cleanup and passes is None, static, fixed)

    def without(self, keep: int, cleanup: bool) -> RunSpec:
        """The same run with only the first ``keep`` passes (and the clean-up or not)."""
        kept = self.passes[:keep]
        running = {option.name for name in kept for option in PASSES[name].options}
        declared = {o.name: o for o in pass_options()}
        values = {k: (v if k in running else declared[k].default) for k, v in self.options.items()}
        return RunSpec(kept, values, cleanup, self.types and cleanup, self.input_shapes, self.fix_dims)

    def without_fusions(self) -> RunSpec:
        """The same run with simplify's fusions off (``--no-fuse``): its exact rewrites only."""
        return dataclasses.replace(self, options={**self.options, "fuse": False})

    @property
    def static(self) -> bool:
        """Whether the run declares static shapes."""
        return bool(self.input_shapes or self.fix_dims)

    def _steps(self) -> list[tuple[str, ir.passes.PassBase, bool]]:
        """(name, pass, repeats) of each step, built now."""
        steps = [(name, PASSES[name].build(self.options), PASSES[name].repeats) for name in self.passes]
        if self.static:
            from passes.shapes.declare import DeclareShapesPass

            steps.insert(0, ("shapes", DeclareShapesPass(self.input_shapes, self.fix_dims), False))
        types = self.cleanup and (self.types or self.static)
        if self.cleanup:
            from passes.cleanup import CleanupPass

            steps.append(("cleanup", CleanupPass(untype=not types), False))
        if types:
            from passes.shapes.value_info import TypeValuesPass

            steps.append(("types", TypeValuesPass(), False))  # after the clean-up: see passes.shapes.value_info
        return steps

    def manager(self, record: Any = None) -> ir.passes.PassManager:
        """The pass loop of this run (see :mod:`passes.loop`), recording into ``record``."""
        from passes import loop

        return loop.build(self._steps(), record if record is not None else loop.Record())

    def run(self, model: ir.Model, progress: Callable[[str], None] | None = None,
            runs: list[PassRun] | None = None) -> list[PassRun]:
        """Runs the passes on ``model`` in place; what each pass did, in order (also recorded into
        ``runs`` as they run, so that a caller has them when a pass raises)."""
        from passes import loop

        record = loop.Record(progress, runs)
        steps = self._steps()
        try:
            loop.run(loop.build(steps, record), model)
        finally:  # a pass may hold a child process between its runs (fold's onnxruntime): not past this run
            for _, pass_, _ in steps:
                close = getattr(pass_, "close", None)
                if callable(close):
                    close()
        return record.runs
