"""``dse import cloudai``: a CloudAI NeMoRun test or test scenario (and a Slurm system) as a dse space.

CloudAI (github.com/NVIDIA/cloudai) describes a NeMoRun DSE run as a test whose ``cmd_args`` are NeMo 2 config
paths, some of them lists (``[cmd_args.trainer.strategy] tensor_model_parallel_size = [1, 2, 4]``), a test
scenario (``[[Tests]]`` with ``num_nodes``, ``time_limit`` and an inline test), and a Slurm system file.

The mapping is the knob catalogue's NeMo 2 spelling read in reverse (:func:`nemo2_paths`, built from
``dse.facts.knobs.CATALOGUE``: no second list): a list-valued field becomes a ``[knobs]`` entry, a scalar a
``[settings]`` entry. Fields the catalogue spells by value (the FP8 plugin, activation offloading) are read by
the few rules below. Everything else is *not imported*, with the reason, listed in the output and written as
comments into the space, never dropped silently.

Decisions where the issue is silent:

* A scenario with several ``[[Tests]]`` is refused unless ``--test ID`` picks one (one dse space is one
  test); so is a list of node counts (a dse space has one ``num_nodes``: import once per node count).
* ``task`` other than ``pretrain`` and a test template other than ``NeMoRun`` are refused: dse runs
  pretraining only.
* ``fp8 = "hybrid"`` without ``fp8_recipe`` is NeMo's default recipe, ``delayed``; plugin fields that
  recipe's dse spelling sets to the same value are carried over by it, other plugin fields are reported.
* Fields CloudAI's NeMoRun models default (``context_parallel_size = 2``, ``global_batch_size = 1``, ...)
  take CloudAI's default when the file leaves them out, as CloudAI passes them to NeMo
  (:data:`CLOUDAI_DEFAULTS`); each one applied is listed.
* ``recipe_name = "cloudai_llama3_8b_recipe"`` is dse's ``llama3_8b`` (NeMo's recipe of that model); CloudAI's
  wrapper recipes may set more than NeMo's, which dse does not reproduce.
* The container version is the ``YY.MM`` of the image tag (``nemo:25.11.01`` -> ``25.11``).
* Without ``--system`` the space holds an inline system (``gpu`` from ``--gpu``, 8 GPUs per node, the
  image and time limit); with it, a system file named after CloudAI's system is written beside the space.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from dse.errors import UserError, did_you_mean
from dse.facts import allowlists, knobs
from dse.facts.hardware import GPU_NAMES
from dse.fsutil import write_text
from dse.recipes.models import RECIPES, Recipe
from dse.rules.space import Space, System, _read_toml


@dataclass(frozen=True)
class NotImported:
    field: str  # CloudAI's dotted name, e.g. cmd_args.log.ckpt.save_last
    value: Any
    reason: str

    def line(self) -> str:
        """One line (a control character in a CloudAI key is shown escaped, as ``\\x0a``)."""
        return _escape_controls(f"not imported: {self.field} = {_toml_value(self.value)} ({self.reason})")


@dataclass
class Imported:
    """The result of one import: the space file's text, the system file's (with ``--system``), and what was left."""

    space_text: str
    space: Space
    system_text: str | None = None
    system_file: str | None = None
    not_imported: list[NotImported] = field(default_factory=list)
    cloudai_points: int = 1  # raw points of CloudAI's list product over the test's list-valued fields
    defaults: list[str] = field(default_factory=list)  # CloudAI's defaults applied, "path = value"

    def files(self, out: str | Path) -> dict[Path, str]:
        """What to write: the space at ``out`` and, with ``--system``, the system file beside it."""
        files = {Path(out): self.space_text}
        if self.system_text is not None and self.system_file:
            files[Path(out).parent / self.system_file] = self.system_text
        return files

    def write(self, out: str | Path) -> list[Path]:
        """Write :meth:`files`, each atomically (:func:`dse.fsutil.write_text`: a full disk leaves no half
        space); the paths written."""
        return [write_text(path, text) for path, text in self.files(out).items()]


def nemo2_paths() -> dict[str, str]:
    """NeMo 2 config path -> canonical knob name: the catalogue's ``nemo2`` spellings, reversed.

    Each knob says which of its paths carry its value (``Knob.imported_from``): the offloading knob's count
    field of its four ``cpu_offloading*`` fields; none of precision's and fp8_recipe's (both write
    ``trainer.plugins``, read by :func:`_plugins`).
    """
    return {path: knob.name for knob in knobs.CATALOGUE.values() for path in knob.imported_from}


# Why a known CloudAI field has no dse counterpart (the reason printed beside "not imported").
_REASONS = {
    "trainer.val_check_interval": "dse trials do not validate",
    "trainer.log_every_n_steps": "dse logs every step to read the step time",
    "trainer.callbacks": "dse sets its own callbacks (FLOPs measurement)",
    "data.num_train_samples": "dse trials run on mock data for max_steps steps",
    "log": "dse sets logging itself; checkpointing is off in dse trials",
    "optim": "no dse knob for the optimizer",
    "trainer.plugins.grad_reduce_in_fp32": "dse keeps the recipe's gradient-reduction precision",
}
_TEST_FIELDS_SKIPPED = {
    "description": "kept as a comment only",
    "extra_container_mounts": "container mounts belong to the dse system ([slurm] container_mounts)",
    "git_repos": "dse runs its own payload",
    "nsys": "dse does not profile trials",
    "dse_excluded_args": "dse varies only [knobs]",
    "agent_metrics": "dse's objective is one metric: set [objective] metric",
    "agent_reward_function": "dse's reward is the objective metric",
    "agent_config": "agent options differ: set [search.options]",
    "weight": "no dse counterpart",
    "iterations": "a dse trial runs once",
    "sol": "no dse counterpart",
    "ideal_perf": "no dse counterpart",
    "dependencies": "dse trials are independent",
    "nodes": "dse leaves node choice to Slurm",
    "exclude_nodes": "dse leaves node choice to Slurm",
    "extra_srun_args": "set [slurm] srun_args in the dse system",
}
_SYSTEM_SKIPPED = {
    "install_path": "dse installs nothing on the cluster",
    "output_path": "dse writes to its --out directory",
    "partitions": "dse submits to one partition (default_partition)",
    "data_repository": "dse keeps results in its own store",
    "ntasks_per_node": "dse starts one task per GPU",
    "cache_docker_images_locally": "no dse counterpart",
    "monitor_interval": "no dse counterpart",
    "container_mount_home": "no dse counterpart",
    "extra_sbatch_args": "no dse counterpart",
    "reports": "dse writes its own report",
}
# CloudAI passes its NeMoRun models' defaults to NeMo for fields a test leaves out (its command generation
# spells ``cmd_args.model_dump()``): these defaults of src/cloudai/workloads/nemo_run/nemo_run.py, for the fields
# the catalogue maps, so that the imported space runs what CloudAI would (cp = 2 when the test is silent on it).
# Each one applied is listed in the output and the space.
CLOUDAI_DEFAULTS = {
    "data.seq_length": 8192,
    "data.micro_batch_size": 1,
    "data.global_batch_size": 1,
    "trainer.max_steps": 100,
    "trainer.strategy.tensor_model_parallel_size": 1,
    "trainer.strategy.pipeline_model_parallel_size": 1,
    "trainer.strategy.context_parallel_size": 2,
}
_FP8_SPELLED_BY_DSE = {
    "fp8_margin",
    "fp8_amax_history_len",
    "fp8_amax_compute_algo",
    "fp8_param_gather",
    "first_last_layers_bf16",
    "reuse_grad_buf_for_mxfp8_param_ag",
}
_IMAGE_VERSION = re.compile(r":(\d\d)\.(\d\d)(?:[.\-].*)?$")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # what a TOML comment may not hold (tab may stay)


def _item(v: Any) -> Any:
    """``v`` as a tomlkit item that stays on its key's line: a table becomes an inline table and a list an array,
    at any depth; tomlkit quotes and escapes every string and key (a newline or quote in a CloudAI value or
    key cannot start a line of its own). A value TOML has no type for is written as its text."""
    if isinstance(v, Mapping):
        table = tomlkit.inline_table()
        for k, x in v.items():
            table.append(str(k), _item(x))
        return table
    if isinstance(v, (list, tuple)):
        array = tomlkit.array()
        for x in v:
            array.append(_item(x))
        return array
    if isinstance(v, (bool, int, float, str, datetime.date, datetime.time)):  # datetime is a date
        return tomlkit.item(v)
    return tomlkit.string(str(v))


def _toml_value(v: Any) -> str:
    """One value as TOML spells it, for the notes printed and written as comments."""
    return _item(v).as_string()


def _escape_controls(text: str) -> str:
    """``text`` with control characters (newlines included, tab not) spelled ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def _comment(container: Any, text: str) -> None:
    """Add ``text`` to a tomlkit document or table as comment lines: one per line of ``text`` (so a newline in a
    CloudAI description starts another comment, never a line of TOML), other control characters escaped (a
    TOML comment may not hold them)."""
    for line in text.splitlines() or [""]:
        container.add(tomlkit.comment(_escape_controls(line)))


def _flatten(table: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in table.items():
        if isinstance(v, dict):
            out.extend(_flatten(v, f"{prefix}{k}."))
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _find_recipe(name: Any, num_layers: Any, f: str, where: str) -> Recipe:
    """CloudAI's ``cloudai_llama3_8b_recipe`` (or NeMo's ``llama3_8b``) -> the dse recipe; a different
    ``num_layers`` picks the scaled reproducer of that many layers, else is refused naming both."""
    if not isinstance(name, str):
        raise UserError(f"{name!r} is not a recipe name", file=f, field=f"{where}.recipe_name")
    base = name.removeprefix("cloudai_").removesuffix("_recipe").removesuffix("_pretrain")
    full = [r for r in RECIPES.values() if not r.scaled_from and base in (r.nemo2_recipe, r.name)]
    if not full:
        known = [r.name for r in RECIPES.values() if not r.scaled_from]
        raise UserError(
            f"no dse recipe for {name!r}{did_you_mean(base, known)}; dse knows {', '.join(known)}",
            file=f,
            field=f"{where}.recipe_name",
        )
    recipe = full[0]
    if num_layers is None or num_layers == recipe.arch.num_layers:
        return recipe
    if isinstance(num_layers, bool) or not isinstance(num_layers, int):
        raise UserError(f"{num_layers!r} is not an integer", file=f, field=f"{where}.num_layers")
    for r in RECIPES.values():
        if r.scaled_from == recipe.name and r.arch.num_layers == num_layers:
            return r
    scaled = [f"{r.name} ({r.arch.num_layers} layers)" for r in RECIPES.values() if r.scaled_from == recipe.name]
    raise UserError(
        f"num_layers = {num_layers} differs from {recipe.name}'s {recipe.arch.num_layers} and dse has "
        f"no {num_layers}-layer variant of it" + (f" (it has {', '.join(scaled)})" if scaled else ""),
        file=f,
        field=f"{where}.num_layers",
    )


def _plugins(plugins: Mapping[str, Any], f: str, where: str, notes: list[NotImported]) -> dict[str, Any]:
    """``trainer.plugins`` -> precision and fp8_recipe, as the catalogue's NeMo 2 precision table spells them."""
    fp8 = plugins.get("fp8")
    if fp8 in (None, False):
        values: dict[str, Any] = {"precision": knobs.BF16} if "fp8" in plugins else {}
        spelled: dict[str, str] = {}
    elif fp8 in ("hybrid", "e4m3"):
        recipe = plugins.get("fp8_recipe", "mxfp8" if fp8 == "e4m3" else "delayed")
        if not isinstance(recipe, str) or recipe not in knobs.NEMO2_PRECISION or recipe == knobs.BF16:
            choices = [k for k in knobs.NEMO2_PRECISION if k != knobs.BF16]
            raise UserError(
                f"{recipe!r} is not an FP8 recipe dse knows; one of {', '.join(choices)}",
                file=f,
                field=f"{where}.trainer.plugins.fp8_recipe",
            )
        values = {"precision": "fp8", "fp8_recipe": recipe}
        spelled = {
            s.split("=", 1)[0].removeprefix("trainer.plugins."): s.split("=", 1)[1]
            for s in knobs.NEMO2_PRECISION[recipe]
        }
    else:
        raise UserError(
            f"{fp8!r} is not an FP8 mode dse knows; hybrid or e4m3 (or leave it out for bf16)",
            file=f,
            field=f"{where}.trainer.plugins.fp8",
        )
    for name, value in plugins.items():
        if name in ("fp8", "fp8_recipe"):
            continue
        full = f"{where}.trainer.plugins.{name}"
        if name in spelled and str(spelled[name]) == knobs.spell_value(value):
            continue  # dse's spelling of this FP8 recipe sets the same value
        if name in spelled:
            reason = f"dse's {values['fp8_recipe']} recipe sets {name}={spelled[name]}"
        elif name == "fp8_params":
            reason = "dse's FP8 recipes set fp8_param_gather themselves"
        else:
            reason = _REASONS.get(
                f"trainer.plugins.{name}",
                "dse's precision recipes set this field"
                if name in _FP8_SPELLED_BY_DSE
                else "no dse knob for this precision field",
            )
        notes.append(NotImported(full, value, reason))
    return values


def _test_entry(data: dict[str, Any], path: Path, test_id: str | None) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(test definition, scenario entry or {}, prefix of cmd_args in the file) from a test or a scenario."""
    f = str(path)
    if "Tests" not in data:
        if test_id is not None:
            raise UserError("picks one [[Tests]] entry of a scenario; this is a test file", file=f, param="test")
        return data, {}, "cmd_args"
    tests = data["Tests"]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, dict) for t in tests):
        raise UserError("expected [[Tests]] entries", file=f, field="Tests")
    ids = [str(t.get("id")) for t in tests]
    if test_id is not None:
        if test_id not in ids:
            raise UserError(
                f"no test {test_id!r}{did_you_mean(test_id, ids)}; the scenario has {', '.join(ids)}",
                file=f,
                param="test",
            )
        tests = [tests[ids.index(test_id)]]
    elif len(tests) > 1:
        raise UserError(
            f"{len(tests)} tests ({', '.join(ids)}); a dse space holds one: pick it with --test ID",
            file=f,
            field="Tests",
        )
    entry = tests[0]
    if "cmd_args" in entry:
        return entry, entry, "Tests.cmd_args"
    name = entry.get("test_name")
    if not name:
        raise UserError("neither an inline test (cmd_args) nor test_name", file=f, field="Tests[0]")
    # CloudAI keeps tests in a sibling test/ directory (conf/common/test_scenario -> conf/common/test)
    for cand in sorted((path.parent.parent / "test").glob("*.toml")):
        try:
            test = _read_toml(cand)
        except UserError:
            continue
        if test.get("name") == name:
            return test, entry, "cmd_args"
    raise UserError(
        f"test {name!r} not found in {path.parent.parent / 'test'}; import the test file itself",
        file=f,
        field="Tests[0].test_name",
    )


def _summary(v: Any) -> Any:
    """A table or a list of tables, shortened for a one-line note: the names of the entries, or the keys."""
    if isinstance(v, list) and all(isinstance(x, dict) for x in v):
        return [str(x.get("name", "?")) for x in v]
    if isinstance(v, dict):
        return "{" + ", ".join(v) + "}"
    return v


def _system(path: Path, notes: list[NotImported], gpu: str) -> tuple[dict[str, Any], dict[str, str]]:
    """CloudAI's Slurm system -> (dse system table, env from global_env_vars)."""
    data = _read_toml(path)
    f = str(path)
    if data.get("scheduler") != "slurm":
        raise UserError(
            f"scheduler {data.get('scheduler')!r} is not supported; dse imports Slurm systems",
            file=f,
            field="scheduler",
        )
    gpn = data.get("gpus_per_node", 8)
    if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 1:
        raise UserError(f"{gpn!r} is not a GPU count (an integer >= 1)", file=f, field="gpus_per_node")
    slurm: dict[str, Any] = {}
    if data.get("default_partition"):
        slurm["partition"] = str(data["default_partition"])
    if data.get("account"):
        slurm["account"] = str(data["account"])
    srun: list[str] = []
    if data.get("mpi"):
        srun.append(f"--mpi={data['mpi']}")
    if data.get("extra_srun_args"):
        srun.extend(str(data["extra_srun_args"]).split())
    if srun:
        slurm["srun_args"] = srun
    if data.get("supports_gpu_directives") is False:
        slurm["gpus_per_node_flag"] = False
    env = data.get("global_env_vars") or {}
    if not isinstance(env, dict):
        raise UserError("expected a table of NAME = value", file=f, field="global_env_vars")
    handled = {
        "name",
        "scheduler",
        "gpus_per_node",
        "default_partition",
        "account",
        "mpi",
        "extra_srun_args",
        "supports_gpu_directives",
        "global_env_vars",
    }
    for k, v in data.items():
        if k not in handled:
            notes.append(NotImported(f"system.{k}", _summary(v), _SYSTEM_SKIPPED.get(k, "no dse counterpart")))
    return {
        "name": str(data.get("name", path.stem)),
        "gpu": gpu,
        "gpus_per_node": gpn,
        "nvlink_domain": min(gpn, 8),
        "slurm": slurm,
    }, {str(k): v for k, v in env.items()}


def import_cloudai(
    test_path: str | Path,
    *,
    system_path: str | Path | None = None,
    gpu: str | None = None,
    out: str | Path = "space.toml",
    test_id: str | None = None,
) -> Imported:
    """Read CloudAI's files and return the dse space (validated) and, with ``system_path``, its system file."""
    path = Path(test_path)
    f = str(path)
    _check_gpu(gpu)
    test, entry, where, cmd = _read_test(path, test_id)
    recipe = _find_recipe(cmd.get("recipe_name"), cmd.get("num_layers"), f, where)
    notes: list[NotImported] = []
    image = cmd.get("docker_image_url")
    container = _container_version(image, where, notes)
    args = _read_cmd_args(cmd, f, where, notes)
    env = test.get("extra_env_vars") or {}
    if not isinstance(env, dict):
        raise UserError("expected a table of NAME = value", file=f, field="extra_env_vars")
    points = args.points * math.prod(max(len(v), 1) for v in env.values() if isinstance(v, list))
    origins = {str(k): f"{path.name} {where.removesuffix('cmd_args')}extra_env_vars" for k in env}
    system_table: dict[str, Any] | None = None
    if system_path is not None:
        system_table, sys_env = _system(Path(system_path), notes, gpu)  # type: ignore[arg-type]
        origins = {**{k: f"{Path(system_path).name} global_env_vars" for k in sys_env}, **origins}
        env = _merge_env(env, sys_env, notes)
    env, allow_env = _env_opt_in(env, origins, notes)
    values = {**args.values, **{f"env.{k}": v for k, v in env.items()}}
    num_nodes = _node_count(entry, args.num_nodes, f)
    slurm: dict[str, Any] = dict((system_table or {}).get("slurm", {}))
    if entry.get("time_limit"):
        slurm["time_limit"] = str(entry["time_limit"])
    if image:
        slurm["container_image"] = str(image)
    search = _scenario_search(entry, notes)
    settings, varied = _settings_and_knobs(values)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(entry.get("id") or test.get("name") or path.stem))
    system_text = system_file = None
    if system_table is not None:
        system_table = {**system_table, "slurm": slurm, **({"container": container} if container else {})}
        system_file = re.sub(r"[^A-Za-z0-9_.-]+", "_", system_table["name"]) + ".toml"
        system_text = _system_text(system_table, Path(system_path))  # type: ignore[arg-type]
        system_ref: Any = system_file
        system_obj = _validated_system(system_table, str(system_path))
    else:
        system_ref = {"gpu": gpu, "gpus_per_node": 8, **({"container": container} if container else {}), "slurm": slurm}
        system_obj = _validated_system({"name": "inline", **system_ref}, f)
    space = _validated_space(
        {
            "name": name,
            "recipe": recipe.name,
            "system": system_obj,
            "num_nodes": num_nodes,
            "settings": settings,
            "knobs": varied,
            "search": search,
            "backend": {"allow_env": list(allow_env)},
            "source": str(Path(out)),
        },
        f,
    )
    applied = [f"{where}.{d} = {_toml_value(v)}" for d, v in args.defaults]
    text = _space_text(
        path, recipe, name, system_ref, num_nodes, settings, varied, search, notes, test, applied, allow_env
    )
    return Imported(text, space, system_text, system_file, notes, points, applied)


def _check_gpu(gpu: str | None) -> None:
    """``--gpu`` is required (CloudAI's files do not name the generation) and must be one dse knows."""
    if gpu is None:
        raise UserError(
            f"CloudAI's files do not name the GPU generation; give --gpu, one of {', '.join(GPU_NAMES)}", param="gpu"
        )
    if gpu not in GPU_NAMES:
        raise UserError(
            f"unknown GPU generation {gpu!r}{did_you_mean(gpu, GPU_NAMES)}; known: {', '.join(GPU_NAMES)}",
            param="gpu",
        )


def _read_test(path: Path, test_id: str | None) -> tuple[dict[str, Any], dict[str, Any], str, dict[str, Any]]:
    """(test, scenario entry or {}, prefix of cmd_args in the file, cmd_args) of a NeMoRun pretraining test."""
    f = str(path)
    test, entry, where = _test_entry(_read_toml(path), path, test_id)
    template = test.get("test_template_name")
    if template != "NeMoRun":
        raise UserError(
            f"test template {template!r} is not supported; dse imports NeMoRun tests",
            file=f,
            field=where.replace("cmd_args", "test_template_name"),
        )
    cmd = test.get("cmd_args")
    if not isinstance(cmd, dict):
        raise UserError("required table is missing", file=f, field=where)
    if cmd.get("task", "pretrain") != "pretrain":
        raise UserError(f"task {cmd['task']!r} is not supported; dse runs pretrain", file=f, field=f"{where}.task")
    return test, entry, where, cmd


def _container_version(image: Any, where: str, notes: list[NotImported]) -> str | None:
    """The ``YY.MM`` of the image tag (``nemo:25.11.01`` -> ``25.11``); None (and a note) without one."""
    if not (isinstance(image, str) and image):
        return None
    m = _IMAGE_VERSION.search(image)
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    notes.append(
        NotImported(
            f"{where}.docker_image_url (version)", image, "no YY.MM tag; the container gate keeps the system's version"
        )
    )
    return None


@dataclass
class _CmdArgs:
    """What a test's ``cmd_args`` give: knob values (a list where varied), the node count, CloudAI's list
    product, and the CloudAI defaults applied for fields the file leaves out."""

    values: dict[str, Any]  # canonical knob -> value or list of values
    num_nodes: Any
    points: int
    defaults: list[tuple[str, Any]]


def _read_cmd_args(cmd: dict[str, Any], f: str, where: str, notes: list[NotImported]) -> _CmdArgs:
    """``cmd_args`` (with CloudAI's defaults for what it leaves out) -> knob values through the catalogue's NeMo 2
    paths; ``trainer.plugins`` read as a whole by :func:`_plugins`; every other field a note."""
    table = nemo2_paths()
    values: dict[str, Any] = {}
    num_nodes: Any = None
    points = 1
    read_elsewhere = ("docker_image_url", "task", "recipe_name", "num_layers")
    given = _flatten({k: v for k, v in cmd.items() if k not in read_elsewhere})
    present = {d for d, _ in given}
    defaults = [(d, v) for d, v in CLOUDAI_DEFAULTS.items() if d not in present]
    for dotted, value in given + defaults:
        full = f"{where}.{dotted}"
        if isinstance(value, list):
            points *= max(len(value), 1)
        if dotted.startswith("trainer.plugins."):
            continue  # read as a whole below
        if dotted == "trainer.num_nodes":
            num_nodes = value
            continue
        name = table.get(dotted)
        if name is None:
            top = next((k for k in _REASONS if dotted == k or dotted.startswith(k + ".")), None)
            notes.append(NotImported(full, value, _REASONS[top] if top else "no dse knob for this NeMo 2 field"))
            continue
        if name in values and values[name] != value:
            raise UserError(
                f"{value!r} disagrees with the other spelling of {name} ({values[name]!r})", file=f, field=full
            )
        values[name] = value
    trainer = cmd.get("trainer")
    plugins = trainer.get("plugins") if isinstance(trainer, dict) else None
    if isinstance(plugins, dict):
        values.update(_plugins(plugins, f, where, notes))
    return _CmdArgs(values, num_nodes, points, defaults)


def _merge_env(env: dict[str, Any], sys_env: dict[str, str], notes: list[NotImported]) -> dict[str, Any]:
    """The system's ``global_env_vars`` under the test's ``extra_env_vars`` (the test's win, as in CloudAI; each
    system value so overridden is a note)."""
    for k, v in sys_env.items():
        if k in env and env[k] != v:
            notes.append(
                NotImported(
                    f"system.global_env_vars.{k}", v, f"the test's extra_env_vars sets it to {_toml_value(env[k])}"
                )
            )
    return {**sys_env, **env}


def _env_opt_in(
    env: dict[str, Any], origins: dict[str, str], notes: list[NotImported]
) -> tuple[dict[str, Any], dict[str, str]]:
    """(the environment imported, {name: where it came from} for ``[backend] allow_env``).

    dse denies environment names by default (:mod:`dse.facts.allowlists`); CloudAI sets whatever its files say. A name of
    a tuning family is imported as it is; any other name is imported with an explicit opt-in naming the CloudAI file
    it came from, so that the space dse writes is one dse accepts. Left out, each with a note: names no space may
    set (they choose the code that runs: ``LD_*``, ``PYTHON*``, ``SLURM_*``), names of a file or library to load
    (``NCCL_NET_PLUGIN``) and dse's own control variables (``DSE_*``, which the payload reads).
    """
    kept: dict[str, Any] = {}
    allow: dict[str, str] = {}
    for name, value in env.items():
        where = origins.get(name, "the CloudAI files")
        field = f"system.global_env_vars.{name}" if where.endswith("global_env_vars") else f"extra_env_vars.{name}"
        if why := allowlists.env_never(name):
            reason: str | None = f"never set by a dse space: {why}"
        elif name.startswith("DSE_"):
            reason = "a dse control variable: the payload reads it and dse sets it (recipes/contract.py)"
        elif name.endswith(allowlists.ENV_FILE_SUFFIXES):
            reason = (
                "it names a file or a library to load, which chooses the code that runs; to set it, add it to "
                "[settings] and to [backend] allow_env yourself"
            )
        else:
            reason = None
        if reason is not None:
            notes.append(NotImported(field, value, reason))
            continue
        kept[name] = value
        if allowlists.env_family(name) is None:
            allow[name] = where
    return kept, allow


def _node_count(entry: dict[str, Any], num_nodes: Any, f: str) -> Any:
    """The scenario's node count, else ``trainer.num_nodes``, else 1; one per space (a list is refused)."""
    if entry.get("num_nodes") is not None:
        num_nodes = entry["num_nodes"]
    if isinstance(num_nodes, str) and num_nodes.isdigit() and len(num_nodes) <= 9:
        num_nodes = int(num_nodes)  # CloudAI's release scenarios write num_nodes = "1"
    if isinstance(num_nodes, list):
        raise UserError(
            f"{num_nodes!r}: a dse space has one node count; import once per count", file=f, field="num_nodes"
        )
    return 1 if num_nodes is None else num_nodes


def _scenario_search(entry: dict[str, Any], notes: list[NotImported]) -> dict[str, Any]:
    """The space's ``[search]`` from the scenario entry (grid; ``agent_steps`` as the trial budget); its fields
    without a dse counterpart are notes."""
    search: dict[str, Any] = {"agent": "grid"}
    if entry.get("agent") not in (None, "grid_search"):
        notes.append(NotImported("agent", entry["agent"], "dse has grid, random and optuna; the space uses grid"))
    if entry.get("agent_steps") is not None:
        search["trials"] = entry["agent_steps"]
    handled = {
        "id",
        "test_name",
        "num_nodes",
        "time_limit",
        "name",
        "test_template_name",
        "cmd_args",
        "extra_env_vars",
        "agent",
        "agent_steps",
    }
    for k, v in entry.items():
        if k not in handled:
            notes.append(NotImported(k, _summary(v), _TEST_FIELDS_SKIPPED.get(k, "no dse counterpart")))
    return search


def _settings_and_knobs(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """([settings], [knobs]): a scalar or a one-element list is a setting, a longer list a knob."""
    settings = {k: v for k, v in values.items() if not isinstance(v, list)}
    varied = {k: v for k, v in values.items() if isinstance(v, list)}
    for k, v in list(varied.items()):
        if len(v) == 1:
            settings[k] = v[0]
            del varied[k]
    return settings, varied


def _validated_system(table: dict[str, Any], f: str) -> System:
    """The imported system, validated; an error is one line naming the CloudAI file its values came from."""
    from pydantic import ValidationError

    from dse.rules.space import _first_error

    try:
        return System.model_validate(table)
    except ValidationError as e:
        err = _first_error(e, f, "system.")
        raise UserError(f"{err.message} (imported from {f})", file=err.file, field=err.field) from None


def _validated_space(space_dict: dict[str, Any], f: str) -> Space:
    """The imported space, validated; an error names the CloudAI file it was imported from."""
    try:
        return Space.model_validate(space_dict)
    except UserError as e:
        raise UserError(f"{e.message} (imported from {f})", file=e.file, field=e.field, param=e.param) from None
    except Exception as e:  # pydantic's ValidationError: the first error, one line
        from pydantic import ValidationError

        if not isinstance(e, ValidationError):
            raise
        from dse.rules.space import _first_error

        raise _first_error(e, f) from None


def _space_text(
    src: Path,
    recipe: Recipe,
    name: str,
    system_ref: Any,
    num_nodes: int,
    settings: dict,
    varied: dict,
    search: dict,
    notes: list[NotImported],
    test: dict,
    applied: list[str],
    allow_env: dict[str, str],
) -> str:
    """The space file: a tomlkit document, so every key and value is quoted by the library and the notes
    (CloudAI's description, defaults applied, fields not imported) are TOML comments."""
    doc = tomlkit.document()
    _comment(doc, f"Imported by `dse import cloudai` from {src.name} (CloudAI NeMoRun test).")
    if test.get("description"):
        _comment(doc, str(test["description"]))
    for key, value in (("name", name), ("recipe", recipe.name), ("system", system_ref), ("num_nodes", num_nodes)):
        doc.add(key, _item(value))
    tables = {"settings": settings, "knobs": varied, "search": search, "backend": {"kind": "sim", "payload": "nemo2"}}
    for title, entries in tables.items():
        table = tomlkit.table()
        if title == "settings":
            for a in applied:
                _comment(table, f"CloudAI's NeMoRun default (the file leaves it out): {a}")
        for k, v in entries.items():
            table.add(str(k), _item(v))
        if title == "backend" and allow_env:
            table.add("allow_env", _allow_env_array(allow_env))
        doc.add(title, table)
    if notes:
        doc.add(tomlkit.nl())
        _comment(doc, f"{len(notes)} field(s) of the CloudAI files were not imported:")
        for n in notes:
            _comment(doc, n.line())
    return tomlkit.dumps(doc)


def _allow_env_array(allow_env: dict[str, str]) -> Any:
    """``allow_env = [...]``, one name a line, each commented with where in CloudAI's files it was set."""
    comment = "outside dse's tuning families (dse.facts.allowlists); imported from"
    array = tomlkit.array()
    for name, where in allow_env.items():
        array.add_line(name, comment=_escape_controls(f"{comment} {where}"))
    array.add_line(indent="")
    return array


def _system_text(table: dict[str, Any], src: Path) -> str:
    """The system file (with ``--system``): a tomlkit document, as the space."""
    doc = tomlkit.document()
    _comment(doc, f"Imported by `dse import cloudai` from {src.name} (CloudAI Slurm system).")
    for k, v in table.items():
        if k != "slurm":
            doc.add(str(k), _item(v))
    slurm = tomlkit.table()
    for k, v in table["slurm"].items():
        slurm.add(str(k), _item(v))
    doc.add("slurm", slurm)
    return tomlkit.dumps(doc)
