"""``dse predict --model M --gpu G --precision P`` at every shipped recipe's defaults, on every GPU, in BF16 and
FP8: how many predict (and fit in memory), and the refusals counted by rule with one message of each. Prints
figures, asserts nothing (tests/test_predict_default_world.py asserts which rules may refuse).

    PYTHONPATH=. python bench/predict_defaults.py        # the counts, one example per refusal
    PYTHONPATH=. python bench/predict_defaults.py -v     # every refusal and every layout that does not fit
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter

from typer.testing import CliRunner

from dse.cli import app
from dse.facts.hardware import GPU_NAMES
from dse.recipes.models import RECIPES

PRECISIONS = ("bf16", "fp8")


def main(verbose: bool) -> None:
    runner = CliRunner()
    outcomes: Counter = Counter()
    example: dict[str, str] = {}
    for model in RECIPES:
        for gpu in GPU_NAMES:
            for precision in PRECISIONS:
                args = ["predict", "--model", model, "--gpu", gpu, "--precision", precision, "--json"]
                r = runner.invoke(app, args)
                where = f"{model} {gpu} {precision}"
                if r.exit_code == 0:
                    j = json.loads(r.stdout)
                    kind = "predicts, fits" if j["fits"] else "predicts, does not fit"
                    if verbose and not j["fits"]:
                        print(f"{where}: {j['num_gpus']} GPUs, {j['peak_memory_gib']:.1f} of {j['gpu_memory_gib']} GiB")
                else:
                    message = r.output.strip().splitlines()[-1]
                    rule = re.search(r"invalid layout \((\w+)\)", message)
                    kind = f"refused: {rule.group(1) if rule else message}"
                    example.setdefault(kind, f"{where}: {message}")
                    if verbose:
                        print(f"{where}: {message}")
                outcomes[kind] += 1
    total = sum(outcomes.values())
    print(f"{total} (recipe, GPU, precision) triples at their defaults:")
    for kind, n in outcomes.most_common():
        print(f"  {n:4d}  {kind}")
    for kind, line in example.items():
        print(f"e.g. {kind}: {line}")


if __name__ == "__main__":
    main("-v" in sys.argv[1:])
