"""The live dashboard of a run: widgets, the pipeline diagram, figures and a terminal view.

    from impala_lab import Impala
    from impala_lab.dashboard import Dashboard

    impala = Impala(env="CartPole-v1")
    Dashboard(impala).show()          # the widgets; they keep moving on their own
    impala.start(max_seconds=300)     # background training: the cell returns
    impala.set_knobs(lr=1e-3)         # or move the lr slider
    impala.pause()                    # or the pause button; impala.stop() ends the run

    impala.train(stop={"episode_return_mean": 475}, dashboard=True)   # blocking variant

Frontends: docs/installation.md. Scripts that call ``start_polling()`` need the
``if __name__ == "__main__":`` guard: the plot process is spawned.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Dashboard", "frontend_available", "PipelineDiagram", "pipeline_svg",
           "TerminalView"]

_LAZY = {  # importing the package stays cheap: the CLI only needs the terminal view
    "Dashboard": "impala_lab.dashboard.widgets",
    "frontend_available": "impala_lab.dashboard.widgets",
    "PipelineDiagram": "impala_lab.dashboard.diagram",
    "pipeline_svg": "impala_lab.dashboard.diagram",
    "TerminalView": "impala_lab.dashboard.terminal",
    "train_with_dashboard": "impala_lab.dashboard.train_with_dashboard",
}


def __getattr__(name: str) -> Any:
    """A name of `_LAZY` is imported from its module on first use (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
