"""The onnxruntime before/after check.

``passes.verify.result`` holds what a check found (no onnxruntime import);
``passes.verify.check`` runs it. Import the latter only when checking: it
imports onnxruntime.
"""
