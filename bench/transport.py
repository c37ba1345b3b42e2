"""How should a weights broadcast reach the worker processes: through each pipe, or through
one shared-memory block? Measures both, as `impala_lab.backends.shared_weights` does.

    python bench/transport.py [--workers 2] [--repeats 300] [--busy-ms 10]

For each model (the default 64x64 MLP on CartPole, about 19 KB of weights, and a 1024x1024
MLP, about 4.2 MB) and each way, the driver broadcasts new weights to every worker process
and waits until each has its own copy of the arrays and has answered:

  pipe:  the weights are pickled once (protocol 5) and the bytes sent through every
         worker's pipe; each worker unpickles its copy.
  shm:   `write_shared_weights` writes them once into a shared-memory block (overwriting
         the block the workers finished with, as the backend does); each worker gets the
         block's name and layout (about 300 bytes) and copies the arrays out with
         `read_shared_weights` (the backend's real code).

Twice: with idle workers (blocked reading their pipe), and with busy ones that "sample" for
``--busy-ms`` before reading each command, as real workers read their pipe only between
samples.

Printed per case (medians): the whole broadcast (until every worker has answered), the
driver's part of it (writing and sending: how long the driver loop is held up), and the
driver's CPU time per broadcast (the learner thread shares that CPU).

Measured on a 2-core machine (2 workers; medians, ranges over 3 runs, some with other jobs
running; "busy" workers sample for 10 ms), in ms::

    workers  weights            way         broadcast   driver wall   driver CPU
    idle     64x64 MLP, 19 KB   pipe        0.23-0.27   0.07-0.10     0.07-0.12
    idle     64x64 MLP, 19 KB   shared mem  0.34-0.47   0.08-0.11     0.09-0.12
    idle     1024x1024, 4.2 MB  pipe        5.1-28      4.0-20        1.9-4.4
    idle     1024x1024, 4.2 MB  shared mem  2.1-6.3     0.54-0.90     0.58-0.75
    busy     64x64 MLP, 19 KB   pipe        10.4-10.6   0.17-0.20     0.17-0.19
    busy     64x64 MLP, 19 KB   shared mem  10.7-11.3   0.23-0.25     0.23-0.26
    busy     1024x1024, 4.2 MB  pipe        21-29       15.6-20.1     2.5-2.7
    busy     1024x1024, 4.2 MB  shared mem  12.6-13.1   0.82-0.96     0.71-0.84

For 4 MB of weights the pipe holds the driver loop until each busy worker has drained it
(15-20 ms per broadcast with 2 workers, growing with the number of workers); shared memory
costs the driver under 1 ms whatever the number of workers. A new 4 MB block costs 8-15 ms
of page faults, overwriting one 0.3-0.6 ms: the backend reuses blocks.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import multiprocess


def _worker(conn, busy_s: float) -> None:
    """A stand-in rollout worker: "samples" for ``busy_s`` seconds, then reads its next
    command, takes the weights one way or the other and answers."""
    from impala_lab.backends.shared_weights import read_shared_weights

    weights = None
    while True:
        if busy_s:
            time.sleep(busy_s)  # a real worker reads its pipe only between samples
        msg = pickle.loads(conn.recv_bytes())
        if msg[0] == "stop":
            return
        if msg[0] == "pipe":
            weights = msg[2]  # unpickling made this worker's copy
        else:
            weights = read_shared_weights(msg[1])
        conn.send_bytes(pickle.dumps(int(sum(w.size for w in weights))))


def _weights(hiddens: tuple[int, ...]) -> list:
    import gymnasium as gym

    from impala_lab.actor.numpy_model import NumpyModel
    from impala_lab.model_spec import ModelSpec

    env = gym.make("CartPole-v1")
    return list(NumpyModel(env.observation_space, env.action_space, ModelSpec(hiddens))
                .initial_weights(0))


def _send_pipe(conns, weights, serial, state) -> None:
    data = pickle.dumps(("pipe", serial, weights), protocol=5)
    for c in conns:
        c.send_bytes(data)


def _send_shm(conns, weights, serial, state) -> None:
    from impala_lab.backends.shared_weights import write_shared_weights

    # As the backend does: overwrite the block the workers finished with, if there is one.
    block, ref = write_shared_weights(weights, serial, serial=serial, block=state.pop("free", None),
                                      name=f"ilbench{os.getpid()}_{serial}")
    data = pickle.dumps(("shm", ref), protocol=5)
    for c in conns:
        c.send_bytes(data)
    if "latest" in state:
        state["free"] = state["latest"]  # every worker will read the newer block
    state["latest"] = block


def measure(conns, weights, way: str, repeats: int) -> dict[str, float]:
    """Broadcasts ``repeats`` times; returns the median wall time of a whole broadcast (until
    every worker answered), of the driver's part (writing and sending), and its CPU time."""
    send = _send_pipe if way == "pipe" else _send_shm
    state: dict = {}
    totals, sends = [], []
    cpu = 0.0
    for serial in range(repeats + 5):  # the first 5 warm up
        c0, t0 = time.process_time(), time.perf_counter()
        send(conns, weights, serial, state)
        t1, c1 = time.perf_counter(), time.process_time()
        for c in conns:
            c.recv_bytes()
        t2 = time.perf_counter()
        if serial >= 5:
            totals.append(t2 - t0)
            sends.append(t1 - t0)
            cpu += c1 - c0
    for block in (state.get("latest"), state.get("free")):
        if block is not None:
            block.close()
            block.unlink()
    return {"broadcast_ms": 1e3 * statistics.median(totals),
            "driver_wall_ms": 1e3 * statistics.median(sends),
            "driver_cpu_ms": 1e3 * cpu / repeats}


def _start_workers(n: int, busy_s: float):
    ctx = multiprocess.get_context("spawn")
    conns, procs = [], []
    for _ in range(n):
        ours, theirs = ctx.Pipe(duplex=True)
        p = ctx.Process(target=_worker, args=(theirs, busy_s), daemon=True)
        p.start()
        theirs.close()
        conns.append(ours)
        procs.append(p)
    return conns, procs


def _stop_workers(conns, procs) -> None:
    for c in conns:
        c.send_bytes(pickle.dumps(("stop",)))
        c.close()
    for p in procs:
        p.join(5)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=300,
                        help="broadcasts per case (the 4 MB model uses a fifth of them)")
    parser.add_argument("--busy-ms", type=float, default=10.0,
                        help="the busy workers' sample time (8 CartPole envs x 50 steps: ~10 ms)")
    args = parser.parse_args(argv)

    results = {}
    models = {"64x64": (64, 64), "1024x1024": (1024, 1024)}
    print(f"{args.workers} worker processes. broadcast: until every worker holds the arrays; "
          "driver: writing + sending only")
    print(f"{'workers':>8} {'model':>10} {'MB':>6} {'way':>5} {'broadcast ms':>13} "
          f"{'driver ms':>10} {'driver CPU ms':>14}")
    for busy_ms in (0.0, args.busy_ms):
        label_w = "idle" if not busy_ms else f"busy{busy_ms:g}"
        conns, procs = _start_workers(args.workers, busy_ms / 1e3)
        try:
            for label, hiddens in models.items():
                weights = _weights(hiddens)
                mb = sum(w.nbytes for w in weights) / 1e6
                repeats = args.repeats if mb < 1 else max(10, args.repeats // 5)
                if busy_ms:
                    repeats = max(10, repeats // 5)
                for way in ("pipe", "shm"):
                    r = measure(conns, weights, way, repeats)
                    results[f"{label_w}/{label}/{way}"] = {"mb": mb, **r}
                    print(f"{label_w:>8} {label:>10} {mb:6.3f} {way:>5} "
                          f"{r['broadcast_ms']:13.3f} {r['driver_wall_ms']:10.3f} "
                          f"{r['driver_cpu_ms']:14.3f}")
        finally:
            _stop_workers(conns, procs)
    return results


if __name__ == "__main__":
    main()
