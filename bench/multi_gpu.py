"""Learner samples/s of the `MultiGPULearner` on 1, 2 and 4 devices, on pre-made batches.

    python -m bench.multi_gpu                     # 1, 2, 4 fake devices (the CPU split)
    python -m bench.multi_gpu --mirrored          # also tf.distribute.MirroredStrategy
    python -m bench.multi_gpu --model 256,256 --train-batch-size 4000
    bash bench/multi_gpu_on_gpu.sh                # the same on real GPUs

What is measured: train batches are sampled once from CartPole (``RolloutWorker``, numpy
policy) before any timing. For each device count a fresh policy and learner train in their
background threads while a feeder thread keeps the learner's inqueue full, cycling over the
pre-made batches, so the actors cost nothing and the learner runs as fast as it can. After
``--warmup`` steps (the first trace) the next ``--steps`` learner steps are timed:

  samples/s   env steps trained per second (the learner's outqueue)
  grad ms     learner_grad_time_ms: one tower step (all devices, one optimizer step)
  wait ms     learner_load_wait_time_ms: the learner waiting for a ready (staged) buffer
  load ms     learner_load_time_ms: a loader thread staging one batch onto the devices
  overlap     share of the learner's time spent training, grad / (grad + wait): 100% means
              loading was entirely hidden behind training

The row "plain" is the single-device `LearnerThread` (no loader threads, no staging) on the
same batches: the baseline the multi-device learner has to beat.

All fake devices share this machine's cores, so more of them cannot be faster here; what the
table shows is the cost of the towers' extra work and the overlap of loading with training.
On a machine with real GPUs (``--real-gpus``) each tower has its own device.

``--mirrored`` adds the same step built with ``tf.distribute.MirroredStrategy`` (the policy
built inside the strategy's scope, each replica computing the gradients of its column group,
summed with an all-reduce, one optimizer step), for the design choice explained in
`impala_lab.learner.multi_gpu_learner`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def make_batches(config: Any, num_batches: int, seed: int) -> list:
    """``num_batches`` train batches [T, columns] of the config's shape, sampled once."""
    from impala_lab.actor.rollout_worker import RolloutWorker
    from impala_lab.batch import concat_samples

    per_batch = -(-config.train_batch_size // config.sample_steps)
    batches = []
    with RolloutWorker(config.env, num_envs=config.num_envs_per_worker,
                       sample_batch_size=config.sample_batch_size,
                       model_spec=config.model_spec, seed=seed) as worker:
        for _ in range(num_batches):
            batches.append(concat_samples([worker.sample() for _ in range(per_batch)]))
    return batches


def _feed(learner: Any, batches: list, stop: threading.Event) -> None:
    import queue

    i = 0
    while not stop.is_set():
        try:
            learner.inqueue.put(batches[i % len(batches)], timeout=0.1)
            i += 1
        except queue.Full:
            continue


def run_learner(learner: Any, batches: list, warmup: int, steps: int,
                rounds: int) -> dict[str, Any]:
    """Train in the learner's thread: ``warmup`` steps, then ``rounds`` timed windows of
    ``steps`` steps each; the windows' rates and the timers' means over all of them."""
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(learner, batches, stop), daemon=True)
    feeder.start()
    learner.start()
    rates = []
    try:
        _wait_steps(learner, warmup)
        timers = {name: (t.count, t.total) for name, t in learner.timers().items()}
        for _ in range(rounds):
            start = time.perf_counter()
            trained = _wait_steps(learner, steps)
            rates.append(trained / (time.perf_counter() - start))
    finally:
        stop.set()
        learner.stop()
        feeder.join(5)
    learner.raise_if_failed()

    def mean_ms(name: str) -> float:
        t = learner.timers()[name]
        count0, total0 = timers[name]
        return 1000.0 * (t.total - total0) / max(1, t.count - count0)

    grad = mean_ms("learner_grad_time_ms")
    wait = mean_ms("learner_load_wait_time_ms")
    return {"pipeline_rates": rates, "grad_ms": grad, "wait_ms": wait,
            "load_ms": mean_ms("learner_load_time_ms"),
            "overlap": grad / (grad + wait) if grad + wait > 0 else 0.0}


def _wait_steps(learner: Any, n: int) -> int:
    """Env steps the learner reports over its next ``n`` steps."""
    trained = 0
    for _ in range(n):
        while True:
            learner.raise_if_failed()
            try:
                trained += learner.outqueue.get(timeout=1.0)
                break
            except Exception:  # queue.Empty: keep waiting, but notice a failed learner
                if not learner.is_alive():
                    learner.raise_if_failed()
                    raise RuntimeError("the learner thread stopped") from None
    return trained


def step_rate(step: Any, inputs: list, count: int, warmup: int,
              steps: int) -> tuple[float, float]:
    """Calls ``step(x)`` in a loop over ``inputs`` (no threads, no loading).

    Returns:
      (samples/s of wall time, CPU ms of this process per step). The CPU time hardly
      depends on other programs competing for the cores; the wall-clock rate does.
    """
    for i in range(warmup):
        step(inputs[i % len(inputs)])
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(inputs[i % len(inputs)])
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return steps * count / wall, 1000.0 * cpu / steps


def mirrored_step(config: Any, spaces: tuple, devices: list[str], batches: list) -> tuple:
    """The towers' step built with ``tf.distribute.MirroredStrategy``; (step, its inputs)."""
    import tensorflow as tf

    from impala_lab.learner.vtrace_policy import VTracePolicy, batch_to_tensors

    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    with strategy.scope():  # model and optimizer slots become mirrored variables
        policy = VTracePolicy(*spaces, config)
    n = len(devices)
    staged = []
    for batch in batches:
        parts = [batch_to_tensors(p) for p in batch.split_columns(n)]
        staged.append(strategy.experimental_distribute_values_from_function(
            lambda ctx, parts=parts: parts[ctx.replica_id_in_sync_group]))

    def replica_step(part: dict) -> tf.Tensor:
        grads, stats = policy.compute_gradients(part)
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)  # summed, as the towers
        clipped, _ = tf.clip_by_global_norm(grads, config.grad_clip)
        policy.optimizer.apply_gradients(zip(clipped, policy.model.trainable_variables))
        return stats["total_loss"]

    @tf.function
    def train_step(dist_part: Any) -> tf.Tensor:
        losses = strategy.run(replica_step, args=(dist_part,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    return (lambda x: train_step(x).numpy()), staged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4],
                        help="device counts to measure")
    parser.add_argument("--real-gpus", action="store_true",
                        help="use /gpu:i (real GPUs) instead of fake CPU devices")
    parser.add_argument("--mirrored", action="store_true",
                        help="also measure tf.distribute.MirroredStrategy")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--model", default="64,64", help="hidden sizes, e.g. 256,256")
    parser.add_argument("--sample-batch-size", type=int, default=50)
    parser.add_argument("--num-envs-per-worker", type=int, default=8)
    parser.add_argument("--train-batch-size", type=int, default=500)
    parser.add_argument("--num-data-loader-buffers", type=int, default=2)
    parser.add_argument("--tf-intra-op-threads", type=int, default=1)
    parser.add_argument("--batches", type=int, default=8, help="distinct pre-made batches")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds (the median is shown)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)

    from impala_lab.config import ImpalaConfig

    base = ImpalaConfig(
        env=args.env, model=tuple(int(h) for h in args.model.split(",")),
        sample_batch_size=args.sample_batch_size, num_envs_per_worker=args.num_envs_per_worker,
        train_batch_size=args.train_batch_size, seed=0,
        tf_intra_op_threads=args.tf_intra_op_threads, learner_queue_size=4)
    fake = not args.real_gpus

    def device_config(n: int) -> ImpalaConfig:
        return base.replace(num_gpus=n, fake_gpus=fake,
                            num_data_loader_buffers=args.num_data_loader_buffers)

    # Logical devices before anything initialises TensorFlow: the largest count serves all.
    from impala_lab.learner.multi_gpu_learner import MultiGPULearner, configure_learner_devices

    configure_learner_devices(device_config(max(args.devices)))
    from impala_lab.driver.build import probe_spaces
    from impala_lab.learner.learner_thread import LearnerThread
    from impala_lab.learner.vtrace_policy import VTracePolicy

    spaces = probe_spaces(base.env)
    batches = make_batches(base, args.batches, seed=0)
    print(f"{args.env}, model {args.model}, train batch [T={batches[0].T}, B={batches[0].B}] "
          f"= {batches[0].count} env steps, {'real GPUs' if args.real_gpus else 'fake devices'}, "
          f"{os.cpu_count()} CPU cores, tf_intra_op_threads={args.tf_intra_op_threads}, "
          f"{args.steps} timed steps")
    # Build everything first, then measure the step-only rates in interleaved rounds (the
    # median of --repeats), so a burst of other load on the machine hits every row alike.
    count = batches[0].count
    rows: list[dict[str, Any]] = []
    steppers: list[tuple[dict, Any, list]] = []
    plain_policy = VTracePolicy(*spaces, base)
    rows.append({"learner": "plain", "devices": 1, "_policy": plain_policy})
    steppers.append((rows[-1], plain_policy.learn_on_batch, batches))
    for n in args.devices:
        config = device_config(n)
        learner = MultiGPULearner(VTracePolicy(*spaces, config), config)
        staged = [learner.stage_batch(b) for b in batches]
        rows.append({"learner": "towers", "devices": n, "device_names": learner.devices,
                     "_learner": learner})
        steppers.append((rows[-1], lambda parts, lr=learner, b=batches[0]:
                         lr.learn_on_parts(parts, b), staged))
        if args.mirrored:
            rows.append({"learner": "mirrored", "devices": n})
            steppers.append((rows[-1], *mirrored_step(config, spaces, learner.devices, batches)))
    for row, step, inputs in steppers:
        step_rate(step, inputs, count, args.warmup, 1)  # trace before timing
        row["step_rates"], row["step_cpu_ms"] = [], []
    for _ in range(args.repeats):
        for row, step, inputs in steppers:
            samples_per_s, cpu_ms = step_rate(step, inputs, count, 0, args.steps)
            row["step_rates"].append(samples_per_s)
            row["step_cpu_ms"].append(cpu_ms)
    # The pipeline: the learner thread, its loader thread and a feeder thread together.
    for row in rows:
        if row["learner"] == "plain":
            learner = LearnerThread(row.pop("_policy"), learner_queue_size=4)
        elif row["learner"] == "towers":
            learner = row.pop("_learner")
        else:
            continue
        row.update(run_learner(learner, batches, args.warmup, args.steps, args.repeats))
    for row in rows:
        row.pop("_policy", None)

    def rate(rates: list[float] | None) -> str:
        if not rates:
            return f"{'-':>26}"
        spread = f"({min(rates) / 1000:,.0f}-{max(rates) / 1000:,.0f}k)"
        return f"{statistics.median(rates):>12,.0f}{spread:>14}"

    print("samples/s: median over the rounds (lowest-highest round)")
    print(f"{'':<18}{'step only':>12}{'':>14}{'step CPU':>9}{'pipeline':>12}")
    print(f"{'learner':<10}{'devices':>8}{'samples/s':>12}{'':>14}{'ms':>9}{'samples/s':>12}"
          f"{'':>14}{'grad ms':>9}{'wait ms':>9}{'load ms':>9}{'overlap':>9}")
    for r in rows:
        line = f"{r['learner']:<10}{r['devices']:>8}{rate(r['step_rates'])}"
        line += f"{statistics.median(r['step_cpu_ms']):>9.2f}"
        line += rate(r.get("pipeline_rates"))
        if "grad_ms" in r:
            line += (f"{r['grad_ms']:>9.2f}{r['wait_ms']:>9.2f}{r['load_ms']:>9.2f}"
                     f"{r['overlap']:>9.0%}")
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
