"""``dse run``: one study (or, with ``--systems``, one per GPU generation), with its progress on the terminal.

Helpers other commands share (a space argument that may be a CloudAI file, ``--twin-seed``) live here too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from dse.cli import render
from dse.errors import UserError


# house: most of its lines are its Typer options, one per line as the formatter writes them; the body is short
def run_cmd(
    space_file: Path = typer.Option(..., "--space", metavar="PATH", help="the space file (TOML)"),
    agent: str | None = typer.Option(
        None, metavar="TEXT", help="grid | random | optuna | guided | policy (default: the space's [search].agent)"
    ),
    sampler: str | None = typer.Option(None, metavar="TEXT", help="Optuna sampler: tpe, random, qmc, nsga2, gp, cmaes"),
    trials: int | None = typer.Option(
        None, min=1, metavar="N", help="trial budget (default: the space's; grid: every valid point)"
    ),
    seed: int | None = typer.Option(None, metavar="N", help="seed for the agent and the simulated jitter"),
    backend: str | None = typer.Option(
        None, metavar="TEXT", help="sim | local | slurm (default: the space's [backend].kind)"
    ),
    out: Path | None = typer.Option(None, metavar="PATH", help="output directory (default: runs/<space name>)"),
    resume: bool = typer.Option(False, "--resume", help="continue the study already in --out"),
    storage: str | None = typer.Option(
        None, metavar="TEXT", help="SQLAlchemy URL of the store (default: sqlite file in --out)"
    ),
    twin_seed: int | None = typer.Option(
        None,
        "--twin-seed",
        min=0,
        metavar="N",
        help='simulated backend: measure on the twin truth of this seed (sets [backend] truth = "twin", twin_seed = N)',
    ),
    calibration: Path | None = typer.Option(
        None,
        "--calibration",
        metavar="FILE",
        help="a calibration file from 'dse calibrate' for the model-guided agent and the memory screen "
        "(sets [backend] calibration = FILE)",
    ),
    no_learn: bool = typer.Option(
        False,
        "--no-learn",
        help="keep the model the study starts from: no refit on its runs (sets [search] learn = false)",
    ),
    rebuild: bool = typer.Option(
        False,
        "--rebuild",
        help="with --resume: start anew a study whose database "
        "is empty or gone (the old run directories are set aside)",
    ),
    gpu: str | None = typer.Option(
        None, metavar="TEXT", help="GPU generation for --space cloudai:FILE (CloudAI's files lack it)"
    ),
    systems: str | None = typer.Option(
        None,
        metavar="TEXT",
        help="comma-separated systems (h100,b200,gb200): "
        "one sub-study each in --out/<system>, same GPU count, then `dse compare`",
    ),
    warm_start: Path | None = typer.Option(
        None,
        "--warm-start",
        metavar="PATH",
        help="a finished study, of any space: its best ok points, mapped into this space and valid here, run first; "
        "on the same GPU the model starts from the study's refit (its calibration.toml)",
    ),
    parallel: int | None = typer.Option(
        None,
        "--parallel",
        min=1,
        max=1024,
        metavar="N",
        help="trials in flight at once (default: the space's [search] parallel, 1)",
    ),
    worker: bool = typer.Option(
        False,
        "--worker",
        help="one of several dse run processes on this study (same --out "
        "or --storage): each point is claimed in the storage before it runs",
    ),
) -> None:
    """Run a design-space exploration: one trial per step until the budget or the space is exhausted."""
    check_trials(trials)
    if systems is not None:
        if worker:
            raise UserError(
                "--worker shares one study between processes; --systems runs one study per system", field="--worker"
            )
        if calibration is not None:
            raise UserError("a calibration is made on one GPU; --systems runs several", field="--calibration")
        return run_systems(
            space_file,
            systems,
            gpu=gpu,
            agent=agent,
            sampler=sampler,
            trials=trials,
            seed=seed,
            backend=backend,
            out=out,
            resume=resume,
            storage=storage,
            twin_seed=twin_seed,
            rebuild=rebuild,
            warm_start=warm_start,
            parallel=parallel,
            no_learn=no_learn,
        )
    from dse.study.loop import Interrupted, Request, run_study

    space = with_calibration(with_learn(with_twin(load_space_arg(space_file, gpu), twin_seed), no_learn), calibration)
    check_seed(seed)
    space, model_words = warm_start_model(space, warm_start)
    seeds = warm_start_seeds(space, warm_start, model_words)
    progress, on_trial = render.trial_progress(space.name, space.objective.metric)
    request = Request(
        out_dir=out,  # none given: the study's default directory, runs/<space name>
        agent=agent,
        sampler=sampler,
        trials=trials,
        seed=seed,
        backend=backend,
        resume=resume,
        storage=storage,
        rebuild=rebuild,
        on_trial=on_trial,
        on_model=lambda line: render.err_console.print(line, highlight=False, markup=False),
        seeds=seeds,
        parallel=parallel,
        worker=worker,
        on_start=lambda cost: render.study_cost(space, cost),
    )
    try:
        result = run_study(space, request)
    except Interrupted as e:
        progress.stop()
        render.interrupted(e, resume_command(e.out_dir))
        raise typer.Exit(130) from None
    finally:
        progress.stop()
    render.run_result(result, list(space.knobs), space.objective.metric)


def check_trials(trials: int | None) -> None:
    """``--trials`` within the space file's bound (:data:`dse.rules.space.MAX_TRIALS`)."""
    from dse.rules.space import MAX_TRIALS

    if trials is not None and trials > MAX_TRIALS:
        raise UserError(f"{trials} is out of range; a study runs at most {MAX_TRIALS:,} trials", field="--trials")


def check_seed(seed: int | None) -> None:
    """``--seed`` is what NumPy and Optuna accept: 0 to 2^32 - 1."""
    if seed is not None and not 0 <= seed < 2**32:
        raise UserError(f"{seed} is out of range; a seed is an integer from 0 to {2**32 - 1}", field="--seed")


def resume_command(out_dir: Path) -> str:
    """The command line that continues this ``dse run``: as typed, with ``--out`` and ``--resume``."""
    import shlex

    args = list(sys.argv[1:])
    if "--out" not in args and not any(a.startswith("--out=") for a in args):
        args += ["--out", str(out_dir)]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["dse", *args])


def with_twin(space, twin_seed: int | None):
    """``space`` with ``[backend] truth = "twin"`` and ``twin_seed`` set, when ``--twin-seed`` is given."""
    if twin_seed is None:
        return space
    if not 0 <= twin_seed < 2**32:  # as [backend] twin_seed: numpy's seeds are unsigned 32-bit
        raise UserError(f"{twin_seed} is out of range; a seed is an integer from 0 to {2**32 - 1}", field="--twin-seed")
    return space.model_copy(
        update={"backend": space.backend.model_copy(update={"truth": "twin", "twin_seed": twin_seed})}
    )


def with_learn(space, no_learn: bool):
    """``space`` with ``[search] learn = false`` when ``--no-learn`` is given (dse.perfmodel.refit: no refit on its runs)."""
    if not no_learn:
        return space
    return space.model_copy(update={"search": space.search.model_copy(update={"learn": False})})


def with_calibration(space, calibration: Path | None):
    """``space`` with ``[backend] calibration`` set to ``calibration`` (checked as the space file's would be: it
    loads and was made on the space's GPU), when ``--calibration`` is given."""
    if calibration is None:
        return space
    from dse.facts.calibration_file import load_calibration

    try:
        load_calibration(calibration, gpu=space.system.gpu)
    except UserError as e:
        raise UserError(e.message, file=e.file or str(calibration), field="--calibration") from None
    update = {"calibration": str(calibration.resolve())}
    return space.model_copy(update={"backend": space.backend.model_copy(update=update)})


def load_space_arg(space_file: Path, gpu: str | None):
    """A space file, or ``cloudai:FILE.toml``: a CloudAI NeMoRun test imported on the fly (nothing written)."""
    from dse.rules.space import load_space

    text = str(space_file)
    if text.startswith("cloudai:"):
        from dse.importers.cloudai import import_cloudai

        imported = import_cloudai(text.removeprefix("cloudai:"), gpu=gpu)
        for note in imported.not_imported:
            render.note(note.line())
        return imported.space
    if gpu is not None:
        raise UserError("--gpu is only for --space cloudai:FILE; a dse space names its system", field="--gpu")
    return load_space(space_file)


def warm_start_model(space, study_dir: Path | None):
    """``space`` starting from the model a finished study learnt (``--warm-start``): its refit, the
    ``calibration.toml`` it keeps (dse.perfmodel.refit), as ``[backend] calibration``, when it was made on this space's GPU
    and neither the space nor ``--calibration`` names one; and the words the warm start's line says of the model."""
    if study_dir is None:
        return space, ""
    from dse.facts.calibration_file import load_calibration
    from dse.study.loop import MODEL_FILE

    path = study_dir / MODEL_FILE
    if space.backend.calibration:
        return space, f"the model: the calibration this study names, not the refit {path} keeps"
    if not path.is_file():
        return space, f"the model: the shipped one (no refit {path} kept there)"
    cal = load_calibration(path)  # a broken file is one line naming it and the field
    if cal.gpu != space.system.gpu:
        return space, f"the model: the shipped one (its refit {path} is of {cal.gpu}, not {space.system.gpu})"
    space = with_calibration(space, path)
    return space, f"the model starts from its refit on {cal.runs} runs ({path})"


def warm_start_seeds(space, study_dir: Path | None, model_words: str = "") -> list:
    """The points of a finished study (``--warm-start``, any space) mapped into ``space`` and valid there, to run
    first; one line says what was carried and why the rest was not, and (``model_words``) which model the study
    starts from (:func:`warm_start_model`)."""
    if study_dir is None:
        return []
    from dse.study.generations import carry_points

    carried = carry_points(space, study_dir)
    line = carried.line(study_dir, f"at {space.num_nodes} nodes of {space.system.name}")
    render.note(f"{line}; {model_words}" if model_words else line)
    return carried.points


def run_systems(
    space_file: Path,
    systems: str,
    *,
    gpu: str | None,
    out: Path | None,
    resume: bool,
    storage: str | None,
    twin_seed: int | None,
    seed: int | None,
    no_learn: bool = False,
    **kwargs,
) -> None:
    """``dse run --systems``: one sub-study per system (dse.study.generations), then the comparison."""
    from dse.results import compare
    from dse.study.generations import parse_systems, run_generations

    if kwargs.get("rebuild") and not resume:
        raise UserError("--rebuild goes with --resume", field="--rebuild")
    if storage is not None:
        raise UserError(
            "takes no --storage with --systems (each sub-study keeps its own SQLite file)", field="--storage"
        )
    check_seed(seed)
    space = with_learn(with_twin(load_space_arg(space_file, gpu), twin_seed), no_learn)
    names = parse_systems(systems)
    out_dir = out or Path("runs") / space.name

    def on_start(name, sub):
        render.sub_study(name, sub, out_dir / Path(name).stem)

    results = run_generations(
        space,
        names,
        out_dir=out_dir,
        resume=resume,
        seed=seed,
        on_start=on_start,
        on_count=lambda name, count: render.system_count(Path(name).stem, count),
        **kwargs,
    )
    for name, r in zip(names, results):
        if r.stop_reason:  # an agent that stopped by itself says why, per system, as a single study does
            render.line(f"{Path(name).stem}: {r.stop_reason}")
    render.comparison(*compare.write(compare.gather([r.out_dir for r in results]), out_dir))


def probe_cmd(
    space_file: Path = typer.Argument(..., metavar="SPACE", help="the space file (TOML)"),
    point: list[str] | None = typer.Option(
        None, "--point", metavar="KNOB=VALUE", help="probe this one point (repeatable; values as in a space file)"
    ),
    backend: str = typer.Option("local", metavar="TEXT", help="local (this machine's first GPU) | slurm (1-GPU jobs)"),
    out: Path | None = typer.Option(None, metavar="PATH", help="output directory (default: probes/<space name>)"),
    iters: int = typer.Option(3, min=2, metavar="N", help="training iterations of each probe"),
    limit: int | None = typer.Option(None, min=1, metavar="N", help="probe at most N valid points (grid order)"),
    timeout: float = typer.Option(900.0, min=1, metavar="S", help="seconds before a probe is stopped"),
) -> None:
    """Probe a layout on one GPU: for each valid point (or --point), run the ranks that bound its memory and time
    (first and last pipeline stage, the stage with most layers, the one with most experts) one at a time, each as
    one rank of the full job under PyTorch's fake process group (recipes.mcore --fake-process-group). Writes
    probes.csv (measured peak memory and step time per rank, beside the model's predicted peak) in --out."""
    from dse.probe import probe_space

    space = load_space_arg(space_file, None)
    out_dir = out or Path("probes") / space.name
    rows = probe_space(
        space, _parse_point(point or []), out_dir, backend=backend, iters=iters, limit=limit, timeout_s=timeout
    )
    render.probes(rows, out_dir / "probes.csv")


def _parse_point(items: list[str]) -> dict | None:
    """``--point knob=value`` pairs (values read as TOML literals, bare words as strings); None without any."""
    import tomllib

    if not items:
        return None
    out: dict = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq or not name.strip():
            raise UserError(f"{item!r} is not knob=value", field="--point")
        try:
            out[name.strip()] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            out[name.strip()] = text
    return out
