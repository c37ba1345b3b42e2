"""A deterministic inline run for test_determinism.py: prints one JSON line.

Two workers on the inline backend, replay on, manual stepping (driver step, then every learner
step the queue allows) until 300 learner updates; the sha256 of the policy's weights at the end.
Run as ``python tests/determinism_run.py`` in a fresh process (TensorFlow's state is global).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform

import numpy as np

CONFIG = dict(env="CartPole-v1", backend="inline", num_workers=2, num_envs_per_worker=4,
              sample_batch_size=25, train_batch_size=100, replay_proportion=0.5,
              replay_buffer_num_slots=8, seed=7, opt_type="rmsprop", lr=0.003, grad_clip=10.0)
UPDATES = 300


# The instruction sets whose kernels TensorFlow, oneDNN and numpy pick at run time: two CPUs
# that differ in any of them may round differently (an AMD EPYC without AVX-512 gave other
# bits than one with it, from the same code and versions).
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw",
              "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile",
              "amx_bf16", "amx_int8")


def cpu_features() -> list[str]:
    """The `SIMD_FLAGS` this CPU has (Linux's /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh
                          if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in SIMD_FLAGS if flag in flags]


def versions() -> dict[str, object]:
    """What the weights' bits depend on besides the code: libraries, CPU features, cores."""
    import keras
    import tensorflow as tf

    return {"tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__,
            "machine": platform.machine(), "cpu_features": cpu_features(),
            "cpu_count": os.cpu_count()}


def main() -> None:
    from impala_lab import Impala

    with Impala(CONFIG, start_learner=False) as run:
        updates = 0
        while updates < UPDATES:
            run.step()
            while run.learner.step(block_timeout=0):
                updates += 1
        digest = hashlib.sha256()
        for w in run.policy.get_weights()[0]:
            digest.update(np.ascontiguousarray(w).tobytes())
        print(json.dumps({"updates": updates, "num_steps_sampled": run.num_steps_sampled,
                          "num_steps_trained": run.num_steps_trained,
                          "weights_sha256": digest.hexdigest(), "versions": versions()}))


if __name__ == "__main__":
    main()
