"""`impala_lab.speed.lean_imports`: the command line's TensorFlow import without Keras's optional
modules, and nothing blocked anywhere else."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from impala_lab.cli.main import main
from impala_lab.speed import lean_imports as lean


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A module ``lean_probe`` that is not imported yet, and a process where TensorFlow and
    Keras count as not loaded (both restored afterwards)."""
    (tmp_path / "lean_probe.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lean_probe", raising=False)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.delitem(sys.modules, "keras", raising=False)
    monkeypatch.setattr(lean, "_enabled", False)
    yield
    sys.modules.pop("lean_probe", None)


def test_nothing_is_blocked_unless_enabled(fresh):
    with lean.lean_imports(("lean_probe",)) as blocked:
        import lean_probe
    assert blocked == []
    assert lean_probe.VALUE == 7


def test_enabled_blocks_inside_and_restores_after(fresh):
    lean.enable()
    with lean.lean_imports(("lean_probe",)) as blocked:
        assert blocked == ["lean_probe"]
        with pytest.raises(ImportError, match="lean_probe"):
            import lean_probe
    assert "lean_probe" not in sys.modules  # the marker is gone
    import lean_probe

    assert lean_probe.VALUE == 7


def test_an_imported_module_is_never_touched(fresh):
    import lean_probe

    lean.enable()
    with lean.lean_imports(("lean_probe",)) as blocked:
        assert blocked == []
        assert sys.modules["lean_probe"] is lean_probe
    assert sys.modules["lean_probe"] is lean_probe


def test_nothing_is_blocked_once_tensorflow_is_loaded(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", object())
    lean.enable()
    with lean.lean_imports(("lean_probe",)) as blocked:
        import lean_probe
    assert blocked == []
    assert lean_probe.VALUE == 7


def test_only_the_program_itself_enables_it(monkeypatch, capsys):
    monkeypatch.setattr(lean, "_enabled", False)
    assert main(["config"]) == 0  # called with arguments: a test, a notebook, a script
    assert not lean.enabled()
    monkeypatch.setattr(sys, "argv", ["impala-lab", "config"])
    assert main() == 0  # the console script and python -m call main() without them
    assert lean.enabled()
    capsys.readouterr()


def test_keras_and_tensorflow_load_without_the_optional_modules():
    """In a fresh interpreter: the learner's import leaves the optional modules unloaded,
    Keras and TensorFlow work, and each module (those installed) can still be imported after."""
    code = textwrap.dedent("""
        import importlib, importlib.util, json, sys
        from impala_lab.speed import lean_imports as lean
        lean.enable()
        with lean.lean_imports() as blocked:
            from impala_lab.learner.vtrace_policy import VTracePolicy  # keras, tensorflow
        loaded = [n for n in lean.OPTIONAL_MODULES if n in sys.modules]
        import keras, tensorflow as tf
        layer = keras.layers.Dense(3)
        out = layer(tf.ones([2, 4]))
        installed = [n for n in lean.OPTIONAL_MODULES
                     if importlib.util.find_spec(n) is not None]
        import matplotlib.pyplot, pandas, scipy.sparse, h5py  # what the project depends on
        for name in installed:
            importlib.import_module(name)
        print(json.dumps({"blocked": blocked, "loaded_by_the_import": loaded,
                          "shape": list(out.shape), "installed": installed, "after": [
                              n for n in lean.OPTIONAL_MODULES if n in sys.modules]}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["blocked"] == list(lean.OPTIONAL_MODULES)
    assert result["loaded_by_the_import"] == []
    assert result["shape"] == [2, 3]
    assert {"matplotlib", "pandas", "scipy", "h5py"} <= set(result["installed"])
    assert result["after"] == result["installed"]
