"""The ``dse`` command (Typer): run, dry-run, validate, space, predict, parse, leaderboard, report, recipes.

User errors (:class:`dse.errors.UserError`) print one line and exit with code 2; nothing is written.
"""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from dse.errors import InfrastructureError, UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Design-space exploration for NeMo / Megatron training recipes.")
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)


def user_errors(fn: Callable) -> Callable:
    """Turn a UserError into one line on stderr and exit code 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            # escaped: messages quote TOML tables ("[search] trials"), which rich would take for markup
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except InfrastructureError as e:  # dse could not write (disk full...): one line, exit 1
            err_console.print(f"[bold red]error:[/] {escape(str(e))} (dse run --resume continues the study; a trial in flight "
                              "was not recorded and runs again)", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


@app.command("recipes")
@user_errors
def recipes_cmd() -> None:
    """List the recipes dse knows, with their architectures."""
    from rich.table import Table

    from recipes.models import RECIPES

    table = Table("recipe", "layers", "hidden", "heads", "groups", "ffn", "vocab", "mlp", "seq", "NeMo 2 recipe")
    for r in RECIPES.values():
        a = r.arch
        table.add_row(r.name, str(a.num_layers), str(a.hidden_size), str(a.num_attention_heads),
                      str(a.num_query_groups), str(a.ffn_hidden_size), str(a.vocab_size),
                      "gated" if a.gated_mlp else "plain", str(r.seq_length),
                      r.nemo2_recipe + (f" (scaled from {r.scaled_from})" if r.scaled_from else ""))
    console.print(table)


@app.command("run")
@user_errors
def run_cmd(
    space_file: Path = typer.Option(..., "--space", help="the space file (TOML)"),
    agent: Optional[str] = typer.Option(None, help="grid | random | optuna | guided (default: the space's [search].agent)"),
    sampler: Optional[str] = typer.Option(None, help="Optuna sampler: tpe, random, qmc, nsga2, gp, cmaes"),
    trials: Optional[int] = typer.Option(None, min=1, help="trial budget (default: the space's; grid: every valid point)"),
    seed: Optional[int] = typer.Option(None, help="seed for the agent and the simulated jitter"),
    backend: Optional[str] = typer.Option(None, help="sim | local | slurm (default: the space's [backend].kind)"),
    out: Optional[Path] = typer.Option(None, help="output directory (default: runs/<space name>)"),
    resume: bool = typer.Option(False, "--resume", help="continue the study already in --out"),
    storage: Optional[str] = typer.Option(None, help="Optuna storage URL (default: sqlite file in --out)"),
    twin_seed: Optional[int] = typer.Option(None, "--twin-seed", min=0,
                                            help="simulated backend: measure on the twin truth of this seed "
                                                 "(sets [backend] truth = \"twin\", twin_seed = N)"),
    rebuild: bool = typer.Option(False, "--rebuild", help="with --resume: start anew a study whose database "
                                 "is empty or gone (the old run directories are set aside)"),
    gpu: Optional[str] = typer.Option(None, help="GPU generation for --space cloudai:FILE (CloudAI's files lack it)"),
) -> None:
    """Run a design-space exploration: one trial per step until the budget or the space is exhausted."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dse.study import run_study

    space = with_twin(_load_space_arg(space_file, gpu), twin_seed)
    out_dir = out or Path("runs") / space.name
    if seed is not None and not 0 <= seed < 2**32:
        raise UserError(f"{seed} is out of range; a seed is an integer from 0 to {2**32 - 1}", field="--seed")
    best = {"reward": None}
    # The bar starts with the first trial, so that an error before the study starts is the only line printed.
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.fields[best]}"), console=err_console, transient=False)
    task = progress.add_task(f"{space.name}", total=None, best="")

    def on_trial(rec, done, budget):
        if not progress.live.is_started:
            progress.start()
        if rec.ok and (best["reward"] is None or rec.reward > best["reward"]):
            best["reward"] = rec.reward
        progress.update(task, completed=done, total=budget,
                        best=f"best {space.objective.metric}: {abs(best['reward']):.4g}" if best["reward"] is not None else "")

    try:
        result = run_study(space, out_dir=out_dir, agent=agent, sampler=sampler, trials=trials, seed=seed,
                           backend=backend, resume=resume, storage=storage, rebuild=rebuild, on_trial=on_trial)
    finally:
        progress.stop()
    _print_summary(result.records, list(space.knobs), top=10)
    if result.stop_reason:
        console.print(result.stop_reason, highlight=False)
    console.print(f"{result.new_trials} new trials, {len(result.records)} in the study; "
                  f"leaderboard: {result.leaderboard}")


def with_twin(space, twin_seed: int | None):
    """``space`` with ``[backend] truth = "twin"`` and ``twin_seed`` set, when ``--twin-seed`` is given."""
    if twin_seed is None:
        return space
    return space.model_copy(update={"backend": space.backend.model_copy(update={"truth": "twin",
                                                                                "twin_seed": twin_seed})})


def _load_space_arg(space_file: Path, gpu: Optional[str]):
    """A space file, or ``cloudai:FILE.toml``: a CloudAI NeMoRun test imported on the fly (nothing written)."""
    from dse.space import load_space

    text = str(space_file)
    if text.startswith("cloudai:"):
        from dse.importers.cloudai import import_cloudai

        imported = import_cloudai(text.removeprefix("cloudai:"), gpu=gpu)
        for note in imported.not_imported:
            err_console.print(note.line(), highlight=False, soft_wrap=True)
        return imported.space
    if gpu is not None:
        raise UserError("--gpu is only for --space cloudai:FILE; a dse space names its system", field="--gpu")
    return load_space(space_file)


def _print_summary(records, knob_names, top: int) -> None:
    from collections import Counter

    from rich.table import Table

    from dse.leaderboard import frame

    df = frame(records, knob_names).head(top)
    table = Table(title=f"top {len(df)} trials", show_lines=False)
    cols = ["trial", "status", "reward", "step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu",
            "peak_memory_gib", *knob_names, "gpu_hours", "steps", "early_stopped"]
    for c in cols:
        table.add_column(c, justify="right" if c not in ("status",) else "left")
    for _, row in df.iterrows():
        table.add_row(*[_fmt(row[c]) for c in cols])
    console.print(table)
    counts = Counter(r.status for r in records)
    console.print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    from dse.leaderboard import gpu_hours, savings_line

    spent, to_best = gpu_hours(records)
    launched = sum(r.status != "rejected" for r in records)
    console.print(f"launched runs: {launched}; GPU-hours: {spent:,.1f} spent"
                  + (f", {to_best:,.1f} to the best" if to_best is not None else "") + savings_line(records),
                  highlight=False)


def _fmt(v) -> str:
    import math

    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


@app.command("leaderboard")
@user_errors
def leaderboard_cmd(
    out_dir: Path = typer.Argument(..., help="a dse run's output directory"),
    csv: Optional[Path] = typer.Option(None, "--csv", help="also write the whole table to this CSV file"),
    top: int = typer.Option(20, min=1, help="rows to show"),
) -> None:
    """Show the trials of a study ranked by reward (failures last); optionally export CSV."""
    from dse.leaderboard import frame, write_csv
    from dse.study import open_store

    store, meta = open_store(out_dir)
    records = store.records()
    store.close()
    knob_names = list(meta["knobs"])
    if csv is not None:
        write_csv(frame(records, knob_names), csv)
        console.print(f"wrote {len(records)} rows to {csv}")
    _print_summary(records, knob_names, top=top)


@app.command("validate")
@user_errors
def validate_cmd(files: list[Path] = typer.Argument(..., help="space files")) -> None:
    """Check space files: schema, knob names and values, recipe, system. Exit 2 on the first bad file."""
    from dse.space import load_space

    for f in files:
        s = load_space(f)
        console.print(f"[green]ok[/] {f}: {s.recipe} on {s.num_nodes} x {s.system.gpus_per_node} {s.system.gpu}, "
                      f"{len(s.knobs)} knobs, {s.size} points")


@app.command("space")
@user_errors
def space_cmd(
    space_file: Path = typer.Argument(..., help="a space file"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    twin_seed: Optional[int] = typer.Option(None, "--twin-seed", min=0,
                                            help="also print the twin truth of this seed: its step-time MAPE "
                                                 "against the model over the valid points"),
) -> None:
    """Count a space's raw and valid points, and the rejections by rule: exactly up to 100,000 raw points,
    estimated from 20,000 seeded uniform draws above (the output says which)."""
    import json

    from dse.counting import SAMPLES, count_valid
    from dse.space import WALK_LIMIT, load_space

    s = load_space(space_file)
    if twin_seed is not None and s.size > WALK_LIMIT:
        raise UserError(f"the twin is measured over every valid point; this space has {s.size:,} raw points "
                        f"(at most {WALK_LIMIT:,})", field="--twin-seed")
    if s.size > 10_000 and s.size <= WALK_LIMIT and not as_json:
        from rich.progress import Progress

        with Progress(console=err_console, transient=True) as bar:
            task = bar.add_task("counting valid points", total=s.size)
            count = count_valid(s, on_progress=lambda done, raw: bar.update(task, completed=done))
    else:
        if s.size > WALK_LIMIT and not as_json:
            err_console.print(f"{s.size:,} raw points (more than {WALK_LIMIT:,}): estimating the valid ones "
                              f"from {SAMPLES:,} seeded draws", highlight=False)
        count = count_valid(s)
    valid, by_rule = count.valid, count.by_rule
    data = {"space": s.name, "recipe": s.recipe, "gpu": s.system.gpu,
            "num_gpus": s.num_nodes * s.system.gpus_per_node, "knobs": {k: list(v) for k, v in s.knobs.items()},
            "raw": s.size, "valid": valid, "exact": count.exact, "rejected_by_rule": by_rule}
    if not count.exact:
        # JSON numbers are exact integers in Python's json; other readers may round them above 2^53
        data.update({"samples": count.samples, "valid_ci95": [count.valid_low, count.valid_high]})
    if twin_seed is not None:
        from dse.perfmodel import predict
        from dse.perfmodel.twin import make_twin, mape, valid_trials

        trials = valid_trials(s)
        twin = make_twin(s, twin_seed, trials=trials)
        fits = [t for t in trials if twin.predict(t).fits]
        data["twin"] = {"seed": twin_seed, "step_time_mape": mape(twin, trials), "layout_scale": twin.scale,
                        "memory_reserve_gib": twin.params.memory_reserve_gib,
                        "fit_on_twin": len(fits), "fit_in_model": sum(predict(t).fits for t in trials)}
    if as_json:
        print(json.dumps(data))
        return
    from rich.table import Table

    if count.exact:
        console.print(f"{s.name}: {s.recipe} on {data['num_gpus']} {s.system.gpu} GPUs; "
                      f"{s.size} raw points, [bold]{valid} valid[/]")
        table = Table("rule (first broken)", "rejected")
    else:
        console.print(f"{s.name}: {s.recipe} on {data['num_gpus']} {s.system.gpu} GPUs; {s.size:,} raw points, "
                      f"[bold]about {valid:,} valid[/] (estimated from {count.samples:,} seeded uniform draws; "
                      f"95% interval {count.valid_low:,} to {count.valid_high:,})", highlight=False)
        table = Table("rule (first broken)", f"rejected (of {count.samples:,} draws)")
    for rule, n in by_rule.items():
        table.add_row(rule, str(n))
    console.print(table)
    if "twin" in data:
        tw = data["twin"]
        console.print(f"twin seed {tw['seed']}: step-time MAPE {100 * tw['step_time_mape']:.1f}% against the model "
                      f"over the {valid} valid points; memory reserve {tw['memory_reserve_gib']:.1f} GiB; "
                      f"{tw['fit_on_twin']} points fit on the twin, {tw['fit_in_model']} in the model")


@app.command("report")
@user_errors
def report_cmd(
    out_dir: Path = typer.Argument(..., help="a dse run's output directory"),
    html_file: Optional[Path] = typer.Option(None, "--html", help="where to write (default: DIR/report.html)"),
) -> None:
    """Write the study's HTML report: best configuration, plots, leaderboard (self-contained)."""
    from dse import report
    from dse.study import open_store

    store, meta = open_store(out_dir)
    records = store.records()
    store.close()
    path = report.write(records, meta, html_file or Path(out_dir) / "report.html")
    console.print(f"wrote {path} ({len(records)} trials)")
@app.command("parse")
@user_errors
def parse_cmd(
    log: str = typer.Argument(..., help="the training log to read", show_default=False),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object instead of lines"),
    gbs: int | None = typer.Option(None, "--gbs", help="global batch size (for tokens/s/GPU)"),
    seq_length: int | None = typer.Option(None, "--seq-length", help="sequence length (for tokens/s/GPU)"),
    num_gpus: int | None = typer.Option(None, "--num-gpus", help="GPUs of the run (for tokens/s/GPU)"),
    exit_code: int | None = typer.Option(None, "--exit-code", help="the run's exit code, when known"),
    scheduler_state: str | None = typer.Option(None, "--scheduler-state",
                                                  help="Slurm's final state (COMPLETED, TIMEOUT, ...)"),
) -> None:
    """Read a training log: status, reason, steady-state step time, TFLOP/s/GPU, tokens/s/GPU, memory."""
    import json
    from pathlib import Path

    from dse.parse import ParseContext, parse_log

    path = Path(log)
    if not path.is_file():
        raise UserError("no such log file (give the path of a training log)", file=log)
    m = parse_log(path, exit_code=exit_code, scheduler_state=scheduler_state,
                  context=ParseContext(gbs=gbs, seq_length=seq_length, num_gpus=num_gpus))
    d = m.to_dict()
    keys = ("status", "reason", "step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_memory_gib",
            "steps", "loss")
    shown = {k: d[k] for k in keys} | {k: v for k, v in d.items() if k not in keys}
    if json_out:
        typer.echo(json.dumps(shown))
    else:
        for k in keys + ("partial", "step_time_mean_s", "step_time_p10_s", "step_time_p90_s", "log_format"):
            v = shown[k]
            text = json.dumps(v) if v is None or isinstance(v, bool) else f"{v:.6g}" if isinstance(v, float) else v
            typer.echo(f"{k}: {text}")


# Knobs that are not part of a layout's prediction (run length) or that a flag of their own covers.
_PREDICT_SKIP = ("num_nodes", "max_steps")


def _predict_options() -> list[inspect.Parameter]:
    """One option per catalogue knob (``--tp``, ``--fsdp/--no-fsdp``...), generated so that a new knob is a
    new flag with nothing else to write. Every default is None: unset knobs resolve as in a space."""
    from dse import knobs

    params = []
    for name, k in knobs.CATALOGUE.items():
        if name in _PREDICT_SKIP:
            continue
        flag = "--" + name.replace("_", "-")
        if k.kind == "bool":
            opt = typer.Option(None, f"{flag}/--no-{flag[2:]}", help=k.help)
            ann: Any = Optional[bool]
        elif k.kind == "int":
            opt, ann = typer.Option(None, flag, help=k.help), Optional[int]
        else:
            allowed = f" ({', '.join(k.choices)})" if k.choices else ""
            opt, ann = typer.Option(None, flag, help=k.help + allowed), Optional[str]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann))
    return params


def _parse_set(items: list[str]) -> dict[str, Any]:
    """``--set knob=value`` pairs; values read as TOML literals (4, true, "x"), bare words as strings."""
    import tomllib

    out: dict[str, Any] = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq or not name:
            raise UserError(f"{item!r} is not knob=value", field="--set")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        out[name.strip()] = value
    return out


def predict_cmd(
    model: Optional[str] = None, model_file: Optional[str] = None, gpu: Optional[str] = None,
    system_ref: Optional[str] = None, gpus_per_node: Optional[int] = None, num_gpus: Optional[int] = None,
    set_: Optional[list[str]] = None, flops_convention: str = "causal", as_json: bool = False,
    calibration: Optional[str] = None, **knob_flags: Any,
) -> None:
    """Predict step time, throughput and memory of one layout with the analytical performance model.

    Unset knobs resolve as in a space: catalogue defaults, then the recipe's layout for the GPU.
    """
    # The layout resolves as a point of a one-point space does in `dse run`, is checked by the same rules and
    # predicted by the same call, so one layout has one prediction whichever command asks.
    import json

    from dse import knobs
    from dse.constraints import check
    from dse.errors import did_you_mean
    from dse.perfmodel import HARDWARE, predict
    from dse.perfmodel.trials import default_system, load_model_file
    from dse.space import Space, load_system
    from dse.trial import resolve
    from recipes.models import RECIPES, Recipe

    if (model is None) == (model_file is None):
        raise UserError("give exactly one of --model NAME and --model-file FILE", field="--model")
    if (gpu is None) == (system_ref is None):
        raise UserError("give exactly one of --gpu GEN and --system NAME|FILE", field="--gpu")
    if gpu is not None and gpu not in HARDWARE:
        raise UserError(f"{gpu!r} is not allowed{did_you_mean(gpu, HARDWARE)}; use one of {', '.join(HARDWARE)}",
                        field="--gpu")
    if flops_convention not in ("causal", "noncausal"):
        raise UserError(f"{flops_convention!r} is not allowed; use causal or noncausal", field="--flops-convention")
    system = default_system(gpu) if gpu is not None else load_system(system_ref)
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise UserError(f"{gpus_per_node} is out of range; give at least 1", field="--gpus-per-node")
        system = system.model_copy(update={"gpus_per_node": gpus_per_node})
    settings: dict[str, Any] = {}
    for name, value in knob_flags.items():
        if value is not None:
            flag = "--" + name.replace("_", "-")
            settings[name] = knobs.CATALOGUE[name].coerce(value, field=flag)
    for name, value in _parse_set(set_ or []).items():
        if name in _PREDICT_SKIP:
            raise UserError(f"{name} is not a layout knob here; use --num-gpus", field=f"--set {name}")
        settings[name] = knobs.get(name, field=f"--set {name}").coerce(value, field=f"--set {name}")
    if model is not None:
        recipe = RECIPES.get(model)
        if recipe is None:
            raise UserError(f"unknown recipe {model!r}{did_you_mean(model, RECIPES)}; see 'dse recipes'", field="--model")
    else:
        arch = load_model_file(model_file)
        if "seq_length" not in settings or num_gpus is None:
            raise UserError("--seq-length and --num-gpus are required with --model-file", field="--model-file")
        recipe = Recipe(arch.name, arch, "", None, settings["seq_length"], num_gpus)
    world = num_gpus or recipe.num_gpus_default
    if world < 1 or world % system.gpus_per_node:
        raise UserError(f"{world} is not a multiple of the {system.gpus_per_node} GPUs per node of {system.name}",
                        field="--num-gpus")
    # A one-point space: the same resolve -> check -> predict as a study. A --model-file architecture is not
    # in the registry, so the space names a registered recipe and resolve() gets the architecture itself.
    space = Space.model_validate({"name": "predict", "recipe": recipe.name if model else next(iter(RECIPES)),
                                  "system": system, "num_nodes": world // system.gpus_per_node,
                                  "settings": settings, "source": "command line"})
    trial = resolve(space, {}, recipe=recipe)
    rejection = check(trial)
    if rejection is not None:
        raise UserError(f"invalid layout ({rejection.rule}): {rejection.reason}")
    params = None
    if calibration is not None:
        from dse.calibrate import apply, load_calibration

        params = apply(load_calibration(calibration, gpu=system.gpu))
    pred = predict(trial, flops_convention=flops_convention, **({"params": params} if params else {}))
    if as_json:
        shown = {k: trial.values[k] for k in knobs.CATALOGUE if k not in _PREDICT_SKIP}
        out = {"model": recipe.name, "gpu": system.gpu, "system": system.name, "num_gpus": trial.num_gpus,
               "flops_convention": flops_convention, "calibration": calibration, **shown, "sp": trial.sequence_parallel, "dp": trial.dp,
               **pred.as_dict()}
        typer.echo(json.dumps(out, indent=2))
        return
    from rich.table import Table

    table = Table("quantity", "value", title=f"{recipe.name} on {trial.num_gpus} x {system.gpu} ({trial.precision}): "
                  f"tp={trial.tp} pp={trial.pp} cp={trial.cp} vp={trial.vp} dp={trial.dp} mbs={trial.mbs} "
                  f"gbs={trial.gbs} seq={trial.seq_length} sp={trial.sequence_parallel} fsdp={trial.fsdp} "
                  f"recompute={trial.recompute} tp_comm_overlap={trial.tp_comm_overlap}")
    table.add_row("step time", f"{pred.step_time_s:.3f} s")
    table.add_row("tokens/s/GPU", f"{pred.tokens_per_s_per_gpu:,.0f}")
    table.add_row(f"model TFLOP/s/GPU ({flops_convention})", f"{pred.tflops_per_gpu:.0f}")
    table.add_row("peak memory", f"{pred.peak_memory_gib:.1f} of {pred.gpu_memory_gib:.0f} GiB"
                  + ("" if pred.fits else "  [bold red]OOM[/]"))
    for key, value in pred.breakdown.items():
        table.add_row(f"  {key}", f"{value:.4g}")
    console.print(table)


def _install_predict() -> None:
    """Register ``predict`` with its fixed options plus the generated knob flags (Typer reads the signature)."""
    from dse.hardware import GPU_NAMES
    fixed = [
        ("model", Optional[str], typer.Option(None, "--model", help="recipe name (see 'dse recipes')")),
        ("model_file", Optional[str], typer.Option(None, "--model-file", help="TOML architecture: name, num_layers, "
                                                   "hidden_size, num_attention_heads, num_query_groups, "
                                                   "ffn_hidden_size, vocab_size, gated_mlp")),
        ("gpu", Optional[str], typer.Option(None, "--gpu", help="a GPU generation's default system: "
                                            + ", ".join(GPU_NAMES))),
        ("system_ref", Optional[str], typer.Option(None, "--system", help="a system as a space names it: a name "
                                                   "from conf/systems or a path to a system file")),
        ("gpus_per_node", Optional[int], typer.Option(None, "--gpus-per-node", help="override the system's GPUs per "
                                                      "node (e.g. 1 for a one-GPU run)")),
        ("num_gpus", Optional[int], typer.Option(None, "--num-gpus", help="world size (default: the recipe's)")),
        ("set_", Optional[list[str]], typer.Option(None, "--set", help="knob=value, any catalogue knob (repeatable)")),
        ("flops_convention", str, typer.Option("causal", "--flops-convention", help="causal or noncausal")),
        ("as_json", bool, typer.Option(False, "--json", help="print one JSON object")),
        ("calibration", Optional[str], typer.Option(None, "--calibration", help="a calibration file from "
                                                    "'dse calibrate' (parameters refitted to your runs)")),
    ]
    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a) for n, a, d in fixed]
    fn = user_errors(predict_cmd)
    fn.__signature__ = inspect.Signature(params + _predict_options())  # type: ignore[attr-defined]
    app.command("predict")(fn)


_install_predict()


@app.command("calibrate")
@user_errors
def calibrate_cmd(
    sources: list[str] = typer.Argument(..., help="study directories (dse.json + leaderboard.csv) or TSVs in the "
                                        "format of bench/data/h200_real_runs.tsv"),
    out: Path = typer.Option(..., "--out", help="calibration file to write (TOML)"),
    params: Optional[str] = typer.Option(None, "--params", help="comma-separated parameters to refit (default: "
                                         "the stack parameters the runs identify, and the memory offset)"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="the GPU the runs are on (required for a TSV without a "
                                      "gpu column; checked against the sources otherwise)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Refit the performance model to your own runs and write a calibration file for --calibration."""
    import json

    from dse.calibrate import calibrate, dumps
    from dse.perfmodel import HARDWARE

    if gpu is not None and gpu not in HARDWARE:
        raise UserError(f"{gpu!r} is not allowed; use one of {', '.join(HARDWARE)}", field="--gpu")
    names = [n.strip() for n in params.split(",") if n.strip()] if params else None
    cal, report = calibrate(sources, params=names, gpu=gpu)
    text = dumps(cal)
    tmp = out.with_name(out.name + ".tmp")  # never a half-written file
    tmp.write_text(text)
    tmp.replace(out)
    if as_json:
        typer.echo(json.dumps({"out": str(out), "gpu": cal.gpu, "runs": cal.runs, "sources": cal.sources,
                               "params": report, "fit": cal.fit, "leave_one_out": cal.loo}, indent=2))
        return
    from rich.table import Table

    table = Table("parameter", "shipped", "calibrated", "moved", title=f"dse calibrate: {cal.runs} runs on {cal.gpu}")
    for r in report:
        table.add_row(r["name"], f"{r['old']:.4g}", f"{r['new']:.4g}",
                      f"yes ({r['shift_sigma']:.1f} prior widths)" if r["moved"] else "no")
    console.print(table)

    def pct(v):
        return "-" if v is None else f"{v:.1f}%"
    b, a, lo = cal.fit["before"], cal.fit["after"], cal.loo or {}
    console.print(f"step-time MAPE {pct(b['step_time_mape'])} shipped -> {pct(a['step_time_mape'])} fitted, "
                  f"{pct(lo.get('step_time_mape'))} leave-one-out; peak memory {pct(b['memory_mape'])} -> "
                  f"{pct(a['memory_mape'])}, {pct(lo.get('memory_mape'))} leave-one-out", highlight=False)
    console.print(f"wrote {out}", highlight=False)


import_app = typer.Typer(no_args_is_help=True, help="Convert another tool's files into a dse space.")
app.add_typer(import_app, name="import")


@import_app.command("cloudai")
@user_errors
def import_cloudai_cmd(
    test_file: Path = typer.Argument(..., help="CloudAI NeMoRun test or test-scenario TOML"),
    system: Optional[Path] = typer.Option(None, "--system", help="CloudAI Slurm system TOML"),
    out: Path = typer.Option(..., "--out", help="the dse space to write (a system file goes beside it)"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU generation (CloudAI's files do not name it)"),
    test: Optional[str] = typer.Option(None, "--test", help="the [[Tests]] id to import from a scenario of several"),
) -> None:
    """Write a dse space (and with --system a dse system file) from CloudAI's NeMoRun test and Slurm system."""
    from dse.importers.cloudai import import_cloudai
    from dse.space import load_space

    imported = import_cloudai(test_file, system_path=system, gpu=gpu, out=out, test_id=test)
    # everything is built and validated before the first byte is written
    files = {out: imported.space_text}
    if imported.system_text is not None and imported.system_file:
        files[out.parent / imported.system_file] = imported.system_text
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            path.write_text(text)
    except OSError as e:
        raise UserError(f"cannot write: {e}", file=str(out)) from None
    try:
        space = load_space(out)  # the written file itself must load; if not, leave nothing behind
    except UserError:
        for path in files:
            path.unlink(missing_ok=True)
        raise
    for line in imported.defaults:
        console.print(f"CloudAI's default (the file leaves it out): {line}", highlight=False, soft_wrap=True)
    for note in imported.not_imported:
        console.print(note.line(), highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(map(str, files))}: {space.recipe} on {space.num_nodes} x "
                  f"{space.system.gpus_per_node} {space.system.gpu}, {len(space.knobs)} knobs, {space.size} points "
                  f"(CloudAI's list product: {imported.cloudai_points}); {len(imported.not_imported)} field(s) not imported")


@app.command("dry-run")
@user_errors
def dry_run_cmd(
    space: str = typer.Option(..., "--space", help="space file (TOML)"),
    backend: str = typer.Option("slurm", "--backend", help="slurm (sbatch scripts) or local (bash scripts)"),
    out: str = typer.Option(..., "--out", help="directory for the scripts (one folder per trial)"),
    limit: int | None = typer.Option(None, "--limit", help="write at most this many valid trials"),
) -> None:
    """Write each valid trial's launch script under --out and print a summary; nothing is submitted."""
    from pathlib import Path

    from rich.table import Table

    from dse.dryrun import dry_run
    from dse.space import load_space

    sp = load_space(space)
    result = dry_run(sp, backend, Path(out), limit)
    table = Table("trial", *sp.knob_names, "nodes x GPUs", "script", title=f"dse dry-run: {sp.name} ({backend})")
    for r in result.rows:
        table.add_row(f"{r.index:05d}", *(str(r.knobs.get(k)) for k in sp.knob_names),
                      f"{sp.num_nodes} x {sp.system.gpus_per_node}", str(r.script))
    console.print(table)
    for reason, count in result.rejected.most_common():
        console.print(f"[yellow]rejected[/] {count} x {reason}", highlight=False, soft_wrap=True)
    if result.stopped:
        console.print(result.stopped, highlight=False)
    n = len(result.rows)
    console.print(f"{n} {backend} script(s) written under {out}; {sum(result.rejected.values())} rejected; "
                  "nothing submitted.")


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
