"""The parser's bounds: integers of any length in a log never raise, and long logs (plain, followed, packed)
are read in bounded memory, with the same verdict as before within the bounds."""

from __future__ import annotations

import io
import statistics
import tarfile

import pytest

from dse.logs import logpack, parse
from dse.logs.parse import LogFollower, parse_log


def megatron(it: int | str, ms: float, total: int = 100) -> str:
    return f"iteration {it}/ {total} | elapsed time per iteration (ms): {ms} | lm loss: 1.0 |\n"


def test_an_iteration_number_of_thousands_of_digits_is_no_progress_line_and_no_error():
    huge = "9" * 5000
    lines = [megatron(i, 1000.0) for i in range(1, 11)] + [megatron(huge, 1.0), f"Exited with exit code {huge}\n"]
    m = parse_log(lines)
    assert m.last_iteration == 10  # the 5000-digit iteration is not read as one
    assert m.steps == 10 and m.step_time_s == pytest.approx(1.0)


@pytest.mark.parametrize(
    "line",
    [
        "Training epoch 0, iteration {d}/{d} | train_step_timing in s: 1.0\n",
        "{d}: iteration 3/ 10 | elapsed time per iteration (ms): 5 |\n",
        "Epoch {d}: 10%|##| [00:01, global_step={d}.000, train_step_timing in s=1.23]\n",
        "[Rank {d}] (after {d} iterations) memory (MB) | max allocated: 100 |\n",
        "Training epoch 0, iteration 1/5 | global_step: {d} | train_step_timing in s: 1.0\n",
    ],
)
def test_huge_integers_anywhere_a_number_is_read_never_raise(line):
    d = "7" * 4400
    parse_log([line.format(d=d)] * 3)  # no ValueError (Python's 4300-digit limit on int())


def test_a_log_longer_than_the_kept_window_is_judged_on_its_last_steps(monkeypatch):
    monkeypatch.setattr(parse, "MAX_STEPS", 50)
    times = [9.0] * 150 + [float(i % 7 + 1) for i in range(150)]  # 300 steps: the warm-up is the first 30
    m = parse_log([megatron(i + 1, t * 1000) for i, t in enumerate(times)])
    assert m.steps == 300 and m.warmup_steps == 30 and m.last_iteration == 300
    assert m.status == "ok"
    assert m.step_time_s == pytest.approx(statistics.median(times[-50:]))  # the last MAX_STEPS steps


def test_within_the_window_the_result_is_the_full_logs(monkeypatch):
    times = [5.0, 4.0] + [1.0 + 0.01 * i for i in range(40)]
    lines = [megatron(i + 1, t * 1000) for i, t in enumerate(times)]
    whole = parse_log(lines)
    monkeypatch.setattr(parse, "MAX_STEPS", 60)  # the log (42 steps) fits: nothing dropped, same figures
    assert parse_log(lines) == whole
    assert whole.step_time_s == pytest.approx(statistics.median(times[5:]))


def test_repeated_lines_of_dropped_steps_do_not_count_again(monkeypatch):
    monkeypatch.setattr(parse, "MAX_STEPS", 10)
    lines = [megatron(i, 1000.0) for i in range(1, 61)] + [megatron(1, 1000.0), megatron(2, 1000.0)]
    assert parse_log(lines).steps == 60


def test_a_followed_log_is_read_in_bounded_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(parse, "_CHUNK", 64)  # every poll reads many chunks; a character may be cut between two
    log = tmp_path / "log.txt"
    text = "".join(megatron(i, 1000.0 + i) for i in range(1, 30)) + "é ünïcode line\n"
    log.write_text(text, encoding="utf-8")
    follower = LogFollower(log)
    assert follower.poll()
    assert follower.metrics() == parse_log(str(log), exit_code=0)


def test_a_packed_log_is_streamed_line_by_line(tmp_path):
    trials = tmp_path / "trials"
    trials.mkdir()
    body = "".join(megatron(i, 2000.0) for i in range(1, 21)).encode()
    with tarfile.open(trials / "logs-00000-00003.tar.xz", "w:xz") as tar:
        info = tarfile.TarInfo("00002/log.txt")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    lines = logpack.lines(trials / "00002")
    assert lines is not None and not isinstance(lines, (list, str))  # an iterator, read as consumed
    m = parse_log(lines)
    assert m.steps == 20 and m.step_time_s == pytest.approx(2.0)
    assert logpack.lines(trials / "00001") is None
    assert logpack.read(trials / "00002") == body.decode()
