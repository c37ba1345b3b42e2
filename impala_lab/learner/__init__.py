"""IMPALA's learner: V-trace, the policy's loss, the Keras network and the threads that train.

The learner takes train batches from a bounded queue (`learner_thread.LearnerThread`, or
`multi_gpu_learner.MultiGPULearner` with loader threads), serves each one several times from a
ring (`minibatch_buffer.MinibatchBuffer`), and takes an optimizer step on the V-trace loss of
`vtrace_policy.VTracePolicy`. The driver sees a learner only through `port.LearnerPort`.
TensorFlow lives here; no module here knows where workers run.
"""
