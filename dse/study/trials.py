"""A study's trials: :class:`StudyLoop` holds what is queued, what is in flight, the best measured and the trials
done, and each of its steps is a method: propose (the agent), screen (the study's evaluator, or a probe), run (the
environment's step, the study's model's figures beside the measured), record (:mod:`dse.study.recording`), learn
(the study's model refit, the agent shown the outcome). ``--parallel N`` keeps N trials in flight
(:mod:`dse.study.parallel`); ``--worker``s claim points in the storage (:mod:`dse.study.claims`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from dse.agents.base import make_agent
from dse.backends import Backend
from dse.backends.base import InfrastructureFailure
from dse.envs.recipe_env import RecipeEnv, better
from dse.errors import Cancelled, UserError
from dse.evaluator import Evaluator, PointForecast
from dse.execute import parse_context
from dse.facts.calibration_file import write as write_calibration
from dse.forecast import study_cost
from dse.logs.parse import UNLAUNCHED_STATUSES, RunMetrics, parse_log
from dse.perfmodel.refit import StudyModel
from dse.rules.counting import count_valid
from dse.rules.space import WALK_LIMIT, Space
from dse.study.claims import Claims
from dse.study.leaderboard import predicted_metrics
from dse.study.outdir import (
    trial_dir,
)
from dse.study.parallel import Done, Pool
from dse.study.probe_screen import ProbeScreen
from dse.study.recording import Recorder, placeholder, record_of
from dse.study.request import Resolved, space_options, study_evaluator
from dse.study.store import Store, TrialRecord

MODEL_FILE = "calibration.toml"  # the study's refit model, a calibration file (--calibration, --warm-start take it)


def _as_metrics(p: PointForecast) -> dict[str, float]:
    return predicted_metrics(p.step_time_s, p.peak_memory_gib, p.memory_gib)


class StepResult(NamedTuple):
    """``RecipeEnv.step``'s five values by name (gymnasium's order)."""

    observation: dict[str, Any]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def with_predicted(result: StepResult, predicted: dict[str, float]) -> StepResult:
    """``result`` with the model's predicted figures beside its measured metrics (what the trial's record keeps)."""
    if not predicted:
        return result
    return result._replace(info={**result.info, "metrics": {**result.info["metrics"], **predicted}})


def _point(knobs: dict[str, Any]) -> tuple:
    return tuple(sorted(knobs.items()))


def _rerun(r: TrialRecord) -> bool:
    """Whether a resume runs this stored trial again: interrupted, or failed for infrastructure (a launch that
    could not start; not the layout's failure)."""
    return r.interrupted or InfrastructureFailure.of(r.status, r.reason) is not None


def _reruns(store: Store, interrupted: list[TrialRecord]) -> list[TrialRecord]:
    """The interrupted (and infrastructure-failed) rows to run again, one per point. A row whose point ran again later anyway (a study from
    a dse that appended reruns) is left as it is: rerunning it would run the point twice (a second streamed
    pass, only when there are such rows)."""
    if not interrupted:
        return []
    wanted = {_point(r.knobs) for r in interrupted}
    finished = {_point(r.knobs) for r in store.iter_records() if not _rerun(r) and _point(r.knobs) in wanted}
    reruns: list[TrialRecord] = []
    for r in interrupted:
        if _point(r.knobs) not in finished and all(r.knobs != q.knobs for q in reruns):
            reruns.append(r)
    return reruns


class StudyLoop:
    """One study's trials, run by its agent. Its state: ``queued`` (reruns of interrupted trials and seed points,
    run before the agent proposes: (number or None, action)), ``in_flight`` (number -> action, while a trial
    runs in the pool), ``best`` (the best value of the objective's metric measured so far, resumed trials and
    other workers' included: for pruning) and ``done`` (launched trials: the budget counts these; a rejected
    point and a screened one cost nothing). ``new`` counts the trials this run recorded.

    Without a pool (``--parallel 1``, no ``--worker``) each trial runs in the calling thread; with one, the
    calling thread proposes, launches and records, the pool's threads only run trials."""

    def __init__(self, space: Space, out: Path, backend: Backend, recorder: Recorder, req: Resolved):
        self.space, self.out, self.backend, self.recorder, self.req = space, out, backend, recorder, req
        self.queued: deque[tuple[int | None, dict[str, int]]] = deque()
        self.in_flight: dict[int, dict[str, int]] = {}
        self.best: float | None = None
        self.done = 0
        self.new = 0
        self.known: set[int] = set()  # --worker: the trials the agent has been shown (others' as they come)
        self.stop_reason: str | None = None
        self.seeding = False  # reruns and seeds first: all of them ended before the agent proposes
        self.idle = False  # the agent had nothing to propose while trials ran: ask again after the next result
        self.claims: Claims | None = None
        self.pool = Pool(req.parallel) if req.parallel > 1 or req.asked.worker else None
        # the study's evaluator: a point's trial, rules and prediction, each once; its model (dse.perfmodel.refit: refit
        # on the study's measured runs) gives the memory screen when on, the agents' forecasts and each launch's figures
        self.model = req.evaluator if req.evaluator is not None else study_evaluator(space, req.backend)
        self.learner: StudyModel = self.model.model
        self.budget, self.total = _budget(space, req, self.model)
        self.screen = self.model if self.model.on else None
        # [search] screen = "probe": each point probed on one GPU before its launch (dse.study.probe_screen)
        self.prober = (
            ProbeScreen(space, out, req.backend, self.model, worker=req.asked.worker)
            if space.search.screen == "probe"
            else None
        )
        self._running = threading.local()  # the number of the trial this thread runs (its run directory)
        self._synced = time.monotonic()
        self.env = RecipeEnv(
            space,
            backend,
            out,
            run_dirs=lambda: trial_dir(out, self._running.number),
            best=lambda: self.best,
            cancel=self.pool.cancel_event if self.pool else None,
            points=self.model,
        )
        self.env.reset(seed=req.seed)
        self.agent = make_agent(
            req.agent,
            req.registry,
            self.env.action_space,
            seed=req.seed,
            action_mask=self.env.action_mask,
            forecast=self.model.forecaster(),
            **space_options(space, req.agent, req.options, req.registry, parallel=req.parallel),
        )

    def _learn(self, number: int, knobs: dict[str, Any], status: str, metrics, *, refit: bool = True) -> None:
        """A finished run shown to the study's model (dse.perfmodel.refit): refit, its line said, the fit kept in the study's
        directory (MODEL_FILE), the agent's forecasts renewed."""
        trial = self.model.trial(knobs)
        line = self.learner.observe(number, trial, status, metrics, refit=refit)
        if line is not None:
            self._refitted(line)

    def _refitted(self, line: str) -> None:
        write_calibration(self.learner.calibration(self.space.system.gpu, str(self.out)), self.out / MODEL_FILE)
        self.agent.reforecast()
        if self.req.asked.on_model is not None:
            self.req.asked.on_model(line)

    # -- before the first trial -----------------------------------------------------------------------
    def replay(self) -> None:
        """Resume: the stored trials shown to the agent in one streamed pass (no list of the study's records;
        only their knobs, and only when seed points must be checked against them). Interrupted rows (few) are
        queued first: each runs again under its own number and in its own run directory, its result in place
        of its row (Store.replace). Then the seed points not yet run."""
        seeds = list(self.req.seeds)
        ran: list[dict[str, Any]] = []
        interrupted: list[TrialRecord] = []
        self.agent.warm_start(self._history(interrupted, ran if seeds else None))
        if self.learner.learns and self.learner.runs:  # resume: refit once on every stored run
            line = self.learner.refit()
            if line is not None:
                self._refitted(line.replace("model:", "model (resumed):", 1))
        reruns = _reruns(self.recorder.store, interrupted)
        rerun_points = [r.knobs for r in reruns]
        self.queued.extend((r.number, self.env.encode(r.knobs)) for r in reruns)
        self.queued.extend(
            (None, self.env.encode(p))
            for i, p in enumerate(seeds)
            if p not in ran and p not in rerun_points and p not in seeds[:i]
        )
        self.seeding = bool(self.queued)

    def _history(self, interrupted: list[TrialRecord], ran: list[dict[str, Any]] | None) -> Iterator[tuple]:
        for r in self.recorder.store.iter_records():
            if _rerun(r):
                interrupted.append(r)
                continue
            if self.req.asked.worker:
                self.known.add(r.number)
            self.done += r.status not in UNLAUNCHED_STATUSES
            self.best = better(self.best, r.metrics, self.space.objective, ok=r.ok)
            if ran is not None:
                ran.append(r.knobs)
            self._learn(r.number, r.knobs, r.status, r.metrics, refit=False)
            yield self.env.encode(r.knobs), r.reward, r.ok, r.status, r.metrics

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> None:
        """Launch, wait, record, until the budget is spent or the agent has nothing left to propose. Whatever
        stops it (a Ctrl-C, an error) stops the trials still running first (their backend's way: scancel, the
        process group) and records each as it ended: interrupted, unless it had finished."""
        self.claims = Claims(self.recorder.store, lease_s=self.req.asked.lease_s) if self.req.asked.worker else None
        try:
            while True:
                self._fill()
                if not self.in_flight:
                    return
                assert self.pool is not None  # trials are in flight only in a pool (_fill runs the others here)
                self._collect(self.pool.wait())
                self.idle = False
        except BaseException:
            self._cancel_in_flight()
            raise
        finally:
            if self.pool is not None:
                self.pool.close()
            if self.claims is not None:
                self.claims.close()  # what it still holds (interrupted trials) is free for --resume at once

    def _fill(self) -> None:
        """Start trials while there is room (a free slot, budget left) and something to run."""
        while (self.pool is None or self.pool.free > 0) and (
            self.budget is None or self.done + len(self.in_flight) < self.budget
        ):
            chosen = self._next()
            if chosen is None:
                return
            number, action = chosen
            if number is None and self._screened(action):
                continue
            if self.pool is None:
                if number is None or not self._ended_meanwhile(number, action):
                    self._run_here(
                        self.recorder.next_number() if number is None else number, action, rerun=number is not None
                    )
            elif not self._launch(number, action):
                self._sync()  # another worker has the point: learn what the others found (once a second)

    def _next(self) -> tuple[int | None, dict[str, int]] | None:
        """The next trial to start: a queued one, else the agent's proposal; None when there is none now (the
        agent's last word is kept when it has stopped for good)."""
        if self.queued:
            return self.queued.popleft()
        if self.seeding and self.in_flight:
            return None
        self.seeding = False
        if self.idle:
            return None
        if self.claims is not None:
            self._sync()
        action = self.agent.propose()
        if action is None:
            if self.in_flight:
                self.idle = True
            else:
                self.stop_reason = self.agent.stop_reason
            return None
        return None, action

    def _screened(self, action: dict[str, int]) -> bool:
        """The memory screen (``[search] screen``): a valid point the model predicts beyond the GPU's memory by
        more than the margin is recorded ``screened`` at once (never launched, no GPU-hours, no launched run)
        and shown to the agent as a failure; True when the point was screened (or another worker has it)."""
        if self.screen is None:
            return False
        trial = self.env.trial(action)  # the point's trial: the screen's (and the rules') input
        if self.env.rejection(action) is not None:
            return False  # rejected: the environment records it as such
        point = self.env.decode(action)
        if self.prober is None:
            why = self.screen.reason(point)
        else:  # the out-of-memory neighbour rule first: a point it screens costs no probe
            why = self.learner.oom_neighbour(trial) or self.prober.reason(action, trial)
        if why is None:
            return False
        over = False
        if self.claims is not None:
            point = self.env.decode(action)
            if not self.claims.claim(point):
                return True  # another worker has (or had) the point
            number = self.recorder.numbered(self._placeholder(0, action))
            self.claims.numbered(point, number)
            over = True
        else:
            number = self.recorder.next_number()
        result = StepResult(*self.env.outcome(action, RunMetrics.screened(why), launched=False, trial=trial))
        result = with_predicted(result, _as_metrics(self.model.point(point)))
        self._finish(number, action, result, over=over)
        return True

    def _step(self, number: int, action: dict[str, int]) -> StepResult:
        """One environment step, in trial ``number``'s run directory (in whichever thread runs it), with what the
        study's model predicted for the point as it launched."""
        self._running.number = number
        predicted = self._predicted(action)
        return with_predicted(StepResult(*self.env.step(action)), predicted)

    def _predicted(self, action: dict[str, int]) -> dict[str, float]:
        """The study's model's figures for the action's point now (:func:`dse.study.leaderboard.predicted_metrics`);
        none for a point that is not launched for a rule or the backend (the model cannot predict a broken layout)."""
        if self.env.rejection(action) is not None:
            return {}
        return _as_metrics(self.model.point(self.env.decode(action)))

    def _run_here(self, number: int, action: dict[str, int], *, rerun: bool) -> None:
        """One trial in this thread (``--parallel 1``, and points rejected without a launch)."""
        try:
            result = self._step(number, action)
        except KeyboardInterrupt:
            if (got := self._finished_anyway(number, action)) is not None:
                self._finish(number, action, got, over=rerun, check=False)
            elif not rerun:  # recorded as interrupted (not a result): --resume runs the point again
                self.recorder.record(self._placeholder(number, action), over=False)
            raise
        self._finish(number, action, result, over=rerun)

    def _launch(self, number: int | None, action: dict[str, int]) -> bool:
        """One trial into the pool: its number is taken now (an interrupted row until its result comes).
        With ``--worker`` the point is claimed first; False when another worker has it (or had it)."""
        if self.claims is not None:
            return self._launch_claimed(self.claims, number, action)
        if number is not None:
            if self._ended_meanwhile(number, action):
                return True
        elif self.env.rejection(action) is not None:  # never launched: recorded at once
            self._run_here(self.recorder.next_number(), action, rerun=False)
            return True
        else:
            number = self.recorder.next_number()
            self.recorder.launched(self._placeholder(number, action))
        self._submit(number, action)
        return True

    def _launch_claimed(self, claims: Claims, number: int | None, action: dict[str, int]) -> bool:
        point = self.env.decode(action)
        if not claims.claim(point):
            return False
        if number is not None and self._ended_meanwhile(number, action):
            return True
        if number is None:
            number = self.recorder.numbered(self._placeholder(0, action))  # numbered by the storage
        claims.numbered(point, number)
        if self.env.rejection(action) is not None:
            self._run_here(number, action, rerun=True)
        else:
            self._submit(number, action)
        return True

    def _submit(self, number: int, action: dict[str, int]) -> None:
        assert self.pool is not None  # _launch runs only with a pool (_fill)
        self.in_flight[number] = action
        self.pool.submit(number, lambda: self._step(number, action))

    def _collect(self, results: list[Done], *, check: bool = True) -> None:
        """Record finished pool jobs. A job interrupted (a Ctrl-C inside it, or the cancel event) keeps its
        interrupted row unless its run had in fact ended; an error that one of them raised (a bug, dse's own
        failure) or an interrupt is raised once all are recorded (``check``; not while cancelling)."""
        raised: BaseException | None = None
        for d in results:
            action = self.in_flight.pop(d.key)
            result = d.value
            if isinstance(d.error, (KeyboardInterrupt, Cancelled)):
                raised = raised or KeyboardInterrupt()
                if (result := self._finished_anyway(d.key, action)) is None:
                    continue  # its placeholder stays: interrupted
            elif d.error is not None:
                raised = raised or d.error
                continue
            self._finish(d.key, action, result, over=True, check=check)
        if raised is not None and check:
            raise raised

    def _cancel_in_flight(self) -> None:
        """Cancel the pool's trials and record what each came to (the first error is the one reported)."""
        if self.pool is None or not self.in_flight:
            return
        for d in self.pool.cancel():
            try:
                self._collect([d], check=False)
            except Exception:  # noqa: BLE001 - recording one cancelled trial must not hide the error being raised
                pass

    # -- recording -----------------------------------------------------------------------------------
    def _finish(
        self, number: int, action: dict[str, int], result: StepResult, *, over: bool, check: bool = True
    ) -> None:
        """Record a result (``over``: in place of the trial's stored row) and show it to the agent; ``check``:
        then ask the backend whether the study should end (sbatch refusing every job the same way)."""
        info = result.info
        rec = record_of(number, info, result.reward, precision=self.env.trial(action).values["precision"])
        self.recorder.record(rec, over=over)
        self.best = better(self.best, rec.metrics, self.space.objective, ok=rec.ok)
        if self.claims is not None:
            self.claims.done(info["knobs"])
            self.known.add(number)
        if InfrastructureFailure.of(info["status"], info.get("reason")) is not None:
            # an infrastructure failure (sbatch refused the job, a launcher that cannot start) says nothing of
            # the layout: the agent is not shown it, as a resume does not replay it (_history); it closes what it
            # opened for the point (Agent.abandon)
            self.agent.abandon(action)
        else:
            if info["status"] not in UNLAUNCHED_STATUSES:
                self._learn(number, info["knobs"], info["status"], info["metrics"])
            self.agent.observe(
                action, result.reward, info["status"] == "ok", status=info["status"], metrics=info["metrics"]
            )
        self.done += info["status"] not in UNLAUNCHED_STATUSES
        self.new += 1
        if self.req.asked.on_trial:
            self.req.asked.on_trial(rec, self.done, self.total, self.best)
        if check and (why := self.backend.stop_reason()) is not None:
            raise UserError(why, file=self.space.source or None, field=f"system {self.space.system.name}")

    def _placeholder(self, number: int, action: dict[str, int]) -> TrialRecord:
        return placeholder(number, self.env.trial(action), self.space.objective.failed_reward)

    def _finished_anyway(self, number: int, action: dict[str, int]) -> StepResult | None:
        """After a Ctrl-C: the step result of a trial whose run had in fact ended by itself (a Slurm job that
        COMPLETED), parsed as it finished; None when it was interrupted."""
        trial = self.env.trial(action)
        result = self.backend.finished_after_interrupt(trial, trial_dir(self.out, number))
        if result is None or not Path(result.log_path).exists():
            return None
        metrics = parse_log(
            Path(result.log_path),
            exit_code=result.exit_code,
            scheduler_state=result.scheduler_state,
            context=parse_context(trial, self.space.backend),
        )
        got = StepResult(*self.env.outcome(action, replace(metrics, wall_s=result.wall_s), trial=trial))
        return with_predicted(got, self._predicted(action))

    def _ended_meanwhile(self, number: int, action: dict[str, int]) -> bool:
        """A rerun whose earlier run had in fact finished (a Slurm job that COMPLETED after the dse that
        launched it was gone) is parsed and recorded in place instead of run again."""
        if (got := self._finished_anyway(number, action)) is None:
            return False
        self._finish(number, action, got, over=True)
        return True

    def _sync(self) -> None:
        """``--worker``: show the agent what the other workers finished since (at most once a second)."""
        if time.monotonic() - self._synced < 1.0:
            return
        self._synced = time.monotonic()
        for r in self.recorder.store.iter_records():
            if r.number in self.known or r.interrupted:
                continue
            self.known.add(r.number)
            self.best = better(self.best, r.metrics, self.space.objective, ok=r.ok)  # pruning: every worker's best
            if (
                InfrastructureFailure.of(r.status, r.reason) is None
            ):  # another worker's launch that failed: nothing to learn
                self.agent.observe(self.env.encode(r.knobs), r.reward, r.ok, status=r.status, metrics=r.metrics)
            self.done += r.status not in UNLAUNCHED_STATUSES


def _budget(space: Space, req: Resolved, evaluator: Evaluator) -> tuple[int | None, int | None]:
    """The study's budget (launched runs) and the total its progress counts to. ``--trials`` wins; the space's
    ``[search].trials`` belongs to the space's own agent; otherwise no budget: the agent runs until it has
    nothing left (grid: every valid point the screen keeps once, counted for the progress bar when the space is
    small enough)."""
    budget = (
        req.asked.trials
        if req.asked.trials is not None
        else (space.search.trials if req.agent == space.search.agent else None)
    )
    total = budget
    if total is None and req.agent == "grid" and space.size <= WALK_LIMIT:
        # exact at this size (the grid refuses a larger space); screened points are no launched runs
        total = (
            count_valid(space, points=evaluator).valid
            if space.search.screen == "none"
            else study_cost(evaluator, None).runs
        )
    return budget, total
