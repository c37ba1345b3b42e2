"""`TUNED_PRESETS`: config values tuned per env on a 2-core laptop, over RLlib's defaults.

``ImpalaConfig.tuned(env)`` and the CLI's ``--preset tuned`` (its default) apply them. Each
comment says why; the runs behind them are in docs/dependable_learning.md, docs/recurrent.md,
docs/pixels.md and docs/training.md.
"""

from __future__ import annotations

from typing import Any

# What the Box presets share: batches of 2000 env steps, Adam, clip 40, no entropy bonus, scaled
# observations (Pendulum's differ eightfold), a penalty on action means past the bounds.
_BOX = {"num_envs_per_worker": 8, "sample_batch_size": 50, "train_batch_size": 2000,
        "opt_type": "adam", "grad_clip": 40.0, "entropy_coeff": 0.0, "normalize_obs": True,
        "action_bound_coeff": 1.0}

TUNED_PRESETS: dict[str, dict[str, Any]] = {
    # Near a return of 500 a rare failed episode gives a gradient 10^3-10^4 times the calm
    # one: TF1 RMSProp with epsilon 0.3 and grad_clip 10 keep such bursts from flipping the
    # policy. Batches of one worker sample (25 x 8) give more updates per env step; a queue of
    # 4 keeps the batches fresh (the learner is the bottleneck).
    "CartPole-v1": {"num_envs_per_worker": 8, "sample_batch_size": 25, "train_batch_size": 200,
                    "opt_type": "rmsprop", "lr": 0.003, "epsilon": 0.3, "grad_clip": 10.0,
                    "vf_loss_coeff": 0.1, "entropy_coeff": 0.0, "learner_queue_size": 4},
    # The memory task (--use-lstm true): the value head shares the LSTM core, so a small
    # vf_loss_coeff keeps the value loss from drowning the policy's gradient there; the
    # entropy bonus keeps the policy from settling while the memory is still useless.
    "impala_lab/StatelessCartPole-v1": {
        "num_envs_per_worker": 8, "train_batch_size": 400, "opt_type": "rmsprop", "lr": 0.001,
        "grad_clip": 10.0, "vf_loss_coeff": 0.01, "entropy_coeff": 0.01},
    # MinAtar from pixels: MinAtar's small CNN (conv 16 3x3, 128 units) on one trunk. The
    # learner is the bottleneck, so two passes over each batch give twice the updates per env
    # step; Adam and an entropy bonus of 0.03 kept Breakout's policy from settling early. The
    # same values serve all five games.
    **{env: {"num_envs_per_worker": 16, "sample_batch_size": 20, "train_batch_size": 320,
             "num_sgd_iter": 2, "opt_type": "adam", "lr": 0.0005, "entropy_coeff": 0.03,
             "vf_share_layers": True, "model": (128,)}
       for env in ("MinAtar/Asterix-v1", "MinAtar/Breakout-v1", "MinAtar/Freeway-v1",
                   "MinAtar/Seaquest-v1", "MinAtar/SpaceInvaders-v1")},
    # Box actions. Pendulum's rewards of up to -16 a step, scaled by 0.01, keep the value
    # gradient from dominating the clip; APPO's surrogate makes two passes of 5 minibatches
    # safe (V-trace lost seeds at two), and the falling lr holds on.
    "Pendulum-v1": {**_BOX, "loss": "appo", "num_sgd_iter": 2, "minibatch_size": 400,
                    "lr_schedule": ((0, 0.004), (600_000, 0.0002)), "gamma": 0.95,
                    "reward_scale": 0.01},
    # MuJoCo: rewards scaled by 0.1 (a step earns 1 to 5). HalfCheetah starts at std 0.22: from
    # std 1 one seed settled near 2000 (docs/training.md); APPO with a falling lr holds its peak.
    "HalfCheetah-v5": {**_BOX, "loss": "appo", "num_sgd_iter": 2, "minibatch_size": 1000,
                       "lr_schedule": ((0, 0.0005), (30_000_000, 0.00005)),
                       "log_std_init": -1.5, "reward_scale": 0.1},
    "Hopper-v5": {**_BOX, "lr": 0.0005, "reward_scale": 0.1},
    # Atari from pixels (84x84x4 grey frames, `impala_lab.envs.atari`): the paper's shallow
    # network (conv 16 8x8 stride 4, conv 32 4x4 stride 2, 256 units) on one trunk, so the
    # actors run one forward per step; rewards clipped to [-1, 1] in the loss, as the paper's;
    # unrolls of 20. Samples cost more than updates, so RLlib's APPO recipe for Pong takes more
    # from each: one worker sample a batch, trained twice from a ring of 4, clip 0.3,
    # vf_loss_coeff 1.0; a small entropy bonus and a queue of 4 (docs/pixels.md says why).
    **{env: {"num_workers": 2, "num_envs_per_worker": 16, "sample_batch_size": 20,
             "train_batch_size": 320, "loss": "appo", "num_sgd_iter": 2,
             "minibatch_buffer_size": 4, "clip_param": 0.3, "vf_loss_coeff": 1.0,
             "learner_queue_size": 4, "opt_type": "adam", "lr": 0.0005, "entropy_coeff": 0.003,
             "vf_share_layers": True, "model": (256,), "clip_rewards": 1.0}
       for env in ("ALE/Pong-v5", "ALE/Breakout-v5")},
}
