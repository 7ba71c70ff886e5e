"""Business rules. Each function owns its transaction (``db.write()`` / ``db.read()``) and returns
pydantic read models or frozen dataclasses, never ORM rows. Services never import FastAPI.

State machines: ``services/job_states.py`` owns every job state change.
"""
