"""Placement decisions: pure functions over plain values (no database, no processes).

Invariants:
- Order: higher priority first, FIFO (creation time, then id) within a priority.
- A job over its tenant's quota waits and does not hold up other tenants.
- A job that does not fit the free capacity blocks every job behind it (no backfill), so large jobs
  are never starved by a stream of small ones.
- A job in its restart backoff waits and does not hold up others.
- GPUs are assigned exclusively by index.
"""
