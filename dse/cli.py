"""The ``dse`` command (Typer): run, dry-run, validate, space, predict, parse, leaderboard, report, recipes.

User errors (:class:`dse.errors.UserError`) print one line and exit with code 2; nothing is written.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

import typer
from rich.console import Console

from dse.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Design-space exploration for NeMo / Megatron training recipes.")
console = Console()
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
    tp_comm_overlap: bool = typer.Option(None, "--tp-comm-overlap/--no-tp-comm-overlap",
                                         help="userbuffers TP overlap (default: on when tp > 1 with sp, as "
                                              "NVIDIA's performance recipes)"),
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
                  fsdp=layout.fsdp if fsdp is None else fsdp, recompute=recompute or layout.recompute)
    for name in ("tp", "pp", "cp", "vp", "mbs", "gbs", "ep", "seq_length", "recompute"):
        knobs.CATALOGUE[name].coerce(values[name], field=f"--{name.replace('_', '-')}")
    sp_on = values["tp"] > 1 if sp is None else sp
    values["tp_comm_overlap"] = (values["tp"] > 1 and sp_on) if tp_comm_overlap is None else tp_comm_overlap
    trial = make_trial(recipe, gpu, num_gpus or recipe.num_gpus_default, **values)
    try:
        from dse.constraints import check
    except ImportError:  # TODO(lead): drop this fallback once dse/constraints.py is merged into this branch
        from dse.perfmodel._fallback_constraints import check
    rejection = check(trial)
    if rejection is not None:
        raise UserError(f"invalid layout ({rejection.rule}): {rejection.reason}")
    pred = predict(trial, flops_convention=flops_convention)
    if as_json:
        out = {"model": recipe.name, "gpu": gpu, "num_gpus": trial.num_gpus, "flops_convention": flops_convention,
               **{k: trial.values[k] for k in ("tp", "pp", "cp", "vp", "ep", "mbs", "gbs", "seq_length", "precision",
                                                "fsdp", "recompute", "tp_comm_overlap")},
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


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
