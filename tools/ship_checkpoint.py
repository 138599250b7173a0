"""Ship a trained policy as ``learned:NAME``: copy a run's ``policy.zip`` into the package's
checkpoints with its card (the run's configuration and evaluation, and a description).

    python tools/ship_checkpoint.py conv-study-overload runs/tasks/conv-study-overload \\
        --description "PPO from a behaviour-cloning warm start on the task's train windows"

``learned:NAME`` then loads it anywhere a baseline runs; ``cbgym.agents.learned.read_card``
reads the card.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from cbgym.agents.learned import CHECKPOINT_DIR


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name", help="checkpoint name (learned:NAME); a task's name for its own")
    parser.add_argument("run", type=Path, help="a train.py output folder")
    parser.add_argument("--description", required=True)
    args = parser.parse_args(argv)
    files = {f: args.run / f for f in ("policy.zip", "config.json", "evaluation.json")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        parser.error(f"{args.run} is not a finished train.py run: missing {', '.join(missing)}")
    if not args.name.replace("-", "").replace("_", "").isalnum():
        parser.error(f"name {args.name!r}: letters, digits, '-' and '_' only")
    shutil.copyfile(files["policy.zip"], CHECKPOINT_DIR / f"{args.name}.zip")
    evaluation = json.loads(files["evaluation.json"].read_text())
    evaluation.pop("per_window", None)  # the summary is what the card shows
    card = {"name": args.name, "file": f"{args.name}.zip", "description": args.description,
            "config": json.loads(files["config.json"].read_text()), "evaluation": evaluation}
    (CHECKPOINT_DIR / f"{args.name}.json").write_text(json.dumps(card, indent=1) + "\n")
    print(f"shipped learned:{args.name} -> {CHECKPOINT_DIR / args.name}.zip", file=sys.stderr)


if __name__ == "__main__":
    main()
