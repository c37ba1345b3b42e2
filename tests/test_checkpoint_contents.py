"""What a checkpoint may hold: its arrays' headers are checked before any data is loaded, and
loaded weights must be finite.

A checkpoint is a directory anyone can hand over. Its checksums only say the files are the
ones state.json names, and state.json can be written by whoever made the files: so the
arrays' own headers are held against state.json's list and against the bytes each file really
holds, before a single array is allocated.
"""

from __future__ import annotations

import hashlib
import io
import json
import resource
import zipfile
from pathlib import Path

import numpy as np
import pytest

from impala_lab.driver.checkpoint import (
    checkpoint_state,
    read_checkpoint,
    write_checkpoint,
)

COUNTERS = {"num_steps_sampled": 10, "num_steps_trained": 10, "num_weight_syncs": 1,
            "episodes_total": 0, "elapsed_s": 1.0}
WEIGHTS = [np.ones((4, 3), np.float32), np.zeros(3, np.float32)]
OPTIMIZER = [np.array(5, np.int64), np.full((4, 3), 0.1, np.float32)]


def saved(tmp_path: Path) -> Path:
    state = checkpoint_state({"env": "CartPole-v1"}, 3, COUNTERS)
    return write_checkpoint(tmp_path / "ckpt", state, WEIGHTS, OPTIMIZER)


def replace_file(path: Path, name: str, data: bytes, **state_changes: object) -> None:
    """Swap a file in and make state.json agree with it, as a forger would."""
    (path / name).write_bytes(data)
    state = json.loads((path / "state.json").read_text())
    state["sha256"][name] = hashlib.sha256(data).hexdigest()
    state.update(state_changes)
    (path / "state.json").write_text(json.dumps(state))


def test_a_checkpoint_lists_its_arrays_and_reads_back_equal(tmp_path):
    path = saved(tmp_path)
    state = json.loads((path / "state.json").read_text())
    assert state["arrays"]["weights.npz"] == [[[4, 3], "<f4"], [[3], "<f4"]]
    _, weights, optimizer = read_checkpoint(path)
    for got, want in zip(weights + optimizer, WEIGHTS + OPTIMIZER):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


def test_a_small_file_that_declares_a_huge_array_is_refused_without_allocating_it(tmp_path):
    path = saved(tmp_path)
    bomb = io.BytesIO()
    with (zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive,
          archive.open("arr_0.npy", "w", force_zip64=True) as fh):
        np.lib.format.write_array_header_1_0(
            fh, {"descr": "<f4", "fortran_order": False, "shape": (100_000_000,)})
        zeros = bytes(1 << 20)
        for _ in range(382):  # 400 MB of zeros, under a MB compressed
            fh.write(zeros)
    assert len(bomb.getvalue()) < 1_000_000
    replace_file(path, "weights.npz", bomb.getvalue(),
                 arrays={"weights.npz": [[[100_000_000], "<f4"]],
                         "optimizer.npz": [[[], "<i8"], [[4, 3], "<f4"]]})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ValueError, match=r"weights\.npz: .*arr_0\.npy is compressed"):
        read_checkpoint(path)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100, f"reading the headers allocated {grown_mb:.0f} MB"


def test_a_header_that_declares_more_than_the_file_holds_is_refused(tmp_path):
    path = saved(tmp_path)
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as archive, archive.open("arr_0.npy", "w") as fh:
        np.lib.format.write_array_header_1_0(
            fh, {"descr": "<f4", "fortran_order": False, "shape": (1000, 1000)})
        fh.write(bytes(16))
    replace_file(path, "weights.npz", data.getvalue(),
                 arrays={"weights.npz": [[[1000, 1000], "<f4"]],
                         "optimizer.npz": [[[], "<i8"], [[4, 3], "<f4"]]})
    with pytest.raises(ValueError, match=r"declares <f4 \[1000, 1000\] \(4000000 bytes\) but "
                                         r"holds 16 bytes"):
        read_checkpoint(path)


def test_arrays_that_differ_from_state_json_are_refused(tmp_path):
    path = saved(tmp_path)
    other = io.BytesIO()
    np.savez(other, np.ones((3, 4), np.float32), np.zeros(3, np.float32))
    replace_file(path, "weights.npz", other.getvalue())
    with pytest.raises(ValueError, match=r"arr_0\.npy is <f4 \[3, 4\], state\.json says <f4 "
                                         r"\[4, 3\]"):
        read_checkpoint(path)
    fewer = io.BytesIO()
    np.savez(fewer, np.ones((4, 3), np.float32))
    replace_file(path, "weights.npz", fewer.getvalue())
    with pytest.raises(ValueError, match=r"holds 1 arrays, state\.json lists 2"):
        read_checkpoint(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_weights_that_are_not_finite_are_refused_with_the_array_named(tmp_path, bad):
    weights = [WEIGHTS[0].copy(), WEIGHTS[1]]
    weights[0][1, 2] = bad
    state = checkpoint_state({"env": "CartPole-v1"}, 3, COUNTERS)
    path = write_checkpoint(tmp_path / "ckpt", state, weights, OPTIMIZER)
    with pytest.raises(ValueError, match=r"weights\.npz: array 0 \(<f4 \[4, 3\]\) holds 1 NaN "
                                         r"or infinite values"):
        read_checkpoint(path)


def test_restore_never_joins_the_ray_address_a_checkpoint_names(tmp_path, caplog):
    from impala_lab.config import ImpalaConfig
    from impala_lab.driver.checkpoint import restored_config

    config = ImpalaConfig(env="CartPole-v1", backend="ray", ray_address="ray-head.invalid:6379")
    state = checkpoint_state(config.to_dict(), 3, COUNTERS)
    caplog.set_level("WARNING", logger="impala_lab")
    config = restored_config(tmp_path, state, {})
    assert config.ray_address is None and config.backend == "ray"
    assert "names ray_address='ray-head.invalid:6379'; restore does not connect" in caplog.text
    told = restored_config(tmp_path, state, {"ray_address": "127.0.0.1:6379"})
    assert told.ray_address == "127.0.0.1:6379"
