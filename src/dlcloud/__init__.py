"""dlcloud: a self-hosted cloud deep-learning platform.

Inside a job, ``dlcloud.report(step=3, loss=0.2)`` sends metrics to the platform (docs/metrics.md). Importing
``dlcloud`` imports nothing else: the reporter loads on the first ``report``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def report(step: int | None = None, **metrics: Any) -> None:
    """Record this job's metrics at ``step``; buffered and sent in the background, never raises.

    Args:
        step: an int >= 0; default one more than this process's previous automatic step (0 first).
        **metrics: name=number; names are 1-128 characters of ``A-Z a-z 0-9 _ . - /`` (pass
            ``**{"train/loss": x}`` for a name with a slash), values finite numbers. A bad name or value is
            dropped with one warning. Outside a dlcloud job (no ``DLCLOUD_METRICS_URL``) this is a no-op.
    """
    # lazy: every dlcloud module imports this package first; httpx and the reporter load when a job reports
    from dlcloud.reporter import report as _report

    _report(step, **metrics)


def flush(timeout: float = 5.0) -> bool:
    """Send the metrics buffered by :func:`report` now; wait at most ``timeout`` seconds.

    Returns:
        True when nothing is left to send.
    """
    from dlcloud.reporter import flush as _flush  # lazy, as in report

    return _flush(timeout)


__all__ = ["__version__", "flush", "report"]
