"""Fuzz: hostile space files, calibration TSVs and logs end in a result or a one-line refusal, never a traceback.

Hypothesis draws the inputs (a bounded number of examples, so this runs in seconds in CI): a shipped space with one
value replaced by a hostile one, a calibration TSV with one cell replaced, and logs of progress lines whose figures
and bytes are hostile. What the input may do is declared: ``dse validate`` exits 0 or 2 with no traceback, the
calibration reader returns runs or raises :class:`dse.errors.UserError`, the parser returns :class:`RunMetrics` whose
figures are finite.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dse.errors import UserError
from dse.logs.parse import STATUSES, parse_log
from tests.helpers import SMALL_SPACE, dse

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "bench" / "data" / "h200_real_runs.tsv"
FAST = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))

NUMBERS = st.sampled_from(
    ["0", "-1", "-2", "1e308", "-1e308", "1e-308", "nan", "inf", "-inf", "9" * 30, "9" * 5000, "1.5", "0x10", "1_000"]
)
TEXTS = st.sampled_from(
    ["", " ", "x" * 5000, "\x07", "\x1b[2J", "=SUM(A1)", "../../etc", "$(id)", "`id`", "a\nb", "\u202e", "\x00"]
)
HOSTILE = st.one_of(NUMBERS, TEXTS, st.text(max_size=40))


def _toml_value(raw: str, quoted: bool) -> str:
    return json.dumps(raw) if quoted else raw


SPACE_KEYS = [
    ("num_nodes = 2", "num_nodes = {}"),
    ("seq_length = 4096", "seq_length = {}"),
    ("gbs = 32", "gbs = {}"),
    ("max_steps = 20", "max_steps = {}"),
    ("tp = [1, 2, 4, 8]", "tp = [1, {}]"),
    ('metric = "tflops_per_gpu"', "metric = {}"),
    ('agent = "grid"', "agent = {}"),
    ("seed = 0", "seed = {}"),
    ('system = "h100"', "system = {}"),
    ('recipe = "llama3_70b_16l"', "recipe = {}"),
    ("[knobs]", '"env.NCCL_DEBUG" = {}\n[knobs]'),
    ("[knobs]", '"env.{}" = "1"\n[knobs]'),
    ("[search]", "[backend]\nkind = {}\n\n[search]"),
    ("[search]", "[backend.early_stop]\nenabled = true\nmin_steps = {}\n\n[search]"),
    ('system = "h100"', 'system = {{ gpu = "gb200", slurm = {{ time_limit = {} }} }}'),
    ('system = "h100"', 'system = {{ gpu = "gb200", slurm = {{ sbatch_options = {{ segment = {} }} }} }}'),
]


@FAST
@given(key=st.sampled_from(SPACE_KEYS), value=HOSTILE, quoted=st.booleans())
def test_a_hostile_space_value_is_validated_or_refused_in_one_line(tmp_path_factory, key, value, quoted):
    old, new = key
    text = SMALL_SPACE.replace(old, new.format(_toml_value(value, quoted) if "{}" in new else value), 1)
    path = tmp_path_factory.mktemp("space") / "space.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    r = dse("validate", path)
    assert r.exit_code in (0, 2), (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    if r.exit_code == 2:
        assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.output


def _real_rows() -> list[dict]:
    with open(REAL, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


@FAST
@given(
    row=st.integers(min_value=0, max_value=12),
    column=st.sampled_from(list(_real_rows()[0])),
    value=HOSTILE,
    repeat=st.integers(min_value=1, max_value=40),
)
def test_a_hostile_calibration_tsv_gives_runs_or_a_user_error(tmp_path_factory, row, column, value, repeat):
    from dse.perfmodel.calibrate import load_runs

    rows = _real_rows()
    rows[row] = {**rows[row], column: value}
    buf = io.StringIO()
    w = csv.DictWriter(buf, list(rows[0]), delimiter="\t", lineterminator="\n")
    w.writeheader()
    w.writerows(rows * repeat)
    path = tmp_path_factory.mktemp("tsv") / "runs.tsv"
    path.write_text(buf.getvalue(), encoding="utf-8", errors="surrogatepass")
    try:
        runs, gpu = load_runs([path], "h200")
    except UserError as e:
        assert "\n" not in str(e)
        return
    assert gpu == "h200" and 0 < len(runs) <= len(rows)
    assert all(r.step_time_s is None or math.isfinite(r.step_time_s) for r in runs)


LINE = st.sampled_from(
    [
        "Training epoch 0, iteration {i}/9 | global_step: {i} | train_step_timing in s: {v} | TFLOPS_per_GPU: {v}",
        "Training epoch 0, iteration {i}/9 | max_memory_allocated: {v} | global_batch_size: {v} | reduced_train_loss: {v}",
        " [2025-01-01 00:00:00] iteration {i}/ 9 | elapsed time per iteration (ms): {v} | lm loss: {v} |",
        "Step Time : {v}s GPU utilization: {v}MODEL_TFLOP/s/GPU",
        "[Rank 0] (after {i} iterations) memory (MB) | max allocated: {v} | max reserved: {v}",
        "mem-max-allocated-gigabytes: {v}",
        "Epoch 0: 10%|# | 1/10 [00:01<00:09, global_step={v}, train_step_timing in s={v}]",
        "Traceback (most recent call last):",
        "{t}Error: {t}",
        "CANCELLED AT 2025-01-01T00:00:00 DUE TO TIME LIMIT",
        "{t}",
    ]
)


@FAST
@given(
    lines=st.lists(st.tuples(LINE, st.integers(0, 10**13), NUMBERS, TEXTS), max_size=30),
    exit_code=st.sampled_from([None, 0, 1, 137]),
    damage=st.sampled_from([None, "truncate", "flip"]),
)
def test_a_hostile_log_parses_to_finite_figures(tmp_path_factory, lines, exit_code, damage):
    text = "\n".join(t.format(i=i, v=v, t=x) for t, i, v, x in lines) + "\n"
    results = [parse_log(text.splitlines(), exit_code=exit_code)]
    data = gzip.compress(text.encode("utf-8", "surrogatepass"))
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data = data[:12] + bytes(b ^ 0x55 for b in data[12:40]) + data[40:]
    log = tmp_path_factory.mktemp("log") / "log.txt.gz"
    log.write_bytes(data)
    results.append(parse_log(log, exit_code=exit_code))
    for m in results:
        assert m.status in STATUSES
        for k, v in m.to_dict().items():
            assert not isinstance(v, float) or math.isfinite(v), (k, v)
        json.dumps(m.to_dict(), allow_nan=False)
        assert m.reason is None or not any(c in m.reason for c in "\x00\x07\x1b\n")
