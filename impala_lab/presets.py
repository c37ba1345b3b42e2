"""`TUNED_PRESETS`: config values tuned per env, with the experiments behind each choice.

``ImpalaConfig.tuned(env)`` and the CLI's ``--preset tuned`` (its default) apply them over
RLlib's defaults; the README's "Performance", "Dependable learning" and "MinAtar" sections
have the runs.
"""

from __future__ import annotations

from typing import Any

# Values tuned on a 2-core laptop (see the README's Performance section), applied by the CLI
# (``--preset tuned``, its default) and by ``ImpalaConfig.tuned(env)``; the dataclass defaults
# stay RLlib's.
TUNED_PRESETS: dict[str, dict[str, Any]] = {
    # Why these values (the README's "Dependable learning" has the experiments, 3-7 random
    # seeds each): near a return of 500 a rare failed episode gives advantages of about -100
    # (V is about 1 / (1 - gamma)) and a gradient 10^3-10^4 times the calm one, clipped to
    # grad_clip; with Adam, or with the clip at 40, a few such steps in a row flipped the policy
    # to one that pushes one way (return 9). TensorFlow 1's RMSProp (epsilon 0.1 under the
    # root) does not blow small gradients up to lr-sized steps, and grad_clip 10 bounds the
    # step a burst can take: no seed fell below 400 in the minute after solving.
    # Batches of 200 env steps (unrolls of 25 x 8 envs, one worker sample each) where RLlib's
    # 500 made 800 (two samples of 50 x 8): twice the updates per env step. Screened on random
    # seeds, alternating (one run each; median env steps to 475): the old batches 584k (n=5);
    # lr 0.005 432k; two passes per batch 421k; replay 0.5 496k; batches of 400 364k (n=6)
    # but two passes on them missed 475 within 60 s on one seed of 6; batches of 200 256k
    # (n=6), and the trailing mean stayed >= 476 for 30 s after on 6 more seeds.
    # A learner queue of 4 batches where RLlib's is 16: the learner is the bottleneck here, so
    # the queue stays nearly full and a batch waited there for up to 20 updates (policy lag at
    # training); with 16, 4 of 20 random seeds fell below 400 in the minute after solving
    # (two to a return of 9). With 4 (and with 2), 20 random seeds each: 0 of 20 fell, the
    # lowest trailing mean was 479 (493 with 2), and 475 came sooner (median 6.3 s and 236k
    # env steps against 7.0 s and 317k). 4 rather than 2 leaves room for bursty arrivals.
    # RMSProp's epsilon 0.3 where RLlib's is 0.1: the rare fall that a queue of 4 still let
    # through (about 1 run in 100) is a few hundred clipped steps that drive the softmax to
    # one action; a larger floor under the normaliser shortens each of them. On a queue of 16,
    # which makes falls common, 0 of 36 random seeds fell with 0.3 against 6 of 29 with 0.1;
    # at the preset's queue of 4 it cost 0.5 s to 475 (12 seeds each, alternating). 1.0 fell
    # no more but took 2.1 s longer (docs/dependable_learning.md has the runs).
    "CartPole-v1": {"num_envs_per_worker": 8, "sample_batch_size": 25, "train_batch_size": 200,
                    "opt_type": "rmsprop", "lr": 0.003, "epsilon": 0.3, "grad_clip": 10.0,
                    "vf_loss_coeff": 0.1, "entropy_coeff": 0.0, "learner_queue_size": 4},
    # The memory task, for a recurrent policy (--use-lstm true). With use_lstm the value head
    # shares the LSTM core, and a value loss of order 10^4 (returns of tens to hundreds)
    # drowned the policy's gradient in the core: at vf_loss_coeff 0.5 or 0.1 the return fell
    # below a random policy's; at 0.01 it climbed. entropy_coeff 0.01 keeps the early policy
    # from settling on one action while the memory is still useless. Train batches of one worker
    # sample ([50, 8], 400 env steps) where there were four (1600): on 3 random seeds,
    # alternating, 350 came at 23-34 s and 1.4-2.1M env steps against 35-47 s and 3.7-4.9M,
    # the same trade as CartPole's (more updates per env step).
    "impala_lab/StatelessCartPole-v1": {
        "num_envs_per_worker": 8, "train_batch_size": 400, "opt_type": "rmsprop", "lr": 0.001,
        "grad_clip": 10.0, "vf_loss_coeff": 0.01, "entropy_coeff": 0.01},
    # MinAtar from pixels (the README's "MinAtar" has the runs): the small CNN (MinAtar's conv
    # 16 3x3, then 128 units) on one trunk, 16 envs per worker. The learner is the bottleneck
    # (the actors idle at about a quarter of a core each), so two passes over batches of 320
    # give twice the updates per env step. Adam learned Breakout faster per env step than
    # RMSProp (7.5 against 5.3 after 1.5M env steps), and an entropy bonus of 0.03 kept the
    # policy from settling early (entropy 0.14 of ln 3 = 1.1 at 0.01, where the return
    # plateaued near 8; 12.3 after 1.5M env steps at 0.03). The same values serve all five
    # games: a first run of each new game (seed 4539) passed MinAtar's actor-critic figure
    # at 5M frames within 3 minutes (Seaquest 17.2 at 93 s, Asterix 20.3 at 93 s, Freeway
    # 47.1 at 177 s); `python -m bench --only minatar` measures them on random seeds.
    **{env: {"num_envs_per_worker": 16, "sample_batch_size": 20, "train_batch_size": 320,
             "num_sgd_iter": 2, "opt_type": "adam", "lr": 0.0005, "entropy_coeff": 0.03,
             "vf_share_layers": True, "model": (128,)}
       for env in ("MinAtar/Asterix-v1", "MinAtar/Breakout-v1", "MinAtar/Freeway-v1",
                   "MinAtar/Seaquest-v1", "MinAtar/SpaceInvaders-v1")},
    # Box actions, the diagonal Gaussian policy (docs/training.md, "Continuous actions";
    # `python -m bench --only continuous` measures it on seeds drawn at random). Rewards
    # reach -16 a step: scaled by 0.01 (reward_scale) the values stay near -1 to -3, so the
    # value gradient no longer dominates the global-norm clip (unscaled, grad_clip had to be
    # 1000 and the value loss was 10^6). Angular velocity spans +-8 against +-1 for cos and
    # sin: normalize_obs. Without a bound penalty the action mean wandered to 8, 40, even -40
    # (the clip at the env hides every difference between actions out there, so nothing
    # pulled it back) and the return collapsed to about -1500 for good; action_bound_coeff
    # 1.0 keeps it inside [-2, 2]. One pass over batches of 2000 kept learning where two
    # passes over 1000 lost it. Single runs per variant (seeds 11-13, 150 s, two runs sharing
    # the cores), so the choices are shown, not measured: batch 1000 x 2 passes, scaled:
    # -250 at 2.2M env steps then collapse; Adam lr 0.0003 or RMSProp: never; entropy bonus
    # 0.001: the std grew to 4, never; batch 2000 x 1 pass: -250 at 2.9M and stayed; with the
    # bound penalty: at 3.3M and 3.9M, stayed; squashing (squash_actions) in place of the
    # clip: at 3.5M, stayed (no better, so the preset keeps RLlib's clip: the env gets the
    # draw itself where it is inside the bounds and the entropy bonus is the policy's own).
    # Measured on 5 random seeds by the bench: 5/5 reached -250, median 34 s and 3.6M env
    # steps, and stayed; with two passes per batch 5/5 reached it in a median 20 s and 1.8M,
    # but one seed fell to -1237 within a minute, so the preset keeps one pass.
    "Pendulum-v1": {"num_envs_per_worker": 8, "sample_batch_size": 50,
                    "train_batch_size": 2000, "num_sgd_iter": 1, "opt_type": "adam",
                    "lr": 0.0005, "gamma": 0.95, "grad_clip": 40.0, "entropy_coeff": 0.0,
                    "normalize_obs": True, "reward_scale": 0.01, "action_bound_coeff": 1.0},
    # MuJoCo (the mujoco extra): Pendulum's recipe with RLlib's gamma 0.99 for their 1000-step
    # episodes and rewards scaled by 0.1 (a step earns about 1 to 5). First single runs on
    # seed 5: HalfCheetah-v5 passed 1500 at 75 s (3.9M env steps) and 5200 at 290 s; Hopper-v5
    # samples at about 11k env steps/s (its episodes end often and each reset costs) and
    # reached 746 at 133 s. Measured by `python -m bench.continuous --envs mujoco` on 3 random
    # seeds each: HalfCheetah 1500 in a median 161 s (worst 257 s), Hopper 1000 in 125 s
    # (worst 138 s), all 6 within the 20-minute target and all stayed for the 30 s after.
    **{env: {"num_envs_per_worker": 8, "sample_batch_size": 50, "train_batch_size": 2000,
             "num_sgd_iter": 1, "opt_type": "adam", "lr": 0.0005, "grad_clip": 40.0,
             "entropy_coeff": 0.0, "normalize_obs": True, "reward_scale": 0.1,
             "action_bound_coeff": 1.0}
       for env in ("HalfCheetah-v5", "Hopper-v5")},
}
