"""The store's fast read path agrees with Optuna's own reading of the same trials."""

from __future__ import annotations

import math

import optuna

from dse.store import Store, TrialRecord, record_from_trial


def test_fast_records_equal_optunas_view(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    knobs = {"tp": [1, 2, 4], "recompute": ["none", "full"], "fp8": [False, True]}
    store = Store(url, "s", knobs, batch_size=4)
    for n in range(11):
        ok = n % 3 != 0
        store.record(TrialRecord(number=n, knobs={"tp": [1, 2, 4][n % 3], "recompute": ["none", "full"][n % 2],
                                                  "fp8": bool(n % 5 == 0)},
                                 status="ok" if ok else "oom", reward=float(n) if ok else 0.0,
                                 reason=None if ok else "CUDA out of memory", metrics={"step_time_s": n + 0.5},
                                 run_dir=f"/r/{n}", gpu="h100", num_gpus=8))
    store.close()
    reopened = Store(url, "s", knobs, create=False)
    assert reopened.next_number() == 11
    fast = reopened.records()
    reopened.close()
    study = optuna.load_study(study_name="s", storage=url)
    slow = [record_from_trial(t) for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)]
    assert len(fast) == 11
    for a, b in zip(fast, slow):
        assert a == b or (a.number == b.number and math.isnan(a.reward) and math.isnan(b.reward))
    assert fast[3].status == "oom" and fast[4].knobs == {"tp": 2, "recompute": "none", "fp8": False}
