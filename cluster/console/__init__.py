"""The console: the only rich user (docs/architecture.md). Commands import it as ``ui``.

``base`` (the consoles, safe text, JSON, warnings and errors), ``tables`` (static renderings),
``live`` (live views, each a Reporter driven by events) and ``liveview`` (the live views'
numbers, pure).
"""
from __future__ import annotations

from .base import (STATE_STYLES, OutputStream, escape, make_consoles, print_json, render_error, render_warnings,
                   visible)
from .live import BenchProgress, EventLineReporter, ProgramOutput, RichReporter, TrainDisplay
from .tables import (host_line, render_bench, render_checks, render_job_line, render_plan, render_run_report, render_runs,
                     render_status, render_summary, render_supervisor)

__all__ = ["STATE_STYLES", "BenchProgress", "EventLineReporter", "OutputStream", "ProgramOutput", "RichReporter",
           "TrainDisplay", "escape", "host_line", "make_consoles", "print_json", "render_bench", "render_checks",
           "render_error", "render_job_line", "render_plan", "render_run_report", "render_runs", "render_status",
           "render_summary", "render_supervisor", "render_warnings", "visible"]
