"""eval.limit above the number of held-out rows warns, naming both numbers."""

from __future__ import annotations

import io
import json

from rich.console import Console

from agentrl.config import validate_recipe
from agentrl.engine.assembly import Assembly
from agentrl.engine.metrics import MetricsLogger


def test_an_eval_limit_above_the_rows_warns(tmp_path):
    src = tmp_path / "held_out.jsonl"
    src.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(3)))
    out = io.StringIO()
    log = MetricsLogger(tmp_path / "run", console=Console(file=out, width=300), live=False)
    for limit, warned in ((10, True), (3, False)):
        recipe = validate_recipe({"model": {"path": str(tmp_path)}, "run_dir": str(tmp_path / "run"),
                                  "eval": {"limit": limit, "source": str(src), "split": "test"}})
        evaluator = Assembly.from_recipe(recipe).evaluator(lambda: [], log=log, state=None)
        assert evaluator is not None and len(evaluator.rows) == 3
        said = f"eval.limit = {limit} but {src} [test] has only 3 rows: evaluating on all 3" in out.getvalue()
        assert said == warned, out.getvalue()
