"""An external library drives dse: the docs' Stable-Baselines3 example runs (a short budget), and the policy agent
uses a policy that ``dse train-policy`` trained. A policy file is data, never code: a pickle in a file named as a
policy never runs (``dse validate``, ``dse run``), and a genuine policy reads back into a network that acts as the
trained one did."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import dse, one_line_error

pytest.importorskip("stable_baselines3", reason="the rl extra (stable-baselines3, torch) is not installed")
pytest.importorskip("safetensors", reason="the rl extra (safetensors) is not installed")

ROOT = Path(__file__).resolve().parents[1]
SPACE = "conf/spaces/nemotron3_8b_space.toml"


def policy_space(tmp_path: Path, policy: str, *, name: str = "space.toml", extra: str = "") -> Path:
    """The shipped nemotron3_8b space with ``agent = "policy"`` and ``[search.options] policy = POLICY``."""
    text = (ROOT / SPACE).read_text()
    assert "[search.options]" not in text
    space = tmp_path / name
    space.write_text(
        text.replace('agent = "optuna"\nsampler = "tpe"', 'agent = "policy"')
        + extra
        + f"\n[search.options]\npolicy = {json.dumps(policy)}\n"
    )
    return space


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A policy trained (shortly) by dse train-policy's code on twins of the nemotron3_8b space, and its file."""
    from dse.rl.training import train_policy

    out = tmp_path_factory.mktemp("policy") / "nemotron3.safetensors"
    return train_policy(SPACE, out, twins=2, steps=256)


class Payload:
    """Unpickling this creates ``marker``: what a hostile policy file would do (here: an empty file)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_the_docs_ppo_example_trains_on_the_vector_twins_and_searches():
    res = subprocess.run(
        [sys.executable, "docs/examples/sb3_ppo.py", "512"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-2000:]
    m = re.search(r"best found: ([0-9.]+) of the model's best forecast, after (\d+) runs", res.stdout)
    assert m and 0 < float(m.group(1)) < 2 and 1 <= int(m.group(2)) <= 30, res.stdout


def test_train_policy_then_the_policy_agent_runs_a_study_with_it(tmp_path):
    policy = tmp_path / "policy.safetensors"
    res = dse("train-policy", SPACE, "--out", policy, "--steps", "256", "--twins", "2")
    assert res.exit_code == 0, res.output
    assert policy.is_file() and "2 twins (seeds 1000..1001;" in res.output
    assert policy.read_bytes()[8:9] == b"{"  # a safetensors file: a JSON header, then the arrays
    # a relative path is relative to the space file, not to the working directory
    space = policy_space(tmp_path, "policy.safetensors")
    out = tmp_path / "study"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert dse("validate", space, cwd=elsewhere).exit_code == 0
    res = dse("run", "--space", space, "--trials", "6", "--twin-seed", "2", "--out", out, cwd=elsewhere)
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "dse.json").read_text())
    assert meta["agent"] == "policy" and Path(meta["options"]["policy"]).resolve() == policy.resolve()
    # --trials counts launched runs; a point the memory screen refuses is recorded too, as a trial not launched
    assert re.search(r"launched runs: 6\b", res.output), res.output


def test_a_policy_round_trips_and_acts_as_trained(trained):
    from dse.rl.policy import load
    from dse.rules.space import load_space
    from dse.study.outdir import policy_fingerprint

    space = load_space(SPACE)
    loaded = load(trained.path, trained.policy.sizes, trained.policy.obs_dim, space=policy_fingerprint(space))
    assert loaded.meta == trained.policy.meta and loaded.meta.knobs == space.knob_names
    assert loaded.meta.space is not None and loaded.meta.space.hash == policy_fingerprint(space)["hash"]
    obs_space = trained.policy.net.observation_space
    obs_space.seed(0)
    for _ in range(20):
        obs = obs_space.sample()
        for a, b in zip(trained.policy.log_probs(obs), loaded.log_probs(obs)):
            assert np.array_equal(a, b)


def hostile_files(tmp_path: Path, marker: Path) -> dict[str, Path]:
    """Files named as a policy that would run code if unpickled: SB3's zip layout with a pickle in ``data`` (what
    ``PPO.load`` unpickles), a bare pickle, and a zip whose every member is a pickle."""
    evil = pickle.dumps(Payload(marker))
    files = {"sb3-zip": tmp_path / "sb3.zip", "pickle": tmp_path / "policy.pkl", "torch-zip": tmp_path / "policy.pt"}
    with zipfile.ZipFile(files["sb3-zip"], "w") as z:
        z.writestr("data", evil)
        z.writestr("policy.pth", evil)
        z.writestr("_stable_baselines3_version", "2.3.0")
    files["pickle"].write_bytes(evil)
    with zipfile.ZipFile(files["torch-zip"], "w") as z:
        z.writestr("archive/data.pkl", evil)
    return files


def test_a_pickle_in_a_policy_file_never_runs_and_is_refused_in_one_line(tmp_path):
    marker = tmp_path / "MARKER"
    pickle.loads(pickle.dumps(Payload(marker))).close()  # the payload does what it says
    assert marker.exists()
    marker.unlink()
    for kind, f in hostile_files(tmp_path, marker).items():
        space = policy_space(tmp_path, f.name, name=f"{kind}.toml")
        one_line_error(dse("validate", space), str(space), "search.options.policy", "not a policy")
        out = tmp_path / f"study-{kind}"
        one_line_error(dse("run", "--space", space, "--trials", "2", "--out", out), "not a policy")
        assert not marker.exists(), kind
        assert not out.exists(), kind  # refused before anything was written


def test_a_crafted_policy_file_is_refused_in_one_line_before_any_network_is_built(trained, tmp_path):
    """safetensors files that pass the header check: each refused by its metadata or its tensors."""
    from safetensors.torch import load_file, save_file

    from dse.errors import UserError
    from dse.rl.policy import META_KEY, load

    meta = json.loads(trained.policy.meta.model_dump_json())
    tensors = load_file(str(trained.path))
    sizes, dim = trained.policy.sizes, trained.policy.obs_dim
    cases = {
        "no metadata": (tensors, {}, "no 'dse_policy' metadata"),
        "not json": (tensors, {META_KEY: "{"}, "metadata"),
        "an unknown key": (tensors, {META_KEY: json.dumps({**meta, "loader": "pickle"})}, "metadata loader"),
        "another format": (tensors, {META_KEY: json.dumps({**meta, "format": "sb3"})}, "metadata format"),
        "an unknown architecture": (
            tensors,
            {META_KEY: json.dumps({**meta, "architecture": {**meta["architecture"], "kind": "my.module:Net"}})},
            "metadata architecture.kind",
        ),
        "a huge layer": (
            tensors,
            {META_KEY: json.dumps({**meta, "architecture": {**meta["architecture"], "pi": [10**9]}})},
            "metadata architecture.pi.0",
        ),
        "a tensor too many": (
            {**tensors, "data": tensors["value_net.bias"].clone()},
            {META_KEY: json.dumps(meta)},
            "data",
        ),
        "a wrong shape": (
            {**tensors, "value_net.bias": tensors["action_net.bias"].clone()},
            {META_KEY: json.dumps(meta)},
            "value_net.bias",
        ),
        "another dtype": (
            {k: v.double() for k, v in tensors.items()},
            {META_KEY: json.dumps(meta)},
            "not float32",
        ),
    }
    for name, (state, metadata, needle) in cases.items():
        f = tmp_path / f"{name}.safetensors"
        save_file(state, str(f), metadata=metadata)
        with pytest.raises(UserError, match="not a policy written by dse train-policy") as e:
            load(f, sizes, dim)
        assert needle in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
    big = tmp_path / "big.safetensors"
    with open(big, "wb") as fh:
        fh.truncate(65 * 2**20)  # sparse: no disk
    with pytest.raises(UserError, match="at most"):
        load(big, sizes, dim)
    fifo = tmp_path / "fifo.safetensors"
    import os

    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        load(fifo, sizes, dim)


def test_a_policy_trained_on_another_space_is_a_one_line_error(trained, tmp_path):
    from dse.agents.base import load_agents, make_agent
    from dse.errors import UserError
    from tests.contracts import SPACE as TOY
    from tests.contracts import forecast, mask

    with pytest.raises(UserError, match="trained on a space of"):
        make_agent("policy", load_agents(), TOY, action_mask=mask, forecast=forecast, policy=str(trained.path))
    # the same knobs on another system: the sizes match, the fingerprint does not
    other = policy_space(tmp_path, str(trained.path), name="b200.toml")
    other.write_text(re.sub(r'(?m)^system = "h100"', 'system = "b200"', other.read_text()))
    assert 'system = "b200"' in other.read_text()
    line = one_line_error(dse("run", "--space", other, "--trials", "2", "--out", tmp_path / "s"), "another space")
    assert "system" in line and not (tmp_path / "s").exists()


def test_validate_checks_only_that_the_policy_is_there(trained, tmp_path, monkeypatch):
    """dse validate reads no more of a policy than its first bytes: no network is built, nothing unpickled."""
    from dse.rl import policy

    def never(*a, **k):
        raise AssertionError("dse validate loaded the policy")

    monkeypatch.setattr(policy, "_read", never)
    monkeypatch.setattr(policy, "_network", never)
    assert dse("validate", policy_space(tmp_path, str(trained.path))).exit_code == 0
    one_line_error(dse("validate", policy_space(tmp_path, "missing.safetensors")), "no such policy file")
    (tmp_path / "dir.safetensors").mkdir()
    one_line_error(dse("validate", policy_space(tmp_path, "dir.safetensors")), "not a regular file")


def test_force_replaces_a_file_and_without_it_one_that_appeared_during_training_is_kept(trained, tmp_path):
    from dse.errors import UserError
    from dse.rl.training import save

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")  # as if written while the policy trained (train_policy checked it was absent)
    with pytest.raises(UserError, match="--force"):
        save(trained.policy, notes)
    assert notes.read_text() == "my notes\n" and [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    res = dse("train-policy", SPACE, "--out", notes, "--steps", "64", "--twins", "1", "--force")
    assert res.exit_code == 0, res.output
    assert notes.read_bytes()[8:9] == b"{" and [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_training_leaves_no_logger_directory_behind(tmp_path, monkeypatch):
    """SB3's default logger makes tempdir/SB3-<date> on every learn(); training sets a logger with no outputs, so a
    policy's training writes nothing outside what it was asked to write."""
    import tempfile

    import gymnasium
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from dse.rl.policy import PPO_SETTINGS, Architecture, _learn

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    vec = DummyVecEnv([lambda: gymnasium.make("CartPole-v1")])
    _learn(PPO, vec, PPO_SETTINGS, Architecture(), 32, 0)
    assert not list(tmp_path.glob("SB3-*"))  # (torch may keep its own compile cache there: not training's)
