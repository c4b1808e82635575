"""Contract test suites: base test classes that every agent and every backend passes (as Optuna's
``optuna/testing/pytest_samplers.py`` does for samplers). A class ``Test...`` that subclasses one of these runs
its tests against one implementation; the agents' suite is parametrized over the ``dse.agents`` registry, so a
newly registered agent is held to it without a line here, and tests/test_backend_contract.py fails for a
registered backend that no subclass covers.
"""

from __future__ import annotations

import gzip
import itertools
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces

from dse.agents.base import Agent, Forecast, action_key, agent_class, load_agents, make_agent
from dse.backends.base import Backend
from dse.errors import UserError
from dse.launch import LaunchPlan, build_plan
from dse.recipes.sim.logwriter import SimRun
from tests.trials import LOCAL_SLURM, system, trial

# ------------------------------------------------------------------------------------------------- agents
# A small space whose order of knobs is not alphabetical (b, a, c), with "valid" points where a + b is even.
SPACE = spaces.Dict(OrderedDict([("b", spaces.Discrete(4)), ("a", spaces.Discrete(3)), ("c", spaces.Discrete(2))]))
NAMES = "abc"
ALL = set(itertools.product(range(3), range(4), range(2)))  # keys in NAMES order


def mask(action) -> bool:
    return (action["a"] + action["b"]) % 2 == 0


def objective(action) -> float:  # a smooth landscape with its best at a=2, b=3, c=1
    return float(-((action["a"] - 2) ** 2) - (action["b"] - 3) ** 2 + action["c"])


def forecast(action) -> Forecast | None:
    """A model's view for agents that ``uses_model``: the objective, None where the environment rejects."""
    return Forecast(objective(action), 10.0, 80.0) if mask(action) else None


def drive(agent: Agent, n: int, *, outcome=None) -> list[tuple[int, ...]]:
    """Up to ``n`` propose/observe rounds; each proposal must lie in the action space. ``outcome(action)``
    gives (reward, ok, status) (default: the objective where valid, a rejection elsewhere)."""
    seen = []
    for _ in range(n):
        action = agent.propose()
        if action is None:
            break
        assert set(action) == set(SPACE.spaces), action
        assert SPACE.contains({k: np.int64(v) for k, v in action.items()}), action
        seen.append(action_key(action, NAMES))
        reward, ok, status = (outcome or default_outcome)(action)
        agent.observe(action, reward, ok, status=status, metrics={"step_time_s": 1.0} if ok else {})
    return seen


def default_outcome(action) -> tuple[float, bool, str]:
    return (objective(action), True, "ok") if mask(action) else (-100.0, False, "rejected")


class AgentContract:
    """What every registered agent does: the ``agent_name`` fixture (a registry name) picks the agent.

    Construction is the agent's reset (a fresh agent per search); ``propose`` acts, ``observe`` is told the
    outcome, ``warm_start`` replays a history on resume."""

    @pytest.fixture
    def new(self, agent_name):
        def make(seed: int = 0, **options) -> Agent:
            cls = agent_class(agent_name, load_agents())
            extra = {"forecast": forecast} if cls.uses_model else {}
            return make_agent(agent_name, load_agents(), SPACE, seed=seed, action_mask=mask, **extra, **options)

        return make

    def test_is_a_registered_agent_subclass_with_strict_options(self, agent_name):
        cls = agent_class(agent_name, load_agents())
        assert issubclass(cls, Agent)
        with pytest.raises(UserError):
            make_agent(agent_name, load_agents(), SPACE, no_such_option=1)

    def test_proposes_inside_the_space_never_twice_and_stops_when_exhausted(self, new):
        seen = drive(new(), 3 * len(ALL))
        assert seen and len(seen) == len(set(seen)) and set(seen) <= ALL
        assert len(seen) < 3 * len(ALL)  # it said None: nothing left to try

    def test_an_agent_that_uses_the_mask_proposes_no_masked_point(self, new, agent_name):
        if not agent_class(agent_name, load_agents()).uses_mask:
            pytest.skip(f"{agent_name} learns from rejections: it does not use the mask")
        assert all(mask(dict(zip(NAMES, k))) for k in drive(new(), len(ALL)))

    def test_same_seed_same_sequence(self, new):
        assert drive(new(seed=3), 10) == drive(new(seed=3), 10)

    def test_warm_start_skips_the_history(self, new):
        history = drive(new(), 5)
        second = new()
        second.warm_start((dict(zip(NAMES, k)), *default_outcome(dict(zip(NAMES, k)))[:2]) for k in history)
        assert not set(drive(second, 3 * len(ALL))) & set(history)

    def test_failed_and_rejected_trials_are_data(self, new):
        """Every outcome failed (oom, or rejected where the mask says so): the agent goes on, proposes each
        point at most once, and still stops by itself."""

        def failing(action):
            return -100.0, False, "oom" if mask(action) else "rejected"

        seen = drive(new(), 3 * len(ALL), outcome=failing)
        assert seen and len(seen) == len(set(seen)) and len(seen) < 3 * len(ALL)

    def test_the_five_field_history_of_a_resume_is_accepted(self, new):
        agent = new()
        agent.warm_start(
            [
                ({"a": 0, "b": 0, "c": 0}, objective({"a": 0, "b": 0, "c": 0}), True, "ok", {}),
                ({"a": 1, "b": 0, "c": 0}, -100.0, False, "rejected", None),
            ]
        )
        seen = drive(agent, 3 * len(ALL))
        assert (0, 0, 0) not in seen and (1, 0, 0) not in seen


# ----------------------------------------------------------------------------------------------- backends
def read_log(path: Path) -> str:
    """A run's log as text (the simulated backend may write it gzip-compressed)."""
    return gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()


def steps_in(log: Path) -> int:
    return read_log(log).count("Training epoch")


class StopAfter:
    """A StopCheck that answers True once the log shows ``steps`` training steps."""

    def __init__(self, steps: int, poll_s: float):
        self.steps, self.poll_s, self.calls = steps, poll_s, 0

    def __call__(self, log_path: Path) -> bool:
        self.calls += 1
        return log_path.exists() and steps_in(log_path) >= self.steps


class BackendContract:
    """What every backend does with a plan of the simulated trainer on one node of the local test system.

    A subclass sets ``backend_name`` (its registry name) and implements ``make_backend``; ``step_s`` is the
    simulated trainer's seconds per step where a real process runs it (long enough for a stop to land)."""

    backend_name: str
    step_s: float = 0.05
    run_steps: int = 4  # a run left alone
    stop_steps: int = 400  # a run that the stop check ends long before this
    oom_exit_codes: tuple[int, ...] | None = None  # the exit codes of a run out of memory, where they are fixed
    # after a Ctrl-C stopped the wait: True when the backend hands back a run that had ended by itself
    # (Slurm: the job COMPLETED before the cancel came); False when every such run counts as interrupted
    collects_after_interrupt: bool = False

    def make_backend(self) -> Backend:
        raise NotImplementedError

    def plan(self, max_steps: int, **run) -> LaunchPlan:
        t = trial(
            "llama3_70b_16l",
            sys=system(LOCAL_SLURM),
            num_nodes=1,
            tp=1,
            pp=1,
            cp=1,
            vp=1,
            gbs=4,
            max_steps=max_steps,
            env_DSE_SIM_STEP_S=str(self.step_s),
        )
        return build_plan(
            t,
            payload="sim",
            sim_run=SimRun(**{"step_time_s": 1.0, "tflops_per_gpu": 50.0, "gbs": 4, "max_steps": max_steps, **run}),
        )

    def run_dir(self, tmp_path: Path) -> Path:
        d = tmp_path / "00000"
        d.mkdir()
        return d

    def test_is_the_registered_backend(self):
        from dse.backends import load_backends

        assert type(self.make_backend()) is load_backends()[self.backend_name]()
        assert type(self.make_backend()).name == self.backend_name

    def test_runs_a_plan_into_its_run_directory_with_a_log_and_exit_status(self, tmp_path):
        run_dir = self.run_dir(tmp_path)
        r = self.make_backend().run(self.plan(self.run_steps), run_dir)
        assert r.run_dir == run_dir and r.log_path.parent == run_dir and r.log_path.exists()
        assert r.exit_code == 0 and not r.stopped and r.reason is None
        assert steps_in(r.log_path) == self.run_steps

    def test_a_failed_run_is_data_not_an_exception(self, tmp_path):
        r = self.make_backend().run(self.plan(self.run_steps, oom=True, oom_after=1), self.run_dir(tmp_path))
        assert r.exit_code not in (0, None) and not r.stopped
        assert self.oom_exit_codes is None or r.exit_code in self.oom_exit_codes
        assert "CUDA out of memory" in read_log(r.log_path)

    def test_the_stop_check_ends_the_run_early(self, tmp_path):
        stop = StopAfter(3, poll_s=0.1)
        r = self.make_backend().run(self.plan(self.stop_steps), self.run_dir(tmp_path), stop=stop)
        assert r.stopped and stop.calls >= 1
        assert 3 <= steps_in(r.log_path) < self.stop_steps

    def test_a_stop_check_that_never_fires_leaves_the_run_alone(self, tmp_path):
        stop = StopAfter(10**6, poll_s=0.1)
        r = self.make_backend().run(self.plan(self.run_steps), self.run_dir(tmp_path), stop=stop)
        assert not r.stopped and r.exit_code == 0 and steps_in(r.log_path) == self.run_steps

    def test_a_finished_run_after_an_interrupt_is_collected_as_declared(self, tmp_path):
        plan, run_dir, backend = self.plan(self.run_steps), self.run_dir(tmp_path), self.make_backend()
        backend.run(plan, run_dir)
        got = backend.finished_after_interrupt(plan.trial, run_dir)
        if self.collects_after_interrupt:
            assert got is not None and got.run_dir == run_dir and got.exit_code == 0 and got.log_path.exists()
        else:
            assert got is None

    def test_its_launch_script_is_written_where_it_says_or_refused(self, tmp_path):
        cls = type(self.make_backend())
        if cls.script_name is None:
            with pytest.raises(UserError, match="writes no launch script"):
                cls.write_script(self.plan(self.run_steps), tmp_path)
        else:
            path = cls.write_script(self.plan(self.run_steps), tmp_path)
            assert path == tmp_path / cls.script_name and path.read_text().startswith("#!")
