"""``agentrl check RECIPE --dry-run``: resolve what can be resolved without running anything.

Each check prints one line: ``ok``, ``offline`` (needs the network: a hub model or dataset that
is not cached here — not an error on a machine without internet), ``elsewhere`` (planned for a
machine this is not: a GPU recipe checked on a machine without GPUs), ``warning`` (runs, but not
as the recipe reads: an ``eval.limit`` above the rows there are), or ``error`` (the recipe cannot
run anywhere). The run directory is not created and no actor is started.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentrl.config import Recipe
from agentrl.errors import AgentRLError, ConfigError, DataError, ModelError

__all__ = ["dry_run", "load_reward_functions"]


def load_reward_functions(recipe: Recipe) -> list:
    """The user's reward functions of ``reward.functions``, loaded
    (:class:`~agentrl.engine.rewards.functions.RewardFunction`); a ConfigError names the key
    (``reward.functions[i].fn``) of one that does not import, is not callable or asks for an
    argument it is never given. Needs the user's directories on ``sys.path``
    (:func:`agentrl.user_code.use_user_code`)."""
    from agentrl.engine.rewards.functions import RewardFunction, function_specs

    return [RewardFunction(s) for s in function_specs([(f.fn, f.weight, f.timeout_s) for f in recipe.reward.functions])]


def _model(recipe: Recipe) -> tuple[str, str]:
    from agentrl.models.loading import load_tokenizer, looks_like_local_path

    from agentrl.model_plan import plan_model

    path = recipe.model.path
    plan = plan_model(path, recipe.model.build, recipe.model.import_)
    if plan.action == "build":
        return "ok", f"{path}: will be built ({plan.source})"
    if plan.action == "import":
        from agentrl.models.importing import locate_gguf

        try:
            gguf = locate_gguf(plan.source)
        except ModelError as exc:
            return "error", str(exc)
        return "ok", f"{path}: will be imported from {gguf}"
    try:
        tok = load_tokenizer(path)
    except ModelError as exc:
        if looks_like_local_path(path):
            return "error", str(exc)
        return "offline", f"{path}: hub model, not reachable or cached here"
    has_template = bool(getattr(tok, "chat_template", None))
    return ("ok" if has_template else "error"), f"{path}: tokenizer loads ({len(tok)} tokens, chat template {'present' if has_template else 'MISSING'})"


def _data(
    recipe: Recipe, split: str, limit: int | None, source: str | None = None, fields: dict[str, str] | None = None,
    limit_key: str | None = None,
) -> tuple[str, str]:
    """The data line of ``source`` (the recipe's training data when None). ``limit_key``: the
    recipe key that set ``limit`` (``eval.limit``), when fewer rows than it are a warning."""
    from agentrl.envs.data import is_local_source, load_rows
    from agentrl.models.loading import hub_reachable

    src = source or recipe.data.source
    fields = fields if fields is not None else recipe.data.fields
    local = src.startswith("synthetic:") or is_local_source(src)  # decided as load_rows decides it
    if not local and not hub_reachable():
        return "offline", f"{src}: hub dataset, the Hugging Face Hub is not reachable from here"
    try:
        rows = load_rows(src, split=split, fields=fields or None, limit=limit or 4, seed=recipe.seed)
    except DataError as exc:
        return ("error" if local else "offline"), str(exc)
    loaded = f"{src} [{split}]: rows load (first: {str(rows[0])[:80]}...)"
    if limit_key is not None and limit and len(rows) < limit:
        return "warning", f"{limit_key} = {limit} but {src} [{split}] has only {len(rows)} rows: the run evaluates all {len(rows)}; {loaded}"
    return "ok", loaded


def _env(recipe: Recipe) -> tuple[str, str]:
    from agentrl.envs import make_env

    if recipe.env.agent is not None:
        from agentrl.agents import load_agent

        try:
            load_agent(recipe.env.agent)
        except AgentRLError as exc:
            return "error", str(exc)
        return "ok", f"agent {recipe.env.agent}: an async (client, row) function, served as model {recipe.env.agent_model!r}"
    try:
        env = make_env(recipe.env.id, **{"sandbox": recipe.sandbox.type, **recipe.env.kwargs})
        env.close()
    except AgentRLError as exc:
        return "error", str(exc)
    return "ok", f"{recipe.env.id}: builds with {recipe.env.kwargs or 'no kwargs'}"


def _prompt(recipe: Recipe) -> tuple[str, str]:
    """The first data row's prompt, rendered with the model's chat template, against the limits."""
    limit = min(recipe.rollout.max_episode_tokens, recipe.generator.max_model_len)
    limits = f"rollout.max_episode_tokens={recipe.rollout.max_episode_tokens}, generator.max_model_len={recipe.generator.max_model_len}"
    if recipe.env.agent is not None:
        return "ok", f"an agent's prompts are its own calls; one over {limit} tokens ({limits}) is answered 400 context_length_exceeded"
    from agentrl.engine.episodes.render import IncrementalRenderer
    from agentrl.envs import make_env
    from agentrl.envs.data import load_rows
    from agentrl.model_plan import plan_model
    from agentrl.models.loading import load_tokenizer, looks_like_local_path

    path = recipe.model.path
    plan = plan_model(path, recipe.model.build, recipe.model.import_)
    if plan.action == "build":
        return "ok", f"not rendered: {path} does not exist yet (the run builds it: {plan.source})"
    if plan.action == "import":
        return "ok", f"not rendered: {path} does not exist yet (the run imports it from {plan.source})"
    try:
        tokenizer = load_tokenizer(path)
    except ModelError as exc:
        if looks_like_local_path(path):
            return "error", f"cannot render a prompt: {exc}"
        return "offline", "not rendered: hub model not reachable or cached here"
    try:
        row = load_rows(recipe.data.source, split=recipe.data.split, fields=recipe.data.fields or None, limit=1, seed=recipe.seed)[0]
        env = make_env(recipe.env.id, **{"sandbox": recipe.sandbox.type, **recipe.env.kwargs})
        try:
            messages, _ = env.unwrapped.reset(seed=recipe.seed, options={"row": row})
        finally:
            env.close()
        n = len(IncrementalRenderer(tokenizer, messages).prompt_ids())
    except AgentRLError as exc:
        return "error", f"cannot render a prompt: {exc}"
    room = limit - n
    detail = f"the first prompt is {n} tokens; an episode may hold {limit} ({limits}), {room} left for the model and tools"
    if room <= 0:
        return "error", f"{detail}: every episode would end before the model writes a token. Raise rollout.max_episode_tokens and generator.max_model_len"
    if room < recipe.rollout.max_new_tokens:
        return "ok", f"{detail}: less than one turn of rollout.max_new_tokens={recipe.rollout.max_new_tokens}"
    return "ok", detail


def _sandbox(recipe: Recipe) -> tuple[str, str]:
    import shutil

    if recipe.sandbox.type == "bubblewrap" and not shutil.which("bwrap"):
        return "error", "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    if recipe.sandbox.type == "bubblewrap":
        from agentrl.sandbox import describe_cgroups, describe_seccomp

        status = describe_seccomp()
        return ("error" if "unavailable" in status else "ok"), f"bubblewrap; {status}; limits: {describe_cgroups()}"
    return "ok", f"{recipe.sandbox.type}"


def _colocated_on_gpus(recipe: Recipe) -> bool:
    """Whether the run would place generator i on learner rank i's GPU (the placement the
    ``placement`` check plans, for this machine or the recipe's ``placement.gpus_per_node``)."""
    from agentrl.placement_plan import ClusterShape, plan_placement

    p, g, lr = recipe.placement, recipe.generator, recipe.learner
    if not (g.num_gpus > 0 or lr.num_gpus > 0):
        return False
    shape = ClusterShape.this_machine(gpus_per_node=p.gpus_per_node, gpu_memory_gib=p.gpu_memory_gib)
    if not shape.total_gpus:
        return p.mode == "colocated"
    try:
        return plan_placement(recipe, shape).colocated
    except ConfigError:
        return False  # the placement check reports it


def _resources(recipe: Recipe) -> tuple[str, str]:
    g, lr = recipe.generator, recipe.learner
    if _colocated_on_gpus(recipe):  # generator i and learner rank i share one GPU
        gpus: float = lr.num_ranks
    else:
        gpus = g.num_generators * max(g.num_gpus, g.tensor_parallel_size if g.num_gpus else 0) + lr.num_ranks * lr.num_gpus
    cpus = g.num_generators * g.num_cpus + lr.num_ranks * lr.num_cpus + recipe.rollout.num_workers * recipe.rollout.num_cpus
    critic = ""
    if recipe.algo.advantage == "gae":
        c = recipe.critic_settings
        gpus, cpus = gpus + c.num_ranks * c.num_gpus, cpus + c.num_ranks * c.num_cpus
        critic = f", {c.num_ranks} critic ranks"
    j, m = recipe.reward.judge, recipe.reward.model
    if j is not None and j.model != "policy":  # a separate judge model: its own generators
        gpus, cpus = gpus + j.num_generators * j.num_gpus, cpus + j.num_generators * j.num_cpus
        critic += f", {j.num_generators} judge generators"
    if m is not None:
        gpus, cpus = gpus + m.num_gpus, cpus + m.num_cpus
        critic += ", 1 reward-model actor"
    return "ok", f"needs {gpus:g} GPUs and {cpus:g} CPUs in the Ray cluster ({g.num_generators} generators, {lr.num_ranks} learner ranks{critic})"


def _placement(recipe: Recipe) -> tuple[str, str]:
    """``placement.mode`` resolved for this machine (or ``placement.gpus_per_node`` GPUs of
    ``placement.gpu_memory_gib``), with the colocated memory plan; an impossible one is an error."""
    from agentrl.placement_plan import ClusterShape, plan_placement

    p = recipe.placement
    shape = ClusterShape.this_machine(gpus_per_node=p.gpus_per_node, gpu_memory_gib=p.gpu_memory_gib)
    wants_gpus = recipe.generator.num_gpus > 0 or recipe.learner.num_gpus > 0
    if wants_gpus and not shape.total_gpus:
        return "elsewhere", ("this machine has no GPU; set placement.gpus_per_node (and placement.gpu_memory_gib) "
                             "to plan the placement of the GPU machine the recipe is for")
    try:
        plan = plan_placement(recipe, shape)
    except ConfigError as exc:
        return "error", str(exc)
    first, *rest = plan.lines()
    return "ok", "\n".join([first.removeprefix("placement: "), *(f"{'':23}{line.strip()}" for line in rest)])


def _dtype(recipe: Recipe) -> tuple[str, str]:
    """``model.dtype`` resolved as the run resolves it (:mod:`agentrl.dtype_plan`; ``auto`` on a
    GPU recipe checked on a machine without GPUs is planned for the GPUs)."""
    from agentrl.dtype_plan import plan_dtype

    plan = plan_dtype(recipe.model.dtype, gpu=recipe.generator.num_gpus > 0 or recipe.learner.num_gpus > 0,
                      explicit="dtype" in recipe.model.model_fields_set)
    return "ok", f"{plan.dtype} ({plan.reason})"


def _objective(recipe: Recipe) -> tuple[str, str]:
    """The advantage estimator and, for PPO with GAE, the critic."""
    a = recipe.algo
    if a.advantage != "gae":
        return "ok", f"{a.advantage} advantages over groups of {recipe.rollout.group_size}, {a.policy_loss} loss"
    c = recipe.critic_settings
    start = c.model or "the model RL starts from"
    warm = f", the first {c.warmup_steps} steps train the critic alone" if c.warmup_steps else ""
    return "ok", (f"gae advantages per token (gamma {a.gae_gamma:g}, lambda {a.gae_lambda:g}), {a.policy_loss} loss; critic: "
                  f"trunk of {start} + value head, lr {c.lr:g}, value clip {c.value_clip}{warm}")


def _reward(recipe: Recipe) -> tuple[str, str]:
    """The reward's composition; a separate judge's tokenizer and the reward model's folder."""
    import re

    from agentrl.models.loading import load_tokenizer, looks_like_local_path

    rw = recipe.reward
    j, m = rw.judge, rw.model
    parts = [f"{rw.env_weight:g} * env_reward"]
    notes = []
    if j is not None:
        parts.append(f"{j.weight:g} * judge_score")
        notes.append(f"judge: {'the policy' + chr(39) + 's generators' if j.model == 'policy' else j.model}")
        named = set(re.findall(r"\{(\w+)\}", j.template)) - {"response", "transcript"}
        if named:
            notes.append(f"template fields from the row: {', '.join(sorted(named))}")
        if j.model != "policy":
            try:
                load_tokenizer(j.model)
            except ModelError as exc:
                return ("error" if looks_like_local_path(j.model) else "offline"), f"judge model: {exc}"
    if m is not None:
        parts.append(f"{m.weight:g} * rm_score")
        if looks_like_local_path(m.path) and not (Path(m.path) / "config.json").is_file():
            return "error", f"reward model {m.path!r}: no config.json there"
        notes.append(f"reward model: {m.path} (batches of up to {m.max_batch_size})")
    try:
        functions = load_reward_functions(recipe)
    except ConfigError as exc:
        return "error", str(exc)
    for f in functions:
        parts.append(f"{f.spec.weight:g} * {f.spec.metric}")
    if functions:
        notes.append("functions: " + ", ".join(f"{f.spec.ref}({', '.join(f.wants)}){' async' if f.is_async else ''}" for f in functions))
    detail = "reward = " + " + ".join(parts)
    return "ok", detail + (f" ({'; '.join(notes)})" if notes else "")


def dry_run(recipe: Recipe, echo: Callable[[str], None] = print) -> bool:
    """Run every offline check; print one line each; return False if any is an ``error``."""
    checks = [
        ("model", lambda: _model(recipe)),
        ("data", lambda: _data(recipe, recipe.data.split, recipe.data.limit)),
        ("eval data", lambda: _data(recipe, recipe.eval.split, recipe.eval.limit, recipe.eval.source, recipe.eval.fields, "eval.limit")
         if recipe.eval.limit else ("ok", "no evaluation")),
        *((f"eval {name}", lambda s=s: _data(recipe, s.split, s.limit or recipe.eval.limit, s.source,
                                              s.fields if s.fields is not None else recipe.eval.fields))
          for name, s in recipe.eval.sets.items()),
        ("environment", lambda: _env(recipe)),
        ("reward", lambda: _reward(recipe)),
        ("objective", lambda: _objective(recipe)),
        ("prompt", lambda: _prompt(recipe)),
        ("sandbox", lambda: _sandbox(recipe)),
        ("resources", lambda: _resources(recipe)),
        ("placement", lambda: _placement(recipe)),
        ("dtype", lambda: _dtype(recipe)),
    ]
    ok = True
    for name, fn in checks:
        try:
            status, detail = fn()
        except Exception as exc:  # a check must never crash the dry run
            status, detail = "error", f"{type(exc).__name__}: {exc}"
        ok &= status != "error"
        echo(f"{status:>8}  {name:<12} {detail}")
    return ok
