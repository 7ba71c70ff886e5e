"""Placement decisions: pure functions over plain values (no database, no processes).

Modules: ``contract`` (what a pass is given and decides), ``planner`` (``plan()``: dispatch), ``policies`` (a
package: fifo, priority-backfill, las and fair-share, one module each, and the pass state), ``placement``
(node-aware best fit), ``backfill`` (reservations), ``preemption`` (victims), ``inventory`` (what a host offers).

Invariants, every policy:
- Hard caps (a tenant's quota) always hold; a job over them waits and does not hold up other tenants.
- A job in its restart backoff, or held above the planner, waits and does not hold up others.
- GPUs are assigned exclusively by index; a process's GPUs are on one node, a gang's replicas each on one node.
- FIFO (the default of ``plan()``): priority, then FIFO (creation time, then id) as given; a job that does not fit
  blocks every job behind it (no backfill), so large jobs are never starved by a stream of small ones.
- priority-backfill and fair-share never let a job start where it would delay the reserved head of the line,
  except (fair-share) preemptible, borrowed fill that the head job may preempt, or a job inside its guarantee
  ahead of a borrowing head; las is work-conserving (no reservation). Preemptions stop whole attempts.
"""
