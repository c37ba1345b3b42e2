"""The live dashboard of a run: widgets, the pipeline diagram, figures and a terminal view.

    from impala_lab import Impala
    from impala_lab.dashboard import Dashboard

    impala = Impala(env="CartPole-v1")
    Dashboard(impala).show()          # the widgets; they keep moving on their own
    impala.start(max_seconds=300)     # background training: the cell returns
    impala.set_knobs(lr=1e-3)         # or move the lr slider
    impala.pause()                    # or the pause button; impala.stop() ends the run

    impala.train(stop={"episode_return_mean": 475}, dashboard=True)   # blocking variant

Modules:

- `widgets`: `Dashboard`, the layout of core ipywidgets, kept in step with the run;
- `markup`: the HTML of each widget, pure functions of a stats snapshot;
- `controls`: the knob sliders (from `impala_lab.knobs`) and the buttons;
- `poller`: the thread that updates the widgets a few times a second;
- `plot_schedule`: which plot to draw next, where, within what CPU;
- `diagram`: the pipeline SVG and the timing bars;
- `frame_strip`: the last observations of one worker's env, when they are images;
- `plots`: matplotlib figures from a live run or a ``metrics.csv`` (the CLI's ``report.png``);
- `plot_data`: the columns those figures draw, from a history or a ``metrics.csv``;
- `live_plots`: the same figures redrawn cheaply for the dashboard, in a child process;
- `terminal`: the text view (the CLI's live panel; ``show()`` without a notebook frontend);
- `labels` and `format`: what each figure is called and how its number is written.

Frontends (all use ipywidgets 8's core widgets; nothing to install beyond the package):

- JupyterLab 4: works as is (``jupyterlab_widgets`` comes with ipywidgets). ``make lab``
  starts it on 127.0.0.1. The browser test (tests/test_browser_dashboard.py) drives this one.
- Jupyter Notebook 7: works as is; it is built from JupyterLab's components and uses the
  same widget manager (``jupyter notebook``).
- VS Code (Jupyter extension): works; choose the project's .venv as the kernel. VS Code
  renders core ipywidgets 8 itself. Updates from the poller thread show live as in JupyterLab.
- Voila: ``voila notebook.ipynb`` runs the notebook and shows only its outputs. Use
  ``impala.start(...)`` in it, not a blocking ``train()`` (Voila waits for the cells before
  the page is usable); the widgets then keep moving and the buttons and knobs work.
- No frontend (a script, a terminal IPython, CI): ``show()`` prints the text view, and
  ``train(dashboard=True)`` prints it at every report (redrawn in place in a TTY).

The dashboard stays modest: the poller runs at 4 Hz (about 1 % of a core), the plots are
drawn in a separate process within ``plot_budget`` (6 % of a core);
``python -m bench.dashboard_overhead`` measures the throughput with and without it.

Scripts (no notebook) that call ``start_polling()`` themselves need the usual
``if __name__ == "__main__":`` guard, as with the process backend: the plot process is
spawned.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:  # pragma: no cover
    from impala_lab.dashboard.diagram import PipelineDiagram, pipeline_svg
    from impala_lab.dashboard.terminal import TerminalView
    from impala_lab.dashboard.widgets import Dashboard, frontend_available



def __getattr__(name: str) -> Any:
    """A name of `_LAZY` is imported from its module on first use (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
