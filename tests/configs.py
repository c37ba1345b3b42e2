"""The smallest run the driver tests build: two inline workers of one env each, batches of 20
env steps from samples of 10, one request in flight per worker (so a test can count the
calls), seeded. Tests extend it with ``{**SMALL, field: value}``."""

SMALL = dict(backend="inline", num_workers=2, num_envs_per_worker=1, sample_batch_size=10,
             train_batch_size=20, max_sample_requests_in_flight_per_worker=1, seed=0)
