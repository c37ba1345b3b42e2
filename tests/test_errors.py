"""Stage errors keep their parts as attributes, in the process that raised them and in the
one that receives them."""

from __future__ import annotations

import pickle

from impala_lab.errors import LearnerError, StageError, WorkerError


def test_a_worker_error_keeps_stage_message_details_and_traceback_across_pickling():
    err = WorkerError(3, "CartPole-v1", "ValueError: bad obs\nmore about it", "Traceback ...")
    for e in (err, pickle.loads(pickle.dumps(err))):
        assert type(e) is WorkerError
        assert (e.worker_index, e.env_id) == (3, "CartPole-v1")
        assert e.stage == "worker 3 (env CartPole-v1)"
        assert e.message == "ValueError: bad obs"  # the first line: what repeats compare
        assert e.details == "ValueError: bad obs\nmore about it"
        assert e.remote_traceback == "Traceback ..."
        assert str(e) == ("worker 3 (env CartPole-v1) failed: ValueError: bad obs\nmore about "
                          "it\n\n--- original traceback (worker 3 (env CartPole-v1)) ---\n"
                          "Traceback ...")


def test_a_message_with_the_words_failed_in_it_is_kept_whole():
    err = pickle.loads(pickle.dumps(LearnerError("learner thread", "step failed: NaN")))
    assert isinstance(err, StageError)
    assert (err.stage, err.message, err.remote_traceback) == ("learner thread",
                                                              "step failed: NaN", "")
    assert str(err) == "learner thread failed: step failed: NaN"
    assert WorkerError(0, "X", "").message == ""
