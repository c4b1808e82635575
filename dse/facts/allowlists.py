"""Default deny for what a space or system file puts into a launch: environment names, srun options, sbatch options.

Each is an allowlist, not a list of known-dangerous names: a list of dangers cannot be complete (Python alone reads
dozens of variables that choose the code it runs), while the settings a training run is tuned with are few and
known. ``docs/security.md`` copies these tables; a test checks that it matches them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dse.recipes import contract

# -- environment names --------------------------------------------------------------------------------------------

# Families of names a training run is tuned with: NCCL's, PyTorch's NCCL and allocator settings, Transformer
# Engine's, the userbuffers', the NVIDIA container toolkit's, the names NeMo's and Megatron-Bridge's PerfEnvPlugin
# and performance scripts set, and the payloads' own settings (recipes/contract.py). Other DSE_* names are dse's
# control variables (env_reserved).
ENV_PREFIXES: dict[str, str] = {
    "NCCL_": "NCCL's settings",
    "TORCH_NCCL_": "PyTorch's NCCL process-group settings",
    "NVTE_": "Transformer Engine's settings",
    "UB_": "userbuffers (TP communication overlap) settings",
    "NVIDIA_": "the NVIDIA container toolkit's settings",
}
ENV_NAMES: dict[str, str] = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "CUDA stream queues (PerfEnvPlugin)",
    "PYTORCH_CUDA_ALLOC_CONF": "PyTorch's caching allocator",
    "ENABLE_VBOOST": "the vboost pre-step (PerfEnvPlugin)",
    "NVLINK_DOMAIN_SIZE": "hybrid expert-parallel dispatch (PerfEnvPlugin)",
    "USE_MNNVL": "multi-node NVLink for expert dispatch (PerfEnvPlugin)",
    "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "hybrid expert-parallel dispatch (PerfEnvPlugin)",
    "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": "hybrid expert-parallel dispatch (PerfEnvPlugin)",
    "TOKENIZERS_PARALLELISM": "Hugging Face tokenizers' threads (performance scripts)",
    "TRANSFORMERS_OFFLINE": "Hugging Face downloads (performance scripts)",
    "HF_HUB_OFFLINE": "Hugging Face downloads (performance scripts)",
    "CUDA_MODULE_LOADING": "CUDA's lazy module loading",
    "OMP_NUM_THREADS": "CPU threads per process",
    **contract.PAYLOAD_SETTINGS,
}
# Inside the families above, names that name a file or a library (NCCL_NET_PLUGIN loads a shared library,
# NCCL_DEBUG_FILE writes a file, TORCH_NCCL_DEBUG_INFO_TEMP_FILE too): they need [backend] allow_env as any
# name outside the families does.
ENV_FILE_SUFFIXES = ("_FILE", "_PLUGIN", "_PATH", "_DIR", "_LIB", "_LIBRARY", "_SO", "_PREFIX", "_CMD")

# Names no setting allows, not even [backend] allow_env. srun and sbatch read SLURM_*/SRUN_*/SBATCH_*/SALLOC_*
# as their own options (SLURM_TASK_PROLOG is --task-prolog, SRUN_EXPORT_ENV is --export), the dynamic loader reads
# LD_* before any program starts (LD_PRELOAD loads a library into srun, the container runtime and Python), Python
# reads PYTHON* before the trainer's first line (PYTHONPATH, PYTHONSTARTUP, PYTHONPYCACHEPREFIX choose the code it
# runs), and bash runs BASH_FUNC_* as functions. None of them is a performance setting; a cluster that needs one
# sets it in the container image or the login environment, outside the search space.
ENV_NEVER: dict[str, str] = {
    "SLURM_": "srun and sbatch read it as one of their options (SLURM_TASK_PROLOG is --task-prolog)",
    "SRUN_": "srun reads it as one of its options (SRUN_EXPORT_ENV is --export)",
    "SBATCH_": "sbatch reads it as one of its options",
    "SALLOC_": "salloc reads it as one of its options",
    "LD_": "the dynamic loader reads it before any program starts (LD_PRELOAD loads a library into every program)",
    "PYTHON": "Python reads it before the trainer starts (PYTHONPATH, PYTHONPYCACHEPREFIX choose the code it runs)",
    "BASH_FUNC_": "bash defines a function from it",
    "DSE_DIR": "best/'s launch scripts find their files through it",
}


def env_never(name: str) -> str | None:
    """Why ``name`` can never reach a launch, even listed in ``[backend] allow_env``; None if it may."""
    return next((why for p, why in ENV_NEVER.items() if name.startswith(p)), None)


def env_reserved(name: str) -> str | None:
    """Why ``name`` is dse's own (``DSE_*`` other than the payloads' settings), or None: dse sets its control
    variables from the space (recipes/contract.py), so a space, ``allow_env`` or an imported file never does."""
    if name.startswith("DSE_") and name not in ENV_NAMES:
        what = "a control variable dse sets" if name in contract.CONTROL_ENV else "reserved for dse's control variables"
        return (
            f"{name} is {what} (the payload obeys it; recipes/contract.py), not a setting of a space: the study "
            "would record one run and launch another"
        )
    return None


def env_family(name: str) -> str | None:
    """The tuning family that allows ``name`` without an opt-in, or None (then it needs ``allow_env``)."""
    if env_never(name):
        return None
    if name in ENV_NAMES:
        return ENV_NAMES[name]
    family = next((why for p, why in ENV_PREFIXES.items() if name.startswith(p)), None)
    if family is None or name.endswith(ENV_FILE_SUFFIXES):
        return None
    return family


def env_refusal(name: str, allow_env: Iterable[str] = ()) -> str | None:
    """Why a space may not set environment variable ``name`` (one sentence), or None when it may."""
    if why := env_never(name):
        return f"{name} is never set by a space: {why}"
    if why := env_reserved(name):
        return why
    if env_family(name) or name in set(allow_env):
        return None
    if name.endswith(ENV_FILE_SUFFIXES) and any(name.startswith(p) for p in ENV_PREFIXES):
        what = "it names a file or a library to load"
    else:
        what = "it is not one of the settings a training run is tuned with (NCCL_*, NVTE_*, TORCH_NCCL_*, ...)"
    return f'{name} is refused by default: {what}; to set it anyway, list it in [backend] allow_env = ["{name}"]'


# -- srun options -------------------------------------------------------------------------------------------------

ARG_NONE, ARG_REQUIRED, ARG_OPTIONAL = "none", "required", "optional"


@dataclass(frozen=True)
class Option:
    """One long option of srun (or of the pyxis plugin): whether it takes a value, and why it is refused (None:
    allowed in ``[slurm] srun_args``)."""

    arg: str = ARG_REQUIRED
    refused: str | None = None


_RUNS = "runs a program"
_FILES = "reads or writes files"
_ENV = "changes the environment"
_DSE = "dse sets it from the layout and the system file"
_NOT_RESOURCE = "does not select resources"


def _opts(names: str, arg: str = ARG_REQUIRED, refused: str | None = None) -> dict[str, Option]:
    return {n: Option(arg, refused) for n in names.split()}


# Options that select or bind the resources of the training step: allowed.
SRUN_ALLOWED: dict[str, Option] = {
    **_opts(
        "accel-bind cpu-bind cpu-freq cpus-per-gpu cpus-per-task distribution gpu-bind gpu-freq gres gres-flags "
        "hint mem-bind mem-per-cpu mem-per-gpu mpi network ntasks-per-core ntasks-per-gpu ntasks-per-socket "
        "cores-per-socket sockets-per-node threads-per-core switches tres-bind tres-per-task wait "
        "gpus-per-task"
    ),
    **_opts(
        "exact overlap overcommit label unbuffered spread-job contiguous no-container-mount-home "
        "container-writable container-readonly",
        ARG_NONE,
    ),
    **_opts("exclusive kill-on-bad-exit propagate resv-ports no-kill", ARG_OPTIONAL),
}
# Every other long option srun (and pyxis) knows, with why it is refused: the abbreviations srun accepts are
# resolved against this whole list, so ``--expor`` is ``--export``.
SRUN_REFUSED: dict[str, Option] = {
    **_opts("task-prolog task-epilog prolog epilog multi-prog bcast bcast-exclude send-libs", refused=_RUNS),
    **_opts("container-entrypoint container-entrypoint-log", ARG_NONE, refused=_RUNS),
    **_opts("no-container-entrypoint", ARG_NONE, refused=_RUNS),
    **_opts("container-image container-name container-id container", refused=f"{_RUNS} (use slurm.container_image)"),
    **_opts("output error input open-mode chdir container-workdir container-save nodefile", refused=_FILES),
    **_opts("container-mounts", refused=f"{_FILES} (use slurm.container_mounts)"),
    **_opts("container-mount-home", ARG_NONE, refused=f"{_FILES} (the home directory, inside the container)"),
    **_opts("export container-env", refused=_ENV),
    **_opts("preserve-env get-user-env", ARG_NONE, refused=_ENV),
    **_opts("container-remap-root no-container-remap-root", ARG_NONE, refused="changes the user the step runs as"),
    **_opts("uid gid", refused="changes the user the step runs as"),
    **_opts(
        "nodes ntasks ntasks-per-node gpus gpus-per-node gpus-per-socket time partition account job-name "
        "nodelist exclude constraint qos reservation mem jobid het-group",
        refused=_DSE + " (sbatch options go in [slurm] sbatch_options)",
    ),
    **_opts(
        "acctg-freq bb bbf begin clusters cluster-constraint comment compress core-spec deadline delay-boot "
        "dependency extra extra-node-info licenses mail-type mail-user mcs-label msg-timeout nice power prefer "
        "priority profile reboot relative signal slurmd-debug stepmgr thread-spec time-min tmp wckey mincpus "
        "cpus-per-task-hint segment tree-width x11 debugger-test threads",
        refused=_NOT_RESOURCE + " of the step (sbatch options go in [slurm] sbatch_options)",
    ),
    **_opts(
        "disable-status help hold immediate no-allocate oversubscribe pty quiet quit-on-interrupt test-only "
        "usage verbose version external-launcher use-min-nodes",
        ARG_NONE,
        refused=_NOT_RESOURCE,
    ),
}
SRUN_OPTIONS: dict[str, Option] = {**SRUN_REFUSED, **SRUN_ALLOWED}

# srun's short options (its getopt string) and the long option each stands for.
SRUN_SHORT: dict[str, str] = {
    "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task", "C": "constraint", "d": "dependency",
    "D": "chdir", "e": "error", "E": "preserve-env", "G": "gpus", "h": "help", "H": "hold", "i": "input",
    "I": "immediate", "J": "job-name", "k": "no-kill", "K": "kill-on-bad-exit", "l": "label", "L": "licenses",
    "m": "distribution", "M": "clusters", "n": "ntasks", "N": "nodes", "o": "output", "O": "overcommit",
    "p": "partition", "q": "qos", "Q": "quiet", "r": "relative", "s": "oversubscribe", "S": "core-spec",
    "t": "time", "T": "threads", "u": "unbuffered", "v": "verbose", "V": "version", "w": "nodelist",
    "W": "wait", "x": "exclude", "X": "disable-status", "Z": "no-allocate",
}  # fmt: skip
# What a value may hold: it goes into the srun line of a script (quoted by the writer as well).
SRUN_VALUE = re.compile(r"[A-Za-z0-9_.,:/+@=\-]*")


class OptionError(ValueError):
    """An option that is not allowed, with the reason in one sentence."""


def resolve_long(word: str) -> str:
    """The srun long option ``word`` names (without its dashes), as getopt_long resolves it: the exact name, else
    the one option it is an unambiguous prefix of."""
    if word in SRUN_OPTIONS:
        return word
    matches = sorted(n for n in SRUN_OPTIONS if n.startswith(word))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise OptionError(f"srun has no option --{word}")
    raise OptionError(f"--{word} is ambiguous in srun ({', '.join('--' + m for m in matches)}); write it in full")


def _checked(name: str, value: str | None, given: str) -> str:
    """``--name[=value]`` once ``name`` is allowed and ``value`` fits it; else an :class:`OptionError`."""
    opt = SRUN_OPTIONS[name]
    spelled = f"{given} (--{name})" if given != f"--{name}" else given
    if opt.refused:
        raise OptionError(f"{spelled} is not allowed: it {opt.refused}")
    if opt.arg == ARG_NONE and value is not None:
        raise OptionError(f"{spelled} takes no value")
    if opt.arg == ARG_REQUIRED and value is None:
        raise OptionError(f"{spelled} needs a value")
    if value is not None and not SRUN_VALUE.fullmatch(value):
        raise OptionError(f"{value!r} is not allowed as the value of --{name}; use letters, digits and _.,:/+@=-")
    return f"--{name}" if value is None else f"--{name}={value}"


def _short(word: str, rest: list[str]) -> list[str]:
    """One short-option word (``-l``, ``-lu``, ``-c4``, ``-c 4``): the long options it stands for."""
    out = []
    i = 1
    while i < len(word):
        letter = word[i]
        if letter not in SRUN_SHORT:
            raise OptionError(f"srun has no option -{letter}")
        name = SRUN_SHORT[letter]
        opt = SRUN_OPTIONS[name]
        if opt.arg == ARG_NONE or (opt.arg == ARG_OPTIONAL and i + 1 == len(word)):
            out.append(_checked(name, None, f"-{letter}"))
            i += 1
            continue
        value = word[i + 1 :] or (rest.pop(0) if opt.arg == ARG_REQUIRED and rest else None)
        out.append(_checked(name, value, f"-{letter}"))
        break
    return out


def parse_srun_args(args: Iterable[str]) -> list[str]:
    """``args`` parsed as srun parses its options, each checked against :data:`SRUN_ALLOWED`: the allowed ones in
    their full spelling (``--cpu-b cores`` -> ``--cpu-bind=cores``, ``-l`` -> ``--label``), so the script says
    exactly what was checked. Anything else is an :class:`OptionError` naming the option and why."""
    rest = list(args)
    out: list[str] = []
    while rest:
        word = rest.pop(0)
        if not isinstance(word, str):
            raise OptionError(f"{word!r} is not a string")
        if word.startswith("--") and len(word) > 2:
            given, eq, value = word.partition("=")
            name = resolve_long(given[2:])
            opt = SRUN_OPTIONS[name]
            val = value if eq else None
            if val is None and opt.arg == ARG_REQUIRED and not opt.refused and rest:
                val = rest.pop(0)
            out.append(_checked(name, val, given))
        elif word.startswith("-") and len(word) > 1 and word != "--":
            out += _short(word, rest)
        else:
            raise OptionError(f"{word!r} is not an srun option (a program or a bare value would run or be ignored)")
    return out


# -- sbatch options ([slurm] sbatch_options) ----------------------------------------------------------------------

_NAMES = r"[A-Za-z0-9_.,\-]+"
_FEATURES = r"[A-Za-z0-9_.,:&|*!\[\]()\-]+"  # a feature or GRES expression (sbatch reads #SBATCH lines itself)
_HOSTLIST = r"[A-Za-z0-9_.,\[\]\-]+"
_TIME = r"(\d+-)?\d+(:\d{1,2}){0,2}"


@dataclass(frozen=True)
class SbatchOption:
    """One option ``[slurm] sbatch_options`` may set: the value's pattern (full match) and what it is, or ``flag``
    for an option without a value (``true`` writes it, ``false`` leaves it out), or ``integer`` bounds."""

    what: str
    pattern: str | None = None
    flag: bool = False
    integer: tuple[int, int] | None = None


SBATCH_ALLOWED: dict[str, SbatchOption] = {
    "qos": SbatchOption("a quality of service name", _NAMES),
    "reservation": SbatchOption("reservation names", _NAMES),
    "constraint": SbatchOption("a node feature expression", _FEATURES),
    "cluster-constraint": SbatchOption("a cluster feature expression", _FEATURES),
    "prefer": SbatchOption("a node feature expression", _FEATURES),
    "gres": SbatchOption("generic resources such as gpu:4", _FEATURES),
    "gres-flags": SbatchOption("GRES flags such as enforce-binding", _NAMES),
    "licenses": SbatchOption("licenses such as fs:2", _FEATURES),
    "segment": SbatchOption("nodes per segment (NVLink domain); 0 writes none", integer=(0, 1_000_000)),
    "switches": SbatchOption("a switch count, optionally @max-wait", r"\d+(@" + _TIME + ")?"),
    "nodelist": SbatchOption("a host list such as node[1-4]", _HOSTLIST),
    "exclude": SbatchOption("a host list such as node[1-4]", _HOSTLIST),
    "network": SbatchOption("a network specification", r"[A-Za-z0-9_.,:=\-]+"),
    "core-spec": SbatchOption("cores reserved for the system", integer=(0, 1_000_000)),
    "thread-spec": SbatchOption("threads reserved for the system", integer=(0, 1_000_000)),
    "tmp": SbatchOption("temporary disk such as 100G", r"\d+[KMGT]?"),
    "time-min": SbatchOption("a Slurm time: MM, HH:MM:SS or D-HH:MM:SS", _TIME),
    "nice": SbatchOption("a scheduling niceness", integer=(-2_147_483_645, 2_147_483_645)),
    "comment": SbatchOption("an accounting comment (letters, digits and _.,:/+@=-)", r"[A-Za-z0-9_.,:/+@=\-]+"),
    "wckey": SbatchOption("a workload characterisation key", _NAMES),
    "mcs-label": SbatchOption("an MCS label", _NAMES),
    "spread-job": SbatchOption("spread the job over as many nodes as possible", flag=True),
    "contiguous": SbatchOption("contiguous nodes", flag=True),
}
# Options with a field of their own in [slurm], or that dse sets from the layout.
SBATCH_OWN_FIELD = {
    "partition": "slurm.partition",
    "account": "slurm.account",
    "time": "slurm.time_limit",
    "exclusive": "slurm.exclusive",
    "gpus-per-node": "slurm.gpus_per_node_flag",
}


def slurm_time(text: str) -> int | None:
    """Seconds of a Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``; None for
    ``UNLIMITED``/``INFINITE``); an :class:`OptionError` for another spelling or a field out of its range (minutes
    and seconds below 60 after the first field, hours below 24 after days), which Slurm would read otherwise."""
    t = str(text).strip().upper()
    if t in ("UNLIMITED", "INFINITE"):
        return None
    if not re.fullmatch(r"(\d{1,9}-)?\d{1,9}(:\d{1,2}){0,2}", t):
        raise OptionError(f"{text!r} is not a Slurm time (MM, HH:MM:SS or D-HH:MM:SS)")
    days, _, rest = t.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, m, sec = (parts + [0, 0])[:3]
        bounded = [(h, 24, "hours")] + [(v, 60, w) for v, w in zip(parts[1:], ("minutes", "seconds"))]
    else:  # MM, MM:SS, HH:MM:SS
        h, m, sec = parts if len(parts) == 3 else (0, *(parts + [0])[:2])
        bounded = [(v, 60, w) for v, w in zip(parts[1:], ("minutes", "seconds")[3 - len(parts) :])]
    for value, limit, what in bounded:
        if value >= limit:
            raise OptionError(f"{text!r} is not a Slurm time: {what} {value} (at most {limit - 1})")
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


def sbatch_options(table: Mapping[str, Any]) -> dict[str, Any]:
    """``[slurm] sbatch_options`` checked against :data:`SBATCH_ALLOWED`: sbatch's spelling (``time_min`` ->
    ``time-min``) -> the value written (``True`` for a flag); a :class:`OptionError` for a refused option or value,
    or for one option given in two spellings (``time_min`` and ``"time-min"``: which one wins is not said)."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in table.items():
        name = str(key).replace("_", "-")
        if name in given:
            raise OptionError(f"{given[name]} and {key} are the same option {name}; give it once")
        given[name] = str(key)
        if name in SBATCH_OWN_FIELD:
            raise OptionError(f"{key}: set {SBATCH_OWN_FIELD[name]} instead")
        opt = SBATCH_ALLOWED.get(name)
        if opt is None:
            raise OptionError(
                f"{key!r} is not an sbatch option dse writes (only options that select or account resources: "
                f"{', '.join(SBATCH_ALLOWED)})"
            )
        if opt.flag:
            if not isinstance(value, bool):
                raise OptionError(f"{key}: true or false (got {value!r})")
            if value:
                out[name] = True
        elif opt.integer is not None:
            lo, hi = opt.integer
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise OptionError(f"{key}: an integer from {lo} to {hi} (got {value!r})")
            out[name] = value
        elif not isinstance(value, str) or not re.fullmatch(opt.pattern or "", value):
            raise OptionError(f"{key}: {value!r} is not allowed; use {opt.what}")
        else:
            if opt.pattern == _TIME:
                slurm_time(value)  # its fields in range (00:61:99 is not a time)
            out[name] = value
    return out


def nvlink_segment(nodes: int, gpus_per_node: int, nvlink_domain: int) -> int | None:
    """The ``--segment`` that keeps a job's nodes in whole NVLink domains, as Megatron-Bridge's performance scripts
    ask on GB200 (``scripts/performance/utils/executors.py``): None when a domain is one node; else the nodes when
    they fit one domain, or the largest divisor of the nodes that does."""
    per_domain = nvlink_domain // gpus_per_node
    if per_domain <= 1:
        return None
    if nodes <= per_domain:
        return nodes
    return next(s for s in range(per_domain, 0, -1) if nodes % s == 0)
