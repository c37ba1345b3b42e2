#!/usr/bin/env bash
# bench.multi_gpu on a machine with real GPUs: the same tables, on /gpu:0, /gpu:1, ...
# instead of fake CPU devices. Needs a GPU build of TensorFlow there, e.g.
#     pip install -e . 'tensorflow[and-cuda]'
# Usage: bash bench/multi_gpu_on_gpu.sh [extra bench.multi_gpu options]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
nvidia-smi -L || true
n=$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c \
    "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))")
if [ "$n" -lt 1 ]; then
    echo "TensorFlow sees no GPU: install a GPU build (pip install 'tensorflow[and-cuda]')" >&2
    exit 1
fi
devices=1
for k in 2 4 8; do
    if [ "$n" -ge "$k" ]; then devices="$devices $k"; fi
done
echo "== CartPole, 64x64 MLP, 800-step batches (the laptop table), GPUs: $devices"
"$PY" -m bench.multi_gpu --real-gpus --devices $devices --mirrored --tf-intra-op-threads 4 "$@"
echo "== a GPU-sized learner: 256x256 MLP, 4000-step batches"
"$PY" -m bench.multi_gpu --real-gpus --devices $devices --model 256,256 \
    --train-batch-size 4000 --num-envs-per-worker 16 --tf-intra-op-threads 4 "$@"
