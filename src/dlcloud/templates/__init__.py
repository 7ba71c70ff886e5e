"""No-code training templates: classic networks trained on a user's CSV or LibSVM file (docs/templates.md).

Purpose: ``dlcloud jobs submit --template mlp --data train.csv --label y --hparam layers=3`` submits an
ordinary job whose command is ``python -m dlcloud.templates.train ...`` (built at submit from the spec's
``template`` section by ``catalog.command_for``); inside the job the trainer loads the data
(``data.py``), builds the network (``networks.py``), trains it with early stopping, reports metrics each
epoch with ``dlcloud.report`` and exports a TorchScript model with its signature into
``$DLCLOUD_OUTPUT_DIR/model``.

Invariants:
- ``catalog`` is the one table of templates and their hyperparameters (types, defaults, bounds); the API
  validates a spec with it at submit (400 naming what is allowed) and the trainer validates again with the
  same table, so a hyperparameter is never accepted by one and refused by the other.
- ``catalog`` and ``data`` import no ML library (the API server imports ``catalog``); torch is imported by
  ``networks`` and ``train`` only, inside the job.
- Data errors name the line (1-based, as an editor shows it) and what was wrong.

Vocabulary: a *template* is a network family (``mlp``, ``cnn1d``, ...); *hyperparameters* (hparams) are its
named settings; the *export* is the ``model`` directory (``model.pt``, ``signature.json``, ``classes.json``).
"""
