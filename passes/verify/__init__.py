"""The onnxruntime before/after check.

* ``result``: what a check found (plain data, no onnxruntime import).
* ``check``: :func:`~passes.verify.check.check` and the :class:`~passes.verify.check.Checker`
  session; imports onnx, not onnxruntime; ``original``: its original's side (inputs chosen, runs on
  every set: once, then reused); ``early``: that side while the passes run; ``handoff``: the check's
  child lent to the precision search, and its checker handed to the final check.
* ``feeds``: what each graph input feeds (its dims' roles, index ranges); ``plan``: the sizes
  to try, the larger and the 0-sized sets; ``lowest``: the float type that chooses each tolerance.
* ``sets``: the sets of inputs after the chosen one and the original's runs on them (the budget);
  ``verdict``: the verdict from the child's answers (the original's own noise left out);
  ``values``: the locator's and the magnitudes' runs.
* ``child`` / ``worker``: the child process that runs onnxruntime (the worker
  imports numpy, onnxruntime, ``compare``, ``npz`` and ``result`` only).
* ``edges``: the edge-value inputs (numpy only; made in the child).
* ``compare``: one output against another, in bounded memory (the sign of zero included).
* ``npz``: ``--inputs FILE.npz`` read from its directory and headers first.
* ``locate``: after a mismatch, the first node whose output differs.
* ``repro`` (``--repro DIR``), ``reduce``, ``ddmin``, ``descend``, ``region``, ``repro_child``:
  the smallest pair of models that still differ, written for a bug report.
"""
