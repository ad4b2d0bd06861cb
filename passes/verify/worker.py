"""The check's child process: runs the onnxruntime sessions, so that a crash or a hang stays here.

Started by :mod:`passes.verify.child` (:func:`passes.children.module_command`). It imports numpy,
onnxruntime and the comparison only (not onnx, not the passes; its side of onnxruntime is
:mod:`passes.verify.ort_io`), bounds its own address space (RLIMIT_AS) when asked to, ignores
SIGINT (the parent handles it and kills this process) and dies with its parent (PR_SET_PDEATHSIG).

Protocol: one JSON object per line. Requests on stdin, each answered by zero
or more ``{"phase": ...}`` lines (what it is about to do, so that the parent
can say where a crash happened) and one ``{"result": ...}`` line. Requests:

``prepare``: load the original model, choose the inputs (the caller's, and
generated ones: each try's sizes in turn until the original runs), run it and
keep its outputs (on disk, memory-mapped, if they are large); its session is
kept for ``add_set``.
``add_set``: run the original on one more set of inputs (edge values made from
the chosen ones, see :mod:`passes.verify.edges`, or other sizes) and keep its
outputs; a set it cannot run is answered ``ok: false`` and not kept. One
request per set, so that a crash on one (an integer division of the minimum by
-1 is SIGFPE) loses that set only.
``compare``: run another model on the same inputs (the first set and every kept one) and compare its outputs
with the kept ones (its session freed after the answer is sent: the parent does not wait for that, a tenth
of a second on a large graph). ``again``: run the original again on one set and name
the outputs on which it disagrees with itself. ``values``: run two models (both with extra graph
outputs) on one set and compare the named values. ``constants``: run a model without inputs (the
constant subgraphs whose values ``fold`` wants to write, see :mod:`passes.fold.confirm`) and save
its outputs as ``.npy`` files. ``capture`` and ``regions``: ``--repro``'s (see :mod:`passes.verify.repro_child`).
``release``: drop the original's session (its kept outputs stay; ``again`` loads it anew), once its sets
ran before the optimised model exists (:mod:`passes.verify.early`). ``default_load``: build a session with
onnxruntime's default graph optimisations (:mod:`passes.verify.default_load`). ``exit``.

The inputs of a set are made again from its description when needed (they are
deterministic), so that only the chosen inputs stay in memory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from passes.verify.ort_io import (  # stdlib only at import: numpy and onnxruntime at first use
    constants as _constants_of,
    default_session as _default_session,
    describe as _describe,
    error_line as _first_line,
    generate as _generate,
    run as _run,
    session as _session,
    spill as _spill,
)

_PROTOCOL: Any = None


def _send(message: dict[str, Any]) -> None:
    _PROTOCOL.write(json.dumps(message) + "\n")
    _PROTOCOL.flush()


def _phase(text: str) -> None:
    _send({"phase": text})


def _isolate(memory_limit: int, parent: int) -> None:
    """Own the protocol channel, bound memory, ignore SIGINT, die with the parent."""
    global _PROTOCOL
    _PROTOCOL = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the protocol
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(0)  # the parent is already gone
    if memory_limit > 0:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
        except (ImportError, ValueError, OSError):
            pass


class _State:
    def __init__(self) -> None:
        self.feeds: dict[str, Any] = {}
        self.given: list[str] = []
        self.seed = 0
        self.expected: dict[str, Any] = {}
        self.names: list[str] = []
        self.session: Any = None  # the original's, until another model is loaded
        self.prepare: dict[str, Any] = {}
        self.sets: list[dict[str, Any]] = []  # {"set": description, "expected": outputs}
        self.parked: Any = None  # a session to free once the answer is sent


def _prepare(state: _State, request: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from passes.verify import npz

    _phase("loading the original model")
    try:
        session = _session(request["model"])
    except Exception as e:  # noqa: BLE001  onnxruntime's exceptions share no base class
        return {"ok": False, "stage": "load", "error": _first_line(e)}
    given: dict[str, Any] = {}
    if request.get("given"):
        _phase("reading the given inputs")
        given = npz.load(request["given"]["path"], request["given"]["names"], request["given"].get("raw"))
    attempts = []
    tries = request["tries"] or [{"dims": {}, "inputs": {}}]
    state.sets, state.session = [], None
    for number, attempt in enumerate(tries, 1):
        feeds = _generated(given, attempt["inputs"], request.get("seed", 0))
        _phase(f"running the original model, try {number} of {len(tries)}")
        start = time.perf_counter()
        try:
            outputs = _run(session, feeds)
        except Exception as e:  # noqa: BLE001
            attempts.append({"dims": attempt["dims"], "error": _first_line(e)})
            if isinstance(e, MemoryError) or "alloc" in str(e).lower():
                break
            continue
        seconds = time.perf_counter() - start
        state.feeds, state.given, state.seed, state.prepare = feeds, list(given), request.get("seed", 0), request
        state.names = [o.name for o in session.get_outputs()]
        state.session = session
        state.expected = _spill(dict(zip(state.names, outputs)), request.get("spill_dir", ""),
                                int(request.get("spill_bytes", 1 << 28)))  # fmt: skip
        return {
            "ok": True,
            "try": number,
            "attempts": attempts,
            "seconds": seconds,
            "shapes": {k: list(np.shape(v)) for k, v in feeds.items()},
            "outputs": {name: _describe(value) for name, value in state.expected.items()},
        }
    return {"ok": False, "stage": "run", "attempts": attempts, "error": attempts[-1]["error"] if attempts else ""}


def _generated(given: dict[str, Any], inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = dict(given)
    for name, spec in inputs.items():
        feeds[name] = np.asarray(_generate(spec, rng))
    return feeds


def _set_feeds(state: _State, description: dict[str, Any] | None) -> dict[str, Any]:
    """The inputs of a set (None: the chosen ones), made again from its description."""
    if description is None:
        return state.feeds
    kind = description["kind"]
    if kind == "sizes":  # other sizes, or (--precision) other seeds
        return _generated({k: state.feeds[k] for k in state.given}, description["inputs"],
                          description.get("seed", state.seed))
    from passes.verify import edges

    return edges.edge_feeds(state.feeds, set(description.get("keep", ())), state.seed,
                            nonfinite=kind == "nonfinite")  # fmt: skip


def _add_set(state: _State, request: dict[str, Any]) -> dict[str, Any]:
    """Runs the original on one more set of inputs and keeps its outputs."""
    import numpy as np

    description = request["set"]
    label = description.get("label", description["name"])
    if state.session is None:
        _phase("loading the original model again")
        state.session = _session(state.prepare["model"])
    _phase(f"making the {label} inputs")
    feeds = _set_feeds(state, description)
    _phase(f"running the original model on the {label} inputs")
    start = time.perf_counter()
    try:
        outputs = _run(state.session, feeds)
    except Exception as e:  # noqa: BLE001  onnxruntime's exceptions share no base class
        return {"ok": False, "error": _first_line(e)}
    seconds = time.perf_counter() - start
    threshold = int(state.prepare.get("spill_bytes", 1 << 28)) // 4  # several sets' outputs wait together
    expected = _spill(dict(zip(state.names, outputs)), state.prepare.get("spill_dir", ""), threshold,
                      f"{description['name']}-{len(state.sets)}")  # fmt: skip
    state.sets.append({"set": description, "expected": expected})
    return {"ok": True, "seconds": seconds, "shapes": {k: list(np.shape(v)) for k, v in feeds.items()}}


def _tolerance(tolerances: dict[str, Any], name: str) -> tuple[float | None, float | None]:
    pair = tolerances.get(name)
    return (None, None) if pair is None else (float(pair[0]), float(pair[1]))


def _compare(state: _State, request: dict[str, Any]) -> dict[str, Any]:
    from passes.verify.compare import compare

    state.session = None  # one session at a time
    _phase("loading the optimised model")
    try:
        session = _session(request["model"])
        names = [o.name for o in session.get_outputs()]
        _phase("running the optimised model")
        half_io = bool(request.get("half_io"))
        actual = _run(session, state.feeds, half_io=half_io)
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "stage": "run", "error": _first_line(e)}
    _phase("comparing the outputs")
    by_name = dict(zip(names, actual))
    del actual
    tolerances = request.get("tolerances", {})
    comparisons = []
    for name in state.names:
        if name not in by_name:
            comparisons.append({"name": name, "ok": False, "message": "missing from the optimised model"})
            continue
        rtol, atol = _tolerance(tolerances, name)
        comparisons.append(compare(name, state.expected[name], by_name.pop(name), rtol, atol,
                                   normwise=_normwise(None, False, half_io), widen=half_io).to_json())  # fmt: skip
    for name in names:
        if name not in state.names:
            comparisons.append({"name": name, "ok": False, "message": "not an output of the original model"})
    del by_name
    rounding = bool(request.get("rounding"))
    sets = [_compare_set(state, kept, session, names, tolerances, rounding, half_io) for kept in state.sets]
    state.parked = session  # freed once the answer is out
    return {"ok": True, "outputs": comparisons, "sets": sets}


def _release(state: _State, request: dict[str, Any]) -> dict[str, Any]:
    """Drops the original's session (``again`` loads it anew if needed); its outputs stay."""
    state.session = None
    return {"ok": True}


def _normwise(kind: str | None, rounding: bool, half: bool = False) -> bool:
    """Compare a set's finite values also against the output's largest magnitude: for the
    edge-value sets (sums of 1e30 terms that cancel) when a pass changed float rounding (a fusion
    ran), and for every set of a ``--precision`` model (``half``): its rounding errors scale with
    the values the computation carries, not with each output element (an output near 0 made of
    terms near 1 is off by the terms' rounding); an exact rewrite is held to the element-wise
    tolerance on every set."""
    return half or (rounding and kind in ("edge", "nonfinite"))


def _compare_set(state: _State, kept: dict[str, Any], session: Any, names: list[str],
                 tolerances: dict[str, Any], rounding: bool, half_io: bool = False) -> dict[str, Any]:  # fmt: skip
    """Runs the optimised model on one more set and compares: the outputs that differ (only)."""
    from passes.verify.compare import compare

    label = kept["set"].get("label", kept["set"]["name"])
    feeds = _set_feeds(state, kept["set"])
    _phase(f"running the optimised model on the {label} inputs")
    try:
        values = dict(zip(names, _run(session, feeds, half_io=half_io)))
    except Exception as e:  # noqa: BLE001
        return {"name": kept["set"]["name"], "ok": False, "error": _first_line(e), "outputs": []}
    del feeds
    _phase(f"comparing the outputs on the {label} inputs")
    differ, within_scale = [], {}
    normwise = _normwise(kept["set"]["kind"], rounding, half_io)
    for name in state.names:
        if name in values:
            rtol, atol = _tolerance(tolerances, name)
            found = compare(name, kept["expected"][name], values.pop(name), rtol, atol, normwise=normwise,
                            widen=half_io)  # fmt: skip
            if not found.ok:
                differ.append(found.to_json())
            elif found.within_scale:
                within_scale[name] = found.within_scale
    return {"name": kept["set"]["name"], "ok": not differ, "outputs": differ, "within_scale": within_scale}


def _again(state: _State, request: dict[str, Any]) -> dict[str, Any]:
    """Runs the original twice more on one set (``set``: a kept set's name; None: the chosen inputs)
    and compares the named outputs of each run with its first run's: those on which it disagrees
    with itself. Twice: a new session may repeat its first run's draws (a random op without a seed)."""
    from passes.verify.compare import compare

    chosen = [kept for kept in state.sets if kept["set"]["name"] == request.get("set")]
    expected = chosen[0]["expected"] if chosen else state.expected
    if state.session is None:
        _phase("loading the original model again")
        state.session = _session(state.prepare["model"])
    feeds = _set_feeds(state, chosen[0]["set"] if chosen else None)
    tolerances = request.get("tolerances", {})
    noisy: dict[str, float] = {}
    for run in (1, 2):
        _phase(f"running the original model again on the same inputs ({run} of 2)")
        try:
            again = dict(zip(state.names, _run(state.session, feeds)))
        except Exception as e:  # noqa: BLE001  onnxruntime's exceptions share no base class
            return {"ok": False, "error": _first_line(e)}
        for name in request["names"]:
            if name in again:
                rtol, atol = _tolerance(tolerances, name)
                found = compare(name, expected[name], again[name], rtol, atol)
                if not found.ok:
                    noisy[name] = max(noisy.get(name, 0.0), found.max_abs_error)
    return {"ok": True, "noisy": noisy}


def _values(state: _State, request: dict[str, Any]) -> dict[str, Any]:
    """Compares named values of two models run on the kept inputs, a chunk of names at a time."""
    from passes.verify.compare import compare

    state.session = None
    chosen = [kept["set"] for kept in state.sets if kept["set"]["name"] == request.get("set")]
    feeds = _request_feeds(state, request)
    normwise = bool(request.get("normwise")) or bool(chosen) and _normwise(
        chosen[0]["kind"], bool(request.get("rounding")), bool(request.get("half_io")))
    _phase("loading the models with extra outputs")
    try:
        original = _session(request["original"])
        optimized = _session(request["optimized"])
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "stage": "load", "error": _first_line(e)}
    names = list(request["names"])
    tolerances = request.get("tolerances", {})
    budget = int(request.get("budget", 1 << 28))
    found: dict[str, Any] = {}
    chunk, start = 64, 0
    while start < len(names):
        part = names[start : start + chunk]
        _phase(f"comparing values {start + 1}..{start + len(part)} of {len(names)}")
        try:
            expected = _run(original, feeds, part)
            actual = _run(optimized, feeds, part, half_io=bool(request.get("half_io")))
        except Exception as e:  # noqa: BLE001
            if len(part) > 1:  # one bad value must not hide the others
                chunk = max(1, len(part) // 4)
                continue
            found[part[0]] = {"error": _first_line(e)}
            start += 1
            continue
        size = 0
        for name, e_value, a_value in zip(part, expected, actual):
            rtol, atol = _tolerance(tolerances, name)
            result = compare(name, e_value, a_value, rtol, atol, normwise=normwise)
            size += getattr(e_value, "nbytes", 0)
            found[name] = {"ok": result.ok, "max_abs_error": result.max_abs_error, "message": result.message}
        del expected, actual
        start += len(part)
        chunk = max(1, min(1024, int(chunk * budget / max(size, 1)))) if size else min(1024, chunk * 2)
    return {"ok": True, "values": found}


def _request_feeds(state: _State, request: dict[str, Any]) -> dict[str, Any]:
    """A request's inputs: ``feeds`` (saved values), else the kept set ``set`` names (none: the chosen)."""
    from passes.verify.repro_child import load_feeds

    chosen = [kept["set"] for kept in state.sets if kept["set"]["name"] == request.get("set")]
    return load_feeds(request["feeds"]) if "feeds" in request else _set_feeds(state, chosen[0] if chosen else None)


def _repro(state: _State, request: dict[str, Any]) -> dict[str, Any]:
    """``capture`` and ``regions`` (``--repro``: see :mod:`passes.verify.repro_child`)."""
    from passes.verify import repro_child

    state.session = None
    _phase(f"{request['op']} for the reproduction")
    if request["op"] == "regions":
        return repro_child.regions(request, _first_line)
    return repro_child.capture(request, _request_feeds(state, request), _first_line)


def _magnitudes(state: _State, request: dict[str, Any]) -> dict[str, Any]:
    """The largest finite magnitude of each named value of a model (the original with them, or
    scalars made of them, as outputs) over the chosen inputs and every kept set (``--precision``'s
    range islands), ``chunk`` a run, in node order if ``ordered``; the names that held NaN or inf."""
    import numpy as np

    state.session = None
    _phase("loading the original model with extra outputs")
    try:
        session = _session(request["model"], ordered=bool(request.get("ordered")))
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "stage": "load", "error": _first_line(e)}
    names = list(request["names"])
    nonfinite: set[str] = set()
    chunk = max(1, int(request.get("chunk", 64)))  # values fetched per run (scalars: all at once)
    largest: dict[str, float] = {}
    for kept in [None, *(k["set"] for k in state.sets)]:
        feeds = _set_feeds(state, kept)
        for start in range(0, len(names), chunk):
            part = names[start : start + chunk]
            _phase(f"measuring values {start + 1}..{start + len(part)} of {len(names)}")
            try:
                values = _run(session, feeds, part)
            except Exception:  # noqa: BLE001  a set the values cannot be fetched on says nothing
                continue
            for name, value in zip(part, values):
                if isinstance(value, np.ndarray) and value.size and value.dtype.kind == "f":
                    mask = np.isfinite(value)
                    if not mask.all():
                        nonfinite.add(name)
                    finite = np.abs(value[mask])
                    if finite.size:
                        largest[name] = max(largest.get(name, 0.0), float(finite.max()))
    return {"ok": True, "values": largest, "nonfinite": sorted(nonfinite)}


def _constants(state: _State, request: dict[str, Any]) -> dict[str, Any]:
    """``constants``: see :func:`passes.verify.ort_io.constants`."""
    return _constants_of(request, _phase)


def main() -> None:
    memory_limit = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    parent = int(sys.argv[2]) if len(sys.argv) > 2 else os.getppid()
    _isolate(memory_limit, parent)
    state = _State()
    handlers = {"prepare": _prepare, "add_set": _add_set, "compare": _compare, "values": _values,
                "constants": _constants, "magnitudes": _magnitudes, "again": _again, "capture": _repro,
                "regions": _repro, "release": _release, "default_load": lambda _, r: _default_session(r, _phase)}
    try:
        import numpy  # noqa: F401
        import onnxruntime  # noqa: F401

        startup = None
    except BaseException as e:  # noqa: BLE001  under a tight memory bound an import fails oddly
        startup = f"{type(e).__name__}: {_first_line(e)}"
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "exit":
            break
        if startup is not None:
            _send({"result": {"ok": False, "stage": "startup", "error": startup}})
            continue
        try:
            result = handlers[request["op"]](state, request)
        except MemoryError:
            result = {"ok": False, "stage": "memory", "error": "out of memory"}
        except Exception as e:  # noqa: BLE001  reported to the parent, which decides
            result = {"ok": False, "stage": "internal", "error": f"{type(e).__name__}: {_first_line(e)}"}
        _send({"result": result})
        state.parked = None


if __name__ == "__main__":
    main()
