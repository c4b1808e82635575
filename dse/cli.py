"""The ``dse`` command (Typer): run, dry-run, validate, space, predict, parse, leaderboard, report, recipes.

User errors (:class:`dse.errors.UserError`) print one line and exit with code 2; nothing is written.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console

from dse.errors import UserError

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
            err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

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
    agent: Optional[str] = typer.Option(None, help="grid | random | optuna (default: the space's [search].agent)"),
    sampler: Optional[str] = typer.Option(None, help="Optuna sampler: tpe, random, qmc, nsga2, gp, cmaes"),
    trials: Optional[int] = typer.Option(None, min=1, help="trial budget (default: the space's; grid: every valid point)"),
    seed: Optional[int] = typer.Option(None, help="seed for the agent and the simulated jitter"),
    backend: Optional[str] = typer.Option(None, help="sim | local | slurm (default: the space's [backend].kind)"),
    out: Optional[Path] = typer.Option(None, help="output directory (default: runs/<space name>)"),
    resume: bool = typer.Option(False, "--resume", help="continue the study already in --out"),
    storage: Optional[str] = typer.Option(None, help="Optuna storage URL (default: sqlite file in --out)"),
) -> None:
    """Run a design-space exploration: one trial per step until the budget or the space is exhausted."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dse.space import load_space
    from dse.study import run_study

    space = load_space(space_file)
    out_dir = out or Path("runs") / space.name
    best = {"reward": None}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[best]}"), console=err_console, transient=False) as progress:
        task = progress.add_task(f"{space.name}", total=None, best="")

        def on_trial(rec, done, budget):
            if rec.ok and (best["reward"] is None or rec.reward > best["reward"]):
                best["reward"] = rec.reward
            progress.update(task, completed=done, total=budget,
                            best=f"best {space.objective.metric}: {abs(best['reward']):.4g}" if best["reward"] is not None else "")

        result = run_study(space, out_dir=out_dir, agent=agent, sampler=sampler, trials=trials, seed=seed,
                           backend=backend, resume=resume, storage=storage, on_trial=on_trial)
    _print_summary(result.records, list(space.knobs), top=10)
    console.print(f"{result.new_trials} new trials, {len(result.records)} in the study; "
                  f"leaderboard: {result.leaderboard}")


def _print_summary(records, knob_names, top: int) -> None:
    from collections import Counter

    from rich.table import Table

    from dse.leaderboard import frame

    df = frame(records, knob_names).head(top)
    table = Table(title=f"top {len(df)} trials", show_lines=False)
    cols = ["trial", "status", "reward", "step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu",
            "peak_memory_gib", *knob_names]
    for c in cols:
        table.add_column(c, justify="right" if c not in ("status",) else "left")
    for _, row in df.iterrows():
        table.add_row(*[_fmt(row[c]) for c in cols])
    console.print(table)
    counts = Counter(r.status for r in records)
    console.print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


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
) -> None:
    """Count a space's raw and valid points, and the rejections by rule."""
    import json
    from collections import Counter

    from dse import constraints
    from dse.space import load_space
    from dse.trial import resolve

    s = load_space(space_file)
    by_rule: Counter[str] = Counter()
    valid = 0
    for point in s.points():
        rej = constraints.check(resolve(s, point))
        if rej is None:
            valid += 1
        else:
            by_rule[rej.rule] += 1
    data = {"space": s.name, "recipe": s.recipe, "gpu": s.system.gpu,
            "num_gpus": s.num_nodes * s.system.gpus_per_node, "knobs": {k: list(v) for k, v in s.knobs.items()},
            "raw": s.size, "valid": valid, "rejected_by_rule": dict(by_rule.most_common())}
    if as_json:
        print(json.dumps(data))
        return
    from rich.table import Table

    console.print(f"{s.name}: {s.recipe} on {data['num_gpus']} {s.system.gpu} GPUs; "
                  f"{s.size} raw points, [bold]{valid} valid[/]")
    table = Table("rule (first broken)", "rejected")
    for rule, n in by_rule.most_common():
        table.add_row(rule, str(n))
    console.print(table)


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


@app.command("predict")
@user_errors
def predict_cmd(
    model: str = typer.Option(None, "--model", help="recipe name (see 'dse recipes')"),
    model_file: str = typer.Option(None, "--model-file", help="TOML architecture: name, num_layers, hidden_size, "
                                   "num_attention_heads, num_query_groups, ffn_hidden_size, vocab_size, gated_mlp"),
    gpu: str = typer.Option(..., "--gpu", help="a100, h100, h200, b200, gb200, gb300"),
    num_gpus: int = typer.Option(None, "--num-gpus", help="world size (default: the recipe's)"),
    precision: str = typer.Option("bf16", "--precision", help="bf16 or fp8"),
    seq_length: int = typer.Option(None, "--seq-length", help="default: the recipe's"),
    gbs: int = typer.Option(None, "--gbs", help="global batch size (default: the recipe's layout)"),
    mbs: int = typer.Option(None, "--mbs"),
    tp: int = typer.Option(None, "--tp"),
    pp: int = typer.Option(None, "--pp"),
    cp: int = typer.Option(None, "--cp"),
    vp: int = typer.Option(None, "--vp"),
    ep: int = typer.Option(1, "--ep"),
    fsdp: bool = typer.Option(None, "--fsdp/--no-fsdp", help="Megatron FSDP instead of the distributed optimizer"),
    sp: bool = typer.Option(None, "--sp/--no-sp", help="sequence parallelism (default: on when tp > 1)"),
    recompute: str = typer.Option(None, "--recompute", help="none, selective or full"),
    cpu_offload_layers: int = typer.Option(None, "--cpu-offload-layers",
                                           help="layers whose activations go to host memory (default: the "
                                                "recipe's layout, else 0 = off)"),
    tp_comm_overlap: bool = typer.Option(None, "--tp-comm-overlap/--no-tp-comm-overlap",
                                         help="userbuffers TP overlap (default: on when tp > 1 with sp and NeMo has a "
                                              "userbuffer config for it, as NVIDIA's performance recipes)"),
    fp8_recipe: str = typer.Option("tensorwise", "--fp8-recipe",
                                   help="with --precision fp8: delayed, tensorwise, mxfp8 or blockwise"),
    attention_backend: str = typer.Option("auto", "--attention-backend",
                                          help="auto, flash, fused, unfused or local (Megatron-Core's AttnBackend)"),
    recompute_num_layers: int = typer.Option(0, "--recompute-num-layers",
                                             help="with --recompute full: layers per stage recomputed (0 = all)"),
    flops_convention: str = typer.Option("causal", "--flops-convention", help="causal or noncausal"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Predict step time, throughput and memory of one layout with the analytical performance model."""
    import json

    from dse import knobs
    from dse.errors import did_you_mean
    from dse.perfmodel import HARDWARE, predict
    from dse.perfmodel.trials import load_model_file, make_trial
    from recipes.models import RECIPES, Layout, Recipe

    def choice(value: str, allowed, flag: str) -> str:
        if value not in allowed:
            raise UserError(f"{value!r} is not allowed{did_you_mean(value, allowed)}; use one of {', '.join(allowed)}",
                            field=flag)
        return value

    if (model is None) == (model_file is None):
        raise UserError("give exactly one of --model NAME and --model-file FILE", field="--model")
    choice(gpu, tuple(HARDWARE), "--gpu")
    choice(precision, knobs.CATALOGUE["precision"].choices, "--precision")
    choice(flops_convention, ("causal", "noncausal"), "--flops-convention")
    if model is not None:
        recipe = RECIPES.get(model)
        if recipe is None:
            raise UserError(f"unknown recipe {model!r}{did_you_mean(model, RECIPES)}; see 'dse recipes'", field="--model")
        layout = recipe.default_layout(gpu, precision)
    else:
        arch = load_model_file(model_file)
        if seq_length is None or num_gpus is None:
            raise UserError("--seq-length and --num-gpus are required with --model-file", field="--model-file")
        recipe = Recipe(arch.name, arch, "", None, seq_length, num_gpus)
        layout = Layout()
    values = dict(tp=tp or layout.tp, pp=pp or layout.pp, cp=cp or layout.cp, vp=vp or layout.vp,
                  mbs=mbs or layout.mbs, gbs=gbs or layout.gbs, ep=ep, precision=precision,
                  seq_length=seq_length or recipe.seq_length, sp=sp,
                  fsdp=layout.fsdp if fsdp is None else fsdp, recompute=recompute or layout.recompute,
                  cpu_offload_layers=layout.cpu_offload_layers if cpu_offload_layers is None else cpu_offload_layers,
                  fp8_recipe=fp8_recipe, attention_backend=attention_backend,
                  recompute_num_layers=recompute_num_layers)
    for name in ("tp", "pp", "cp", "vp", "mbs", "gbs", "ep", "seq_length", "recompute", "cpu_offload_layers",
                 "fp8_recipe", "attention_backend", "recompute_num_layers"):
        knobs.CATALOGUE[name].coerce(values[name], field=f"--{name.replace('_', '-')}")
    sp_on = values["tp"] > 1 if sp is None else sp
    values["tp_comm_overlap"] = (values["tp"] > 1 and sp_on) if tp_comm_overlap is None else tp_comm_overlap
    trial = make_trial(recipe, gpu, num_gpus or recipe.num_gpus_default, **values)
    if tp_comm_overlap is None and values["tp_comm_overlap"]:
        from dse.launch import tp_comm_overlap_supported

        if tp_comm_overlap_supported(trial):  # auto: on only where NeMo has a userbuffer config for it
            values["tp_comm_overlap"] = False
            trial = make_trial(recipe, gpu, num_gpus or recipe.num_gpus_default, **values)
    from dse.constraints import check

    rejection = check(trial)
    if rejection is not None:
        raise UserError(f"invalid layout ({rejection.rule}): {rejection.reason}")
    pred = predict(trial, flops_convention=flops_convention)
    if as_json:
        out = {"model": recipe.name, "gpu": gpu, "num_gpus": trial.num_gpus, "flops_convention": flops_convention,
               **{k: trial.values[k] for k in ("tp", "pp", "cp", "vp", "ep", "mbs", "gbs", "seq_length", "precision",
                                                "fp8_recipe", "fsdp", "recompute", "recompute_num_layers",
                                                "cpu_offload_layers", "attention_backend", "tp_comm_overlap")},
               "sp": trial.sequence_parallel, "dp": trial.dp, **pred.as_dict()}
        typer.echo(json.dumps(out, indent=2))
        return
    from rich.table import Table

    table = Table("quantity", "value", title=f"{recipe.name} on {trial.num_gpus} x {gpu} ({precision}): "
                  f"tp={trial.tp} pp={trial.pp} cp={trial.cp} vp={trial.vp} dp={trial.dp} mbs={trial.mbs} "
                  f"gbs={trial.gbs} seq={trial.seq_length} sp={trial.sequence_parallel} fsdp={trial.fsdp} "
                  f"recompute={trial.recompute}")
    table.add_row("step time", f"{pred.step_time_s:.3f} s")
    table.add_row("tokens/s/GPU", f"{pred.tokens_per_s_per_gpu:,.0f}")
    table.add_row(f"model TFLOP/s/GPU ({flops_convention})", f"{pred.tflops_per_gpu:.0f}")
    table.add_row("peak memory", f"{pred.peak_memory_gib:.1f} of {pred.gpu_memory_gib:.0f} GiB"
                  + ("" if pred.fits else "  [bold red]OOM[/]"))
    for key, value in pred.breakdown.items():
        table.add_row(f"  {key}", f"{value:.4g}")
    console.print(table)
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

    from dse.backends.dryrun import dry_run
    from dse.space import load_space

    sp = load_space(space)
    rows = dry_run(sp, backend, Path(out), limit)
    table = Table("trial", *sp.knob_names, "nodes x GPUs", "script", title=f"dse dry-run: {sp.name} ({backend})")
    for r in rows:
        if r.script:
            table.add_row(f"{r.index:05d}", *(str(r.knobs.get(k)) for k in sp.knob_names),
                          f"{sp.num_nodes} x {sp.system.gpus_per_node}", str(r.script))
    console.print(table)
    rejected: dict[str, int] = {}
    for r in rows:
        if r.script is None:
            rejected[r.reason or "?"] = rejected.get(r.reason or "?", 0) + 1
    for reason, count in sorted(rejected.items(), key=lambda kv: -kv[1]):
        console.print(f"[yellow]rejected[/] {count} x {reason}", highlight=False, soft_wrap=True)
    n = sum(1 for r in rows if r.script)
    console.print(f"{n} {backend} script(s) written under {out}; {len(rows) - n} rejected; nothing submitted.")


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
