"""The onnxruntime before/after check.

* ``result``: what a check found (plain data, no onnxruntime import).
* ``check``: :func:`~passes.verify.check.check` and the :class:`~passes.verify.check.Checker`
  session; imports onnx, not onnxruntime.
* ``plan``: what the check reads from the original graph (input sizes to try,
  index ranges, the float type that chooses each tolerance).
* ``child`` / ``worker``: the child process that runs onnxruntime (the worker
  imports numpy, onnxruntime, ``compare``, ``npz`` and ``result`` only).
* ``edges``: the edge-value inputs (numpy only; made in the child).
* ``compare``: one output against another, in bounded memory (the sign of zero included).
* ``npz``: ``--inputs FILE.npz`` read from its directory and headers first.
* ``locate``: after a mismatch, the first node whose output differs.
* ``repro`` (``--repro DIR``), ``reduce``, ``ddmin``, ``descend``, ``region``, ``repro_child``:
  the smallest pair of models that still differ, written for a bug report.
"""
