"""Checkpoints, end to end through the `Impala` driver: save, then restore in a new process.

A run saved after a few learner steps must come back bitwise (weights, optimizer slots,
counters, config) in a fresh interpreter and train on from its counters; a checkpoint holds
only arrays and JSON, read without pickle; a truncated or tampered file is a ValueError that
names it, not a crash or a silently wrong run. Saves under faults are in
test_checkpoint_atomic.py, the checks on what a checkpoint's arrays may hold in
test_checkpoint_contents.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from impala_lab import Impala, ImpalaConfig
from tests.leaks import no_leaks

REPO = Path(__file__).resolve().parents[1]
# Small inline runs: 2 workers x 2 envs x 10 steps per sample, a train batch of 2 samples.
INLINE = dict(backend="inline", num_workers=2, num_envs_per_worker=2, sample_batch_size=10,
              train_batch_size=40, model=(16,), seed=0)

RESTORE_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from impala_lab import Impala

    path, out = sys.argv[1], sys.argv[2]
    run = Impala.restore(path)
    weights, version = run.policy.get_weights()
    np.savez(out + "/weights.npz", *weights)
    np.savez(out + "/optimizer.npz", *run.policy.optimizer_state())

    def counters():
        return {"num_steps_sampled": run.num_steps_sampled,
                "num_steps_trained": run.num_steps_trained,
                "num_weight_syncs": run.num_weight_syncs,
                "episodes_total": run.episodes_total,
                "weights_version": run.policy.version}

    restored = counters()
    config = run.config.to_dict()
    result = run.train(lambda s: s["weights_version"] >= version + 2, max_seconds=120,
                       report_interval=0.05)
    run.stop()
    with open(out + "/restored.json", "w") as fh:
        json.dump({"config": config, "restored": restored, "resumed": counters(),
                   "stop_reason": result["stop_reason"]}, fh)
""")


def saved_run(path: Path) -> tuple[Impala, list[np.ndarray], list[np.ndarray], dict]:
    """Train a few learner steps inline, stop, save to ``path``; return what was saved."""
    run = Impala(ImpalaConfig(**INLINE))
    with run:
        run.train(lambda s: s["weights_version"] >= 3, max_seconds=60, report_interval=0.05)
    run.save(path)  # after stop: the learner thread no longer changes the weights
    weights, version = run.policy.get_weights()
    counters = {"num_steps_sampled": run.num_steps_sampled,
                "num_steps_trained": run.num_steps_trained,
                "num_weight_syncs": run.num_weight_syncs,
                "episodes_total": run.episodes_total, "weights_version": version}
    return run, weights, run.policy.optimizer_state(), counters


def assert_bitwise_equal(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert (x.dtype, x.shape) == (y.dtype, y.shape)
        assert x.tobytes() == y.tobytes()


@pytest.mark.slow
def test_a_checkpoint_restores_bitwise_in_a_new_process_and_training_resumes(tmp_path):
    run, weights, opt_state, counters = saved_run(tmp_path / "ckpt")
    assert counters["weights_version"] >= 3 and len(opt_state) > len(weights)
    out = tmp_path / "restored"
    out.mkdir()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", RESTORE_SCRIPT, str(tmp_path / "ckpt"),
                           str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out / "weights.npz") as data:
        assert_bitwise_equal(weights, [data[f"arr_{i}"] for i in range(len(data.files))])
    with np.load(out / "optimizer.npz") as data:
        assert_bitwise_equal(opt_state, [data[f"arr_{i}"] for i in range(len(data.files))])
    report = json.loads((out / "restored.json").read_text())
    assert report["config"] == run.config.to_dict()
    assert report["restored"] == counters
    resumed = report["resumed"]
    assert report["stop_reason"] == "stop condition"
    assert resumed["weights_version"] >= counters["weights_version"] + 2
    for key in ("num_steps_sampled", "num_steps_trained", "num_weight_syncs"):
        assert resumed[key] > counters[key], key


def test_a_checkpoint_holds_only_arrays_and_json(tmp_path):
    saved_run(tmp_path / "ckpt")
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == ["optimizer.npz", "state.json", "weights.npz"]
    json.loads((tmp_path / "ckpt" / "state.json").read_text())
    for name in ("weights.npz", "optimizer.npz"):
        with np.load(tmp_path / "ckpt" / name, allow_pickle=False) as data:
            assert all(data[k].dtype != object for k in data.files)


def rewrite(path: Path, name: str, data: bytes, fix_checksum: bool) -> None:
    """Replace a checkpoint file; with ``fix_checksum`` also its checksum in state.json."""
    import hashlib

    (path / name).write_bytes(data)
    if fix_checksum:
        state = json.loads((path / "state.json").read_text())
        state["sha256"][name] = hashlib.sha256(data).hexdigest()
        (path / "state.json").write_text(json.dumps(state))


def pickled_npz() -> bytes:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, np.array([{"a": 1}], dtype=object))
    return buffer.getvalue()


@pytest.mark.parametrize("name, tamper, message", [
    ("optimizer.npz", lambda b: b[: len(b) // 2], r"optimizer\.npz: checksum mismatch"),
    ("weights.npz", lambda b: b[: len(b) // 2], r"weights\.npz: checksum mismatch"),
    ("weights.npz", "truncate+fix", r"weights\.npz: not a valid checkpoint array file"),
    ("optimizer.npz", "pickle+fix", r"optimizer\.npz: .*holds Python objects \(a pickle\)"),
    ("state.json", lambda b: b[: len(b) // 2], r"state\.json: not a valid checkpoint state"),
    ("state.json", "no-counters", r"state\.json: .*missing or mistyped: counters"),
    ("state.json", "bad-config", r"state\.json: the checkpoint's config is invalid: lr=-1"),
])
def test_a_truncated_or_tampered_checkpoint_is_a_clear_error_naming_the_file(
        tmp_path, name, tamper, message):
    path = tmp_path / "ckpt"
    with Impala(ImpalaConfig(**INLINE), start_learner=False) as run:
        run.save(path)
    data = (path / name).read_bytes()
    if tamper == "truncate+fix":
        rewrite(path, name, data[: len(data) // 2], fix_checksum=True)
    elif tamper == "pickle+fix":
        rewrite(path, name, pickled_npz(), fix_checksum=True)
    elif tamper in ("no-counters", "bad-config"):
        state = json.loads(data)
        if tamper == "no-counters":
            del state["counters"]
        else:
            state["config"]["lr"] = -1
        (path / name).write_text(json.dumps(state))
    else:
        rewrite(path, name, tamper(data), fix_checksum=False)
    with no_leaks(), pytest.raises(ValueError, match=message) as info:
        Impala.restore(path)
    assert str(path) in str(info.value)

