"""The control plane: the background loops of the leader control-plane process.

The control loop (``loop.py``) and what it drives each tick: the scheduling pass (``scheduling.py`` with its
queue cache, tenant view and planner inputs), supervision (``supervision.py``, ``gangs.py``), workload building
(``workloads.py``), ports (``ports.py``), the study driver (``study_driver.py``, ``asha.py``), environment builds
(``env_builder.py``); beside it, TensorBoard event-file ingestion (``tensorboard.py``, on ``fair_pool.py``) and
leadership (``leader.py``). The control plane imports ``services/`` for the business rules (the state machines,
admission, jobs); ``services/`` never imports it: a request wakes the loop through ``Platform.wake``.
"""
