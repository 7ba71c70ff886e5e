"""The dlcloud model server: loaders, dynamic batching, the KServe V2 and TF Serving REST protocols.

Layout (model lifecycle, protocol logic and HTTP endpoints are kept apart):

- ``types.py``      tensor specs, signatures, the V2 datatype <-> NumPy tables.
- ``loaders/``      one ``Predictor`` per format (TorchScript, ONNX, scikit-learn, XGBoost, SavedModel,
                    custom Python); ``detect_format`` recognises a format from a path. Heavy libraries
                    are imported inside ``Predictor.load`` only.
- ``batching.py``   per-model-version dynamic batcher: one future per request, flush on size or deadline,
                    bounded queue (``Overloaded`` carries Retry-After), per-request timeouts.
- ``repository.py`` the served models and their versions: version policy, load / warm up / swap / drain /
                    unload, labels, directory watching.
- ``pipeline.py``   several models behind one name: preprocess once, fan out, combine.
- ``protocol/``     wire formats: ``v2.py`` (JSON + binary tensor extension), ``tfserving.py``; pure
                    functions from bytes to requests and from results to bytes.
- ``app.py``        the Starlette application: routes call the protocol and the repository only.

Invariants: inference never runs on the event loop; a request is routed to exactly one loaded version and
that version is not unloaded while the request is in flight; every error a client can cause is a
``ServingError`` with a status code and a message that says what was wrong.

This package imports nothing from dlcloud but ``errors``/``settings``-level modules, so it can be installed
and run on its own (``dlcloud serve``).
"""
