"""``agentrl train`` with a fault injected through a loop hook (never through the environment):

    python -m tests.e2e.fault_train --kill-generator-after-step N RECIPE [--set section.key=value ...]

kills generator 0 once the learner reached step N and episodes are in flight
(:class:`agentrl.engine.testing.KillGenerator`), as if its node was lost."""

from __future__ import annotations

import argparse
import sys

from agentrl.cli import main
from agentrl.engine.testing import KillGenerator


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kill-generator-after-step", type=int, required=True)
    args, rest = p.parse_known_args(argv)
    return main(["train", *rest], hooks=[KillGenerator(args.kill_generator_after_step)])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
