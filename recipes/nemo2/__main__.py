"""Entry point of the NeMo 2 payload: ``python -m recipes.nemo2 --factory llama3_8b_recipe -y <overrides>``.

The task (``DSE_NEMO_TASK``: pretrain or finetune) picks ``llm.pretrain`` or ``llm.finetune``; the recipe comes
from ``--factory`` or, when absent, ``DSE_NEMO_RECIPE``. nemo-run's own CLI parses the factory and the dotted
overrides and runs the task in this process (one process per GPU, started by srun or torchrun).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    from .argv import task_from_env, with_factory

    args = with_factory(sys.argv[1:] if argv is None else argv, os.environ)
    task = task_from_env(os.environ)

    import nemo_run as run
    from nemo.collections import llm

    from . import factories

    factories.register()
    sys.argv = [sys.argv[0], *args]  # nemo-run's typer app reads sys.argv
    run.cli.main(llm.pretrain if task == "pretrain" else llm.finetune)


if __name__ == "__main__":
    main()
