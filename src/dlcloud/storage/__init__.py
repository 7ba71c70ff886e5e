"""Artifacts on disk: uploaded code (validated archives, wheels, sdists).

Invariant: a file reaches its final path only after it was fully received, its checksum matched and
its contents passed validation (``archives.py``); anything else is deleted, so nothing half-written
remains.
"""
