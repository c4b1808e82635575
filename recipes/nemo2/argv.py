"""Command-line handling of the NeMo 2 entry point that needs no NeMo: task and factory from the environment.

Kept apart from :mod:`recipes.nemo2.__main__` so the controller's tests can check it without NeMo installed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .spec import ENV_RECIPE, ENV_TASK, FACTORY_SUFFIX, TASKS

FACTORY_FLAGS = ("--factory", "-f")


def task_from_env(env: Mapping[str, str]) -> str:
    """The task named by ``DSE_NEMO_TASK`` (default ``pretrain``); ValueError for anything else."""
    task = env.get(ENV_TASK, "pretrain").strip().lower() or "pretrain"
    if task not in TASKS:
        raise ValueError(f"{ENV_TASK}={task!r} is not a task; one of {', '.join(TASKS)}")
    return task


def has_factory(argv: Sequence[str]) -> bool:
    return any(a in FACTORY_FLAGS or a.startswith("--factory=") for a in argv)


def with_factory(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``argv`` with ``--factory <recipe>_recipe`` put first when it names none and ``DSE_NEMO_RECIPE`` is set.

    The factory goes in front, explicitly: nemo-run 0.11 drops a *default* factory once a dotted override is
    given, which would leave the task without model, data and trainer.
    """
    argv = list(argv)
    recipe = env.get(ENV_RECIPE, "").strip()
    if has_factory(argv) or not recipe:
        return argv
    if "(" not in recipe and not recipe.endswith(FACTORY_SUFFIX):
        recipe += FACTORY_SUFFIX
    return ["--factory", recipe, *argv]
