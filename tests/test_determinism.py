"""A refactor must not change what the pipeline computes: bitwise the same weights.

``tests/data/determinism.json`` was recorded by ``tests/determinism_run.py`` before the driver,
the backends and the dashboard were split into their present modules. With the same
TensorFlow, Keras, numpy and CPU architecture the run must reproduce it bit for bit. With other
versions (``make test-oldest``) the recorded bits cannot apply, so the test checks the weaker
property that still catches most mistakes: two fresh processes agree bit for bit.
To re-record after a deliberate change of the numbers, run
``python tests/determinism_run.py > tests/data/determinism.json`` and say why in the commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def _run() -> dict:
    out = subprocess.run([sys.executable, str(HERE / "determinism_run.py")], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_an_inline_run_gives_the_recorded_weights_bit_for_bit():
    recorded = json.loads((HERE / "data" / "determinism.json").read_text())
    now = _run()
    if now["versions"] == recorded["versions"]:
        assert now == recorded
    else:  # other library versions: the recorded bits do not apply; determinism still must
        again = _run()
        assert now == again
        assert now["updates"] == recorded["updates"]
