"""Rendering of ``dlcloud jobs metrics``: a terminal line chart per metric, a summary table, CSV.

The input is the API's answer, ``JobMetrics``: the job and its series (``metric``, ``attempt``, ``replica``,
``points`` of ``step``, ``value``, ``time``, ``downsampled``). A chart is drawn only on a terminal at least
``MIN_CHART_WIDTH`` columns wide; elsewhere the summary table alone is printed, so piped output stays plain text.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from datetime import datetime
from typing import IO, Any

from pydantic import TypeAdapter

from dlcloud.cli.output import Output, console, render
from dlcloud.schemas.metrics import JobMetrics, MetricSeries

MIN_CHART_WIDTH = 60
CHART_HEIGHT = 18
CSV_HEADER = ("metric", "attempt", "replica", "step", "value", "time")
_TIME = TypeAdapter(datetime)  # a point's time in the CSV as the API wrote it


def series_label(series: MetricSeries) -> str:
    """``attempt 2`` or ``attempt 2 worker-1``."""
    label = f"attempt {series.attempt}"
    return f"{label} {series.replica}" if series.replica else label


def by_metric(answer: JobMetrics) -> dict[str, list[MetricSeries]]:
    """The series grouped by metric, metrics in the order the API gave them."""
    groups: dict[str, list[MetricSeries]] = {}
    for s in answer.series:
        groups.setdefault(s.metric, []).append(s)
    return groups


def _number(value: float) -> str:
    return f"{value:.6g}"


def summary_rows(answer: JobMetrics) -> list[dict[str, Any]]:
    """One row per series: its last value, min and max (a view of the CLI's own, so plain mappings)."""
    rows = []
    for s in answer.series:
        values = [p.value for p in s.points if math.isfinite(p.value)]
        last = s.points[-1] if s.points else None
        points = str(len(s.points)) + (" (downsampled)" if s.downsampled else "")
        rows.append(
            {
                "metric": s.metric,
                "attempt": s.attempt,
                "replica": s.replica or None,
                "points": points,
                "last_step": last.step if last else None,
                "last": _number(last.value) if last else None,
                "min": _number(min(values)) if values else None,
                "max": _number(max(values)) if values else None,
            }
        )
    return rows


def print_summary(answer: JobMetrics) -> None:
    render(
        summary_rows(answer),
        Output.table,
        [
            ("METRIC", "metric"),
            ("ATTEMPT", "attempt"),
            ("REPLICA", "replica"),
            ("POINTS", "points"),
            ("LAST STEP", "last_step"),
            ("LAST", "last"),
            ("MIN", "min"),
            ("MAX", "max"),
        ],
    )


def write_csv(answer: JobMetrics, out: IO[str]) -> None:
    """Rows ``metric,attempt,replica,step,value,time``, a header first."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for s in answer.series:
        for p in s.points:
            writer.writerow((s.metric, s.attempt, s.replica, p.step, p.value, _TIME.dump_python(p.time, mode="json")))


def chart(metric: str, series: Sequence[MetricSeries], width: int, height: int = CHART_HEIGHT) -> str:
    """A line chart of ``metric``, one line per series, ``width`` x ``height`` terminal cells."""
    import plotext  # only this command draws; `dlcloud --help` stays fast

    fig = plotext.figure
    fig.clear()
    fig.theme("simple")
    fig.plot_size(width, height)
    fig.title(metric)
    fig.label("step", "x")
    for s in series:
        if not s.points:
            continue
        signal = fig.signal([p.step for p in s.points], [p.value for p in s.points])
        signal.lines()
        signal.label(series_label(s))
        fig.draw(signal)
    text = fig.build().string()
    fig.clear()
    return str(text)


def can_chart() -> bool:
    return console.is_terminal and console.width >= MIN_CHART_WIDTH


def show(answer: JobMetrics) -> None:
    """Charts on a wide enough terminal, then the summary table; the table alone elsewhere."""
    groups = by_metric(answer)
    if not groups:
        console.print(f"no metrics for job {answer.job} yet")
        return
    if can_chart():
        for metric, series in groups.items():
            console.file.write(chart(metric, series, min(console.width, 160)) + "\n")
        console.file.flush()
    print_summary(answer)
