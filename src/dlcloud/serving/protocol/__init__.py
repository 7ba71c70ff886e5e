"""Wire formats of the model server: pure functions from request bytes to arrays and from arrays to bytes.

- ``v2.py``         KServe V2 / Open Inference Protocol REST with Triton's binary tensor extension
                    (what ``tritonclient.http`` speaks), plus the metadata and model-config documents.
- ``tfserving.py``  TensorFlow Serving REST v1: ``:predict`` in row and columnar form, ``:classify`` /
                    ``:regress``, model status and metadata, URL parsing.
- ``_tensors.py``   JSON <-> NumPy conversions both share.
- ``_json.py``      reading JSON bodies: ``msgspec`` (fast), with ``json`` for what it refuses.

Invariants: nothing here does I/O, touches a model or imports an HTTP framework; every malformed request
raises a ``ServingError`` subclass (400, 413, 415) whose message names the tensor and says what was expected
and what arrived. Arrays decoded from binary data are read-only views into the request body (no copy, unless
unaligned).

Vocabulary: *binary part* is the bytes after the JSON header of a V2 request or response; *row format* is
TF Serving's ``instances``, *columnar format* its ``inputs``.
"""
