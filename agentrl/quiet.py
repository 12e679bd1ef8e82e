"""No third-party progress bars on agentrl's console.

agentrl draws its own progress (the step lines and the live panel of
:mod:`agentrl.engine.progress`). The libraries it drives draw theirs with tqdm on the same
console: transformers' ``Writing model shards`` when a model is built or exported, Hugging Face
Hub downloads, ``datasets``' ``Generating train split``. Actors never do (their output goes to
``RUN_DIR/logs`` and their environment sets ``TQDM_DISABLE``,
:data:`agentrl.engine.wiring.ACTOR_ENV_VARS`); the process that runs the console does, and this
module turns them off there:

- :func:`quiet_environment`: the ``agentrl`` command sets :data:`QUIET_ENV` before anything is
  imported (these libraries read them at import: tqdm's ``TQDM_DISABLE`` covers any tqdm bar);
  a variable the user set is left as it is.
- :func:`no_progress_bars`: the Python API (``agentrl.train``...), where the libraries may be
  imported already, turns the bars of huggingface_hub, transformers and datasets off through
  their own switches for the call and puts them back after it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, MutableMapping

__all__ = ["QUIET_ENV", "no_progress_bars", "quiet_environment"]

QUIET_ENV: dict[str, str] = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
}
"""Environment variables that turn off the progress bars of huggingface_hub (and transformers,
which follows it), datasets and every tqdm bar, when set before those libraries are imported."""


def quiet_environment(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set each of :data:`QUIET_ENV` in ``environ`` (default: ``os.environ``) that is not set
    yet; the variables it set (so a caller can take them back)."""
    env = os.environ if environ is None else environ
    added = {k: v for k, v in QUIET_ENV.items() if k not in env}
    env.update(added)
    return added


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """Within: no progress bars from huggingface_hub, transformers (imported before or during the
    block: it takes huggingface_hub's switch at import) or datasets (imported before the block;
    :func:`agentrl.envs.data.load_rows` turns its bars off for a Hub dataset itself). After it,
    each library's switch is what it was (or, for transformers imported within the block, what
    huggingface_hub's was)."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hub_on = not are_progress_bars_disabled()
    transformers_was = sys.modules.get("transformers.utils.logging")
    transformers_on = transformers_was is not None and transformers_was.is_progress_bar_enabled()
    datasets_was = sys.modules.get("datasets.utils.tqdm")
    datasets_on = datasets_was is not None and not datasets_was.are_progress_bars_disabled()
    disable_progress_bars()
    if transformers_was is not None:
        transformers_was.disable_progress_bar()
    if datasets_on:
        datasets_was.disable_progress_bars()  # type: ignore[union-attr]
    try:
        yield
    finally:
        transformers = sys.modules.get("transformers.utils.logging")
        if transformers is not None and (transformers_on if transformers_was is not None else hub_on):
            transformers.enable_progress_bar()  # (turns huggingface_hub's on as well: set just below)
        if hub_on:
            enable_progress_bars()
        else:
            disable_progress_bars()
        if datasets_on:
            datasets_was.enable_progress_bars()  # type: ignore[union-attr]
