"""The model without a run: ``dse recipes`` (the architectures), ``dse predict`` (one layout through the
performance model) and ``dse calibrate`` (refit the model to your own runs)."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from dse.cli import render
from dse.errors import UserError, did_you_mean
from dse.facts.hardware import GPU_NAMES

if TYPE_CHECKING:
    from dse.rules.trial import TrialConfig


def recipes_cmd() -> None:
    """List the recipes dse knows, with their architectures."""
    from dse.recipes.models import RECIPES

    render.recipes(RECIPES.values())


def _not_predicted(name: str) -> bool:
    """A catalogue knob the model does not read (the run's length, its nodes: ``--num-gpus`` covers them), and so
    no flag of ``dse predict`` (``dse.facts.knobs.Knob.model_arg``)."""
    from dse.facts import knobs

    return name in knobs.CATALOGUE and knobs.CATALOGUE[name].model_arg is None


# The body (39 lines with its docstring) resolves, checks, predicts and hands the output to _prediction_json or
# render; the rest are the command's options, one per line as the formatter writes them.
# house: 55 of its 101 lines are its 12 Typer options and the knob flags
def predict_cmd(
    model: str | None = typer.Option(None, "--model", metavar="TEXT", help="recipe name (see 'dse recipes')"),
    model_file: str | None = typer.Option(
        None,
        "--model-file",
        metavar="TEXT",
        help="TOML architecture: name, "
        "num_layers, hidden_size, num_attention_heads, num_query_groups, "
        "ffn_hidden_size, vocab_size, gated_mlp [, activation: fused | "
        "squared_relu] [, dropout: 0 <= p < 1]",
    ),
    gpu: str | None = typer.Option(
        None, "--gpu", metavar="TEXT", help="a GPU generation's default system: " + ", ".join(GPU_NAMES)
    ),
    system_ref: str | None = typer.Option(
        None,
        "--system",
        metavar="TEXT",
        help="a system as a space names it: a name from conf/systems or a path to a system file",
    ),
    gpus_per_node: int | None = typer.Option(
        None, "--gpus-per-node", metavar="N", help="override the system's GPUs per node (e.g. 1 for a one-GPU run)"
    ),
    num_gpus: int | None = typer.Option(
        None,
        "--num-gpus",
        metavar="N",
        help="world size (default: the GPU count of NVIDIA's preset for the recipe's layout)",
    ),
    set_: list[str] | None = typer.Option(
        None, "--set", metavar="KNOB=VALUE", help="any catalogue knob, its value as in a space file (repeatable)"
    ),
    flops_convention: str = typer.Option("causal", "--flops-convention", metavar="TEXT", help="causal or noncausal"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    calibration: str | None = typer.Option(
        None,
        "--calibration",
        metavar="TEXT",
        help="a calibration file from 'dse calibrate' (parameters refitted to your runs)",
    ),
    container: str | None = typer.Option(
        None,
        "--container",
        metavar="TEXT",
        help="the NeMo / Megatron-Bridge container tag (YY.MM, e.g. 26.04; default: the system's): the model "
        "applies its family's software efficiency",
    ),
    payload: str = typer.Option(
        "nemo2",
        "--payload",
        metavar="TEXT",
        help="the payload that would run it (a space's "
        "[backend] payload): nemo2, mbridge, mcore, sim; the model knows what its code does "
        "beyond the knobs (its loss, FP8 weights, gradient accumulation)",
    ),
    **knob_flags: Any,
) -> None:
    """Predict step time, throughput and memory of one layout with the analytical performance model.

    Unset knobs resolve as in a space: catalogue defaults, then the recipe's layout for the GPU. The layout
    given is taken as given: a recipe default that a validity rule finds in conflict with it is dropped (back to
    the catalogue default), with one line saying which and why. --payload
    is the space's [backend] payload: what that payload's code does beyond the knobs (dse.perfmodel.stack).
    """
    # The layout resolves as a point of a one-point space does in `dse run`, is checked by the same rules and
    # predicted by the same call, so one layout has one prediction whichever command asks.
    from dse.perfmodel import predict
    from dse.perfmodel.trials import default_system
    from dse.rules.space import GPUS_PER_NODE_MAX, load_system

    _check_choices(model, model_file, gpu, system_ref, flops_convention, payload)
    system = default_system(gpu) if gpu is not None else load_system(cast(str, system_ref))  # one of the two
    if gpus_per_node is not None:
        if not 1 <= gpus_per_node <= GPUS_PER_NODE_MAX:
            raise UserError(f"{gpus_per_node} is out of range; give 1 to {GPUS_PER_NODE_MAX}", field="--gpus-per-node")
        system = system.model_copy(update={"gpus_per_node": gpus_per_node})
    container_note = _container_note(
        system.container if container is None else container, "system.container" if container is None else "--container"
    )
    if container is not None:
        system = system.model_copy(update={"container": container})
    settings = _settings(knob_flags, set_ or [])
    if num_gpus is None and gpus_per_node is None:
        system = _part_of_a_node(model, system, settings)
    trial, dropped = _as_given(model, model_file, system, num_gpus, settings, payload)
    # Layout values the user did not pass but the recipe chose (vp = 8 for 405B on H100): named as such in
    # the output, and in an error about them, so a refusal points at the flag to pass.
    from_recipe = _from_recipe(trial, settings)
    _refuse_invalid(trial, from_recipe)
    params = None
    if calibration is not None:
        from dse.perfmodel.calibrate import apply, load_calibration

        params = apply(load_calibration(calibration, gpu=system.gpu))
    pred = predict(trial, flops_convention=flops_convention, **({"params": params} if params else {}))
    notes = _notes(trial, system, settings, container_note)
    if as_json:
        head = {"flops_convention": flops_convention, "calibration": calibration, "payload": payload, **notes}
        typer.echo(json.dumps(_prediction_json(trial, system, pred, head, from_recipe, dropped), indent=2))
        return
    render.prediction(trial, system, pred, flops_convention, from_recipe, dropped + [n for n in notes.values() if n])


def _prediction_json(trial, system, pred, head: dict, from_recipe, dropped: list[str]) -> dict:
    """``dse predict --json``'s object: the point (model, system, the knobs the model reads, derived sizes), the
    command's settings and notes (``head``), which values came from the recipe, and the prediction."""
    from dse.facts import knobs

    shown = {k: trial.values[k] for k in knobs.CATALOGUE if not _not_predicted(k)}
    return {
        "model": trial.recipe.name,
        "gpu": system.gpu,
        "system": system.name,
        "num_gpus": trial.num_gpus,
        "container": system.container,
        "container_family": _family(system.container),
        **head,
        **shown,
        "sp": trial.sequence_parallel,
        "dp": trial.dp,
        "recipe_defaults": sorted(from_recipe),
        "recipe_defaults_dropped": dropped,
        **pred.as_dict(),
    }


def _notes(trial, system, settings: dict[str, Any], container_note: str) -> dict[str, str]:
    """What the prediction is to be read with, each "" where there is nothing to say: the container tag's, the
    attention backend's and the MoE knobs' notes (printed under the table, and keys of ``--json``)."""
    return {
        "container_note": container_note,
        "attention_note": _attention_note(trial, system),
        "moe_note": _moe_note(trial, settings),
    }


def _moe_note(trial, settings: dict[str, Any]) -> str:
    """The MoE-only knobs passed for a dense model, which no payload spells for it (``dse.facts.knobs.MOE_KNOBS``)
    and the model does not read, or "": a space keeps such a point once, as the same run
    (``dse.rules.constraints.dense_takes_no_moe_knobs``), so here it is predicted as the dense layout it is, and
    said so."""
    from dse.facts import knobs

    if trial.arch.is_moe:
        return ""
    passed = [
        f"{k}={knobs.spell_value(v)}"
        for k, v in settings.items()
        if k in knobs.MOE_KNOBS and v != knobs.CATALOGUE[k].default
    ]
    if not passed:
        return ""
    return f"{', '.join(passed)}: no effect on a dense model ({trial.arch.name}), ignored"


def _attention_note(trial, system) -> str:
    """What ``attention_backend=auto`` is priced as where that is not Transformer Engine's fused kernel
    (dse.perfmodel.layout.attention_backend_run), or ""."""
    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.layout import WIDE_HEAD, backend_run

    given = trial.values["attention_backend"]
    run = backend_run(trial.arch, HARDWARE[system.gpu].arch, _family(system.container), given)
    if run == given:
        return ""
    return (
        f"attention_backend {given} is priced as {run}: container {system.container}'s Transformer Engine has no "
        f"fused Blackwell kernel for multi-latent attention heads wider than {WIDE_HEAD}"
    )


def _container_note(tag: str, field: str) -> str:
    """The note of a container tag newer than every family (mapped to the newest), or ""; an older or malformed
    tag is a UserError naming ``field`` and the known families (dse.facts.containers.resolve)."""
    from dse.facts.containers import resolve

    return resolve(tag, field=field).note


def _family(tag: str) -> str:
    """The name of the container family of ``tag`` (already resolved once by :func:`_container_note`)."""
    from dse.facts.containers import resolve

    return resolve(tag).family.name


def _check_choices(model, model_file, gpu, system_ref, flops_convention: str, payload: str) -> None:
    """The options of ``dse predict`` that name one of a fixed set, or one of two options."""
    from dse.facts.hardware import HARDWARE
    from dse.recipes.contract import PAYLOADS

    if (model is None) == (model_file is None):
        raise UserError("give exactly one of --model NAME and --model-file FILE", field="--model")
    if (gpu is None) == (system_ref is None):
        raise UserError("give exactly one of --gpu GEN and --system NAME|FILE", field="--gpu")
    if gpu is not None and gpu not in HARDWARE:
        raise UserError(
            f"{gpu!r} is not allowed{did_you_mean(gpu, HARDWARE)}; use one of {', '.join(HARDWARE)}", field="--gpu"
        )
    if flops_convention not in ("causal", "noncausal"):
        raise UserError(f"{flops_convention!r} is not allowed; use causal or noncausal", field="--flops-convention")
    if payload not in PAYLOADS:
        raise UserError(
            f"{payload!r} is not allowed{did_you_mean(payload, PAYLOADS)}; use one of {', '.join(PAYLOADS)}",
            field="--payload",
        )


def _settings(knob_flags: dict[str, Any], set_: list[str]) -> dict[str, Any]:
    """The knob values passed as flags (``--tp 8``) and as ``--set tp=8``, checked by the catalogue."""
    from dse.facts import knobs

    settings: dict[str, Any] = {}
    for name, value in knob_flags.items():
        if value is not None:
            settings[name] = knobs.CATALOGUE[name].coerce(value, field="--" + name.replace("_", "-"))
    for name, value in _parse_set(set_).items():
        if _not_predicted(name):
            raise UserError(f"{name} is not a layout knob here; use --num-gpus", field=f"--set {name}")
        settings[name] = knobs.get(name, field=f"--set {name}").coerce(value, field=f"--set {name}")
    return settings


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
        except (ValueError, RecursionError):  # an integer of more than 4,300 digits; nesting Python cannot follow
            raise UserError(f"{text[:40]!r}... is not a value dse can read", field=f"--set {name.strip()}") from None
        out[name.strip()] = value
    return out


def _one_point(model, model_file, system, num_gpus: int | None, settings: dict[str, Any], payload: str):
    """The layout as a one-point space resolves it in a study: the same resolve -> check -> predict. A
    ``--model-file`` architecture is not in the registry, so the space names a registered recipe and
    ``resolve`` gets the architecture itself."""
    from dse.facts import knobs
    from dse.perfmodel.trials import load_model_file
    from dse.recipes.models import RECIPES, Recipe
    from dse.rules.space import Space
    from dse.rules.trial import resolve

    if model is not None:
        recipe = RECIPES.get(model)
        if recipe is None:
            raise UserError(
                f"unknown recipe {model!r}{did_you_mean(model, RECIPES)}; see 'dse recipes'", field="--model"
            )
    else:
        arch = load_model_file(model_file)
        if "seq_length" not in settings or num_gpus is None:
            raise UserError("--seq-length and --num-gpus are required with --model-file", field="--model-file")
        recipe = Recipe(arch.name, arch, "", None, settings["seq_length"], num_gpus)
    most = knobs.NODES_MAX * system.gpus_per_node
    if num_gpus is not None and not 1 <= num_gpus <= most:
        raise UserError(
            f"{num_gpus} is out of range; give 1 to {most:,} ({knobs.NODES_MAX:,} nodes of {system.gpus_per_node})",
            field="--num-gpus",
        )
    world = num_gpus if num_gpus is not None else _default_world(recipe, system, settings)
    if world < 1 or world % system.gpus_per_node:
        raise UserError(
            f"{world} is not a multiple of the {system.gpus_per_node} GPUs per node of {system.name}",
            field="--num-gpus",
        )
    space = Space.model_validate(
        {
            "name": "predict",
            "recipe": recipe.name if model else next(iter(RECIPES)),
            "system": system,
            "num_nodes": world // system.gpus_per_node,
            "settings": settings,
            "source": "command line",
            "backend": {"payload": payload},
        }
    )
    return resolve(space, {}, recipe=recipe)


def _default_world(recipe, system, settings: dict[str, Any]) -> int:
    """The world size ``dse predict`` takes when --num-gpus is not given: the one NVIDIA's preset for the
    recipe's default layout on this GPU and precision runs on (``Recipe.default_world``), where its gbs is the
    preset's."""
    from dse.facts import knobs

    precision = settings.get("precision", knobs.CATALOGUE["precision"].default)
    return int(recipe.default_world(system.gpu, precision))


def _part_of_a_node(model: str | None, system, settings: dict[str, Any]):
    """The system with as many GPUs per node as the recipe's default world where that is part of one node (the
    one-GPU reproducers), as ``--gpus-per-node N`` would give; else the system as it is."""
    from dse.recipes.models import RECIPES

    recipe = RECIPES.get(model or "")
    if recipe is None:  # a --model-file needs --num-gpus; an unknown name is refused by _one_point
        return system
    world = _default_world(recipe, system, settings)
    return system.model_copy(update={"gpus_per_node": world}) if world < system.gpus_per_node else system


# the rules a global batch of the right size satisfies: the recipe's gbs is its preset's at the preset's world
BATCH_RULES = ("gbs_divisible", "interleaved_microbatches")


def _scaled_gbs(trial: TrialConfig, rule: str, num_gpus: int | None, settings: dict[str, Any]) -> int | None:
    """The recipe's gbs weak-scaled to the world the user gave, where at that world it breaks a batch rule; None
    where there is nothing to scale (gbs passed, no --num-gpus, another rule, not a whole multiple).

    NVIDIA's presets keep the batch per GPU as they scale a layout out (Megatron-Bridge's
    scripts/performance/configs: Llama 3.1 405B on B300, GBS 768 on 128 GPUs and 1536 on 256 for the same layout;
    DeepSeek-V3, GBS 8192 on 1,024 H100 and 2048 on 256 GB200), so ``gbs * world / preset world``. A study does
    not do this (``dse.rules.trial.resolve``): a space sets gbs in ``[settings]`` or varies it.
    """
    if rule not in BATCH_RULES or "gbs" in settings or num_gpus is None:
        return None
    preset_world = _default_world(trial.recipe, trial.system, settings)
    gbs = trial.layout.gbs
    if num_gpus == preset_world or (gbs * num_gpus) % preset_world:
        return None
    return gbs * num_gpus // preset_world


def _as_given(
    model, model_file, system, num_gpus: int | None, settings: dict[str, Any], payload: str
) -> tuple[TrialConfig, list[str]]:
    """The trial for the user's layout taken as given, and one line per recipe default dropped for it.

    Recipe defaults fill only the knobs the user did not pass, and never make the given layout invalid: while a
    rule rejects the trial and names both a knob the user passed and one whose value came from the recipe (FSDP
    on GB200 against ``--pp 4``: ``fsdp_no_pp``), the recipe's knob goes back to the catalogue's default and the
    point resolves again. A rule that names only the user's knobs, or only the recipe's (defaults that conflict
    with each other or with the world size), still refuses the layout (``_refuse_invalid``, which names the
    recipe's values and their flags). Each pass drops at least one default that is never filled again, so the
    loop ends.

    Studies do not do this: a space's ``[settings]`` and points resolve with the recipe's defaults as they are
    (``dse.rules.trial.resolve``), and a point a default makes invalid is rejected with its rule. A study compares its
    points, so every point keeps the same defaults; dropping a knob for some points and not others would make
    trials differ in knobs the space does not list, and change a study's resolved points (and so its
    fingerprint on resume). A space sets the knob in ``[settings]`` or varies it instead.
    """
    from dse.facts import knobs
    from dse.rules.constraints import check

    given = dict(settings)
    dropped: list[str] = []
    while True:
        trial = _one_point(model, model_file, system, num_gpus, given, payload)
        rejection = check(trial)
        if rejection is None:
            return trial, dropped
        scaled = _scaled_gbs(trial, rejection.rule, num_gpus, given)
        if scaled is not None:
            dropped.append(
                f"recipe default gbs={trial.layout.gbs} (for {_default_world(trial.recipe, trial.system, given)} "
                f"GPUs) scaled to {scaled} for {num_gpus} GPUs: the same batch per GPU ({rejection.rule})"
            )
            given["gbs"] = scaled
            continue
        swap = _fallback(trial, rejection.rule, rejection.knobs, given)
        if swap is not None:
            name, value, note = swap
            dropped.append(note)
            given[name] = value
            continue
        from_recipe = _from_recipe(trial, given)
        culprits = [k for k in rejection.knobs if k in from_recipe]
        against = ", ".join(f"{k} {trial.values[k]}" for k in rejection.knobs if k in settings)
        if not culprits or not against:
            return trial, dropped
        for k in culprits:
            dropped.append(f"recipe default {k}={trial.values[k]} dropped: conflicts with {against} ({rejection.rule})")
            given[k] = knobs.CATALOGUE[k].default


def _fallback(trial: TrialConfig, rule: str, rule_knobs, settings: dict[str, Any]) -> tuple[str, Any, str] | None:
    """(knob, value, note) where rule ``rule`` rejects the trial for one knob alone that the user did not pass and
    whose catalogue entry names a value ``dse predict`` takes instead of the recipe's for that rule
    (``dse.facts.knobs.Fallback``: alltoall for the MoE recipes' flex dispatcher where the payload's flex does not run on
    the GPU); None otherwise. A study does not do this (``_as_given``'s docstring says why)."""
    from dse.facts import knobs

    names = set(rule_knobs)
    name = names.pop() if len(names) == 1 else None
    if name is None or name in settings or name not in knobs.CATALOGUE:
        return None
    fallback, value = knobs.CATALOGUE[name].fallback, trial.values[name]
    if fallback is None or fallback.rule != rule or value != fallback.replaces:
        return None
    note = fallback.note.format(payload=trial.payload, gpu=trial.system.gpu)
    return name, fallback.value, f"recipe default {name}={value} {note} ({rule})"


def _from_recipe(trial, settings: dict[str, Any]) -> dict[str, Any]:
    """The layout values the recipe chose for the GPU (not passed, not the catalogue's default)."""
    from dse.facts import knobs

    return {
        k: trial.values[k]
        for k in knobs.recipe_layout_knobs()
        if k not in settings and trial.values[k] != knobs.CATALOGUE[k].default
    }


def _refuse_invalid(trial: TrialConfig, from_recipe: dict[str, Any]) -> None:
    """A layout a rule rejects is a user error; the recipe's values the rule is about are named with their flag
    (a rule that names only recipe defaults: they conflict with each other or with the world size, not with a
    knob the user passed, so ``_as_given`` kept them)."""
    from dse.rules.constraints import check

    rejection = check(trial)
    if rejection is None:
        return
    hint = "".join(
        f"; {k} = {v} (the recipe's default; pass --{k.replace('_', '-')})"
        for k, v in from_recipe.items()
        if k in rejection.knobs
    )
    if rejection.rule in BATCH_RULES and trial.dp:
        # the global batch the layout needs: whole micro-batches on every data-parallel rank, a multiple of pp of
        # them under the interleaved schedule
        step = trial.layout.mbs * trial.dp * (trial.layout.pp if trial.layout.vp > 1 else 1)
        hint += (
            f"; a gbs that fits this layout is a multiple of {step} (e.g. --gbs {-(-trial.layout.gbs // step) * step})"
        )
    raise UserError(f"invalid layout ({rejection.rule}): {rejection.reason}{hint}")


def _knob_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per catalogue knob (``--tp N``, ``--fsdp/--no-fsdp``...), every default None:
    unset knobs resolve as in a space."""
    from dse.facts import knobs

    params = []
    for name, k in knobs.CATALOGUE.items():
        if _not_predicted(name):
            continue
        flag = "--" + name.replace("_", "-")
        ann: Any
        if k.kind == "bool":
            opt, ann = typer.Option(None, f"{flag}/--no-{flag[2:]}", help=k.help), bool | None
        elif k.kind == "int":
            opt, ann = typer.Option(None, flag, metavar="N", help=k.help), int | None
        else:
            allowed = f" ({', '.join(k.choices)})" if k.choices else ""
            opt, ann = typer.Option(None, flag, metavar="TEXT", help=k.help + allowed), str | None
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann))
    return params


def with_knob_flags(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` (``predict_cmd``) with its ``**knob_flags`` replaced by one option per catalogue knob, so
    that a new knob is a new flag with nothing else to write.

    Why a signature: Typer builds a command's options from its callback's signature and nothing else, and the
    click it builds them with is vendored inside Typer (``typer._click``, private, in Typer 0.29), so adding
    options to the click command's ``params`` would need private classes. A function's signature can be
    declared publicly (PEP 362: ``__signature__``, which ``inspect.signature``, and so Typer, reads). Only the
    catalogue's part is generated; the fixed options stay written in ``predict_cmd``'s own signature, and the
    knobs' values arrive in its ``**knob_flags``."""

    @functools.wraps(command)
    def with_flags(**kwargs: Any) -> None:
        return command(**kwargs)

    sig = inspect.signature(command)
    fixed = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    with_flags.__signature__ = sig.replace(parameters=fixed + _knob_parameters())  # type: ignore[attr-defined]
    return with_flags


def calibrate_cmd(
    sources: list[str] = typer.Argument(
        ...,
        metavar="SOURCES",
        help='study directories (dse.json + leaderboard.csv, and probes/ with screen = "probe"), dse probe --out directories (each probe a stage\'s peak and compute time) or TSVs in the format of bench/data/h200_real_runs.tsv',
    ),
    out: Path = typer.Option(..., "--out", metavar="PATH", help="calibration file to write (TOML)"),
    params: str | None = typer.Option(
        None,
        "--params",
        metavar="TEXT",
        help="comma-separated parameters to "
        "refit (default: the stack parameters the runs identify, and the memory "
        "offset)",
    ),
    gpu: str | None = typer.Option(
        None,
        "--gpu",
        metavar="TEXT",
        help="the GPU the runs are on (required for a TSV without a gpu column; checked against the sources otherwise)",
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Refit the performance model to your own runs and write a calibration file for --calibration."""
    from dse.facts.calibration_file import write
    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.calibrate import calibrate
    from dse.study.leaderboard import checked_output, output_error

    if gpu is not None and gpu not in HARDWARE:
        raise UserError(f"{gpu!r} is not allowed; use one of {', '.join(HARDWARE)}", field="--gpu")
    checked_output(out, "out")  # a directory or a missing folder is refused before the fit
    names = [n.strip() for n in params.split(",") if n.strip()] if params else None
    bar, on_progress = render.calibrate_progress()
    with bar:
        cal, report = calibrate(sources, params=names, gpu=gpu, progress=on_progress)
    try:
        write(cal, out)  # atomically: never a half-written file
    except OSError as e:
        raise output_error(e, out, "out") from None
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "out": str(out),
                    "gpu": cal.gpu,
                    "runs": cal.runs,
                    "sources": cal.sources,
                    "params": report,
                    "fit": cal.fit,
                    "leave_one_out": cal.loo,
                },
                indent=2,
            )
        )
        return
    render.calibration(cal, report, out)
