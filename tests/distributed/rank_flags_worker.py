"""torchrun worker: one of the trainers with flags that differ between ranks.

    rank_flags_worker.py TRAINER '{"1": ["--lr", "0.02"]}' FLAGS...

runs ``trainers/TRAINER.py FLAGS...`` on every rank, with the JSON's flags for a rank
appended on that rank (to check that ranks refuse to train when they disagree); an entry
``env:NAME=VALUE`` sets an environment variable of that rank instead.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

from trainers import common


def main() -> int:
    trainer, per_rank, argv = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
    module = importlib.import_module(f"trainers.{trainer}")
    for item in per_rank.get(os.environ["RANK"], []):
        if item.startswith("env:"):
            name, _, value = item[4:].partition("=")
            os.environ[name] = value
        else:
            argv.append(item)
    return common.run(module.PROG, module.main, argv)


if __name__ == "__main__":
    sys.exit(main())
