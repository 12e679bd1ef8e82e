from pathlib import Path

import pytest

from agentrl.config import load_recipe, parse_override
from agentrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "recipes").glob("*.toml"))

MINIMAL = '[model]\npath = "some/model"\n'


def write(tmp_path, text, name="r.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_loads(path):
    recipe = load_recipe(path)
    assert recipe.model.path


def test_shipped_recipes_exist():
    assert any(p.name == "tiny_calc.toml" for p in RECIPES)


def test_defaults(tmp_path):
    r = load_recipe(write(tmp_path, MINIMAL))
    assert r.mode == "async" and r.sandbox.type == "bubblewrap" and r.env.id == "agentrl/Calc-v0"
    assert r.resolved_run_dir() == Path("runs/run").absolute()


def test_overrides(tmp_path):
    r = load_recipe(write(tmp_path, MINIMAL), ["learner.lr=3e-4", "rollout.stop=['</code>', 'x']", "name=exp", "ray.address=auto"])
    assert r.learner.lr == 3e-4
    assert r.rollout.stop == ["</code>", "x"]
    assert r.name == "exp" and r.ray.address == "auto"


def test_sync_mode_means_zero_staleness(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL), ["mode=sync"]).max_staleness == 0


def test_malformed_toml_names_file(tmp_path):
    p = write(tmp_path, "[model\npath = 1\n")
    with pytest.raises(ConfigError) as e:
        load_recipe(p)
    assert str(p) in str(e.value) and "malformed TOML" in str(e.value)


def test_wrong_type_names_key_value_and_expectation(tmp_path):
    p = write(tmp_path, MINIMAL + '[learner]\nlr = "fast"\n')
    with pytest.raises(ConfigError) as e:
        load_recipe(p)
    msg = str(e.value)
    assert str(p) in msg and "learner.lr" in msg and "'fast'" in msg and "number" in msg
    assert "pydantic" not in msg and "errors.pydantic.dev" not in msg


def test_unknown_key(tmp_path):
    with pytest.raises(ConfigError, match=r"learner\.bogus: unknown key"):
        load_recipe(write(tmp_path, MINIMAL), ["learner.bogus=1"])


def test_missing_required(tmp_path):
    with pytest.raises(ConfigError, match=r"model: required key is missing"):
        load_recipe(write(tmp_path, "name = 'x'\n"))


def test_bad_literal(tmp_path):
    with pytest.raises(ConfigError, match=r"sandbox\.type: got 'firecracker'"):
        load_recipe(write(tmp_path, MINIMAL), ["sandbox.type=firecracker"])


def test_cross_field_rule(tmp_path):
    with pytest.raises(ConfigError, match="multiple of rollout.group_size"):
        load_recipe(write(tmp_path, MINIMAL), ["learner.batch_size=10", "rollout.group_size=4"])


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.toml")


def test_override_syntax():
    assert parse_override("a.b=2") == (["a", "b"], 2)
    assert parse_override("a.b=hello world") == (["a", "b"], "hello world")
    with pytest.raises(ConfigError):
        parse_override("nokey")
    with pytest.raises(ConfigError):
        parse_override("a..b=1")


def test_override_into_value_is_error(tmp_path):
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_recipe(write(tmp_path, MINIMAL), ["model.path.x=1"])


def test_every_field_documented():
    from pydantic import BaseModel

    from agentrl.config import Recipe

    seen = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann)

    walk(Recipe)
    assert len(seen) > 5


def test_http_generator_backend_needs_urls():
    import pytest

    from agentrl.config import Recipe

    ok = Recipe.model_validate({"model": {"path": "m"}, "generator": {"backend": "http", "urls": ["http://a:8000"]}})
    assert ok.generator.urls == ["http://a:8000"]
    with pytest.raises(Exception, match="needs urls"):
        Recipe.model_validate({"model": {"path": "m"}, "generator": {"backend": "http"}})
    with pytest.raises(Exception, match="only used with"):
        Recipe.model_validate({"model": {"path": "m"}, "generator": {"urls": ["http://a:8000"]}})


def test_weight_sync_choices():
    import pytest

    from agentrl.config import Recipe

    assert Recipe.model_validate({"model": {"path": "m"}}).generator.weight_sync == "disk"
    assert Recipe.model_validate({"model": {"path": "m"}, "generator": {"weight_sync": "gloo"}}).generator.weight_sync == "gloo"
    with pytest.raises(Exception, match="weight_sync"):
        Recipe.model_validate({"model": {"path": "m"}, "generator": {"weight_sync": "tcp"}})
    with pytest.raises(Exception, match='needs backend = "vllm"'):
        Recipe.model_validate({"model": {"path": "m"}, "generator": {"backend": "http", "urls": ["http://a:8000"], "weight_sync": "nccl"}})


def test_sandbox_preload_is_for_bubblewrap():
    import pytest

    from agentrl.config import Recipe

    r = Recipe.model_validate({"model": {"path": "m"}, "sandbox": {"preload": []}})
    assert r.sandbox.preload == []
    assert Recipe.model_validate({"model": {"path": "m"}}).sandbox.preload is None
    with pytest.raises(Exception, match="only used by the bubblewrap"):
        Recipe.model_validate({"model": {"path": "m"}, "sandbox": {"type": "docker", "preload": ["numpy"]}})


def test_gae_takes_a_critic_section_and_other_estimators_refuse_it(tmp_path):
    recipe = load_recipe(write(tmp_path, MINIMAL + '[algo]\nadvantage = "gae"\ngae_lambda = 0.9\n[critic]\nlr = 1e-3\nwarmup_steps = 3\n'))
    assert recipe.critic_settings.lr == 1e-3 and recipe.algo.gae_lambda == 0.9
    assert load_recipe(write(tmp_path, MINIMAL + '[algo]\nadvantage = "gae"\n', "d.toml")).critic_settings.value_clip == 0.5
    with pytest.raises(ConfigError, match='critic.*advantage = "gae".*"grpo"'):
        load_recipe(write(tmp_path, MINIMAL + "[critic]\nlr = 1e-3\n", "c.toml"))
    with pytest.raises(ConfigError, match="gae_gamma"):
        load_recipe(write(tmp_path, MINIMAL + '[algo]\nadvantage = "gae"\ngae_gamma = 1.5\n', "g.toml"))
    with pytest.raises(ConfigError, match="value_clip"):
        load_recipe(write(tmp_path, MINIMAL + '[algo]\nadvantage = "gae"\n[critic]\nvalue_clip = 0\n', "v.toml"))


def test_a_gpu_generator_waits_longer_for_its_engine_to_start_unless_told():
    """A first GPU start downloads, loads, compiles and captures CUDA graphs: 600 s (the CPU
    default) is too short for a 7B model; an explicit value always wins."""
    from agentrl.config import GPU_STARTUP_TIMEOUT_S, GeneratorConfig

    assert GeneratorConfig().startup_timeout_s == 600.0
    assert GeneratorConfig(num_gpus=1).startup_timeout_s == GPU_STARTUP_TIMEOUT_S == 1800.0
    assert GeneratorConfig(num_gpus=1, startup_timeout_s=120).startup_timeout_s == 120.0
    assert GeneratorConfig(startup_timeout_s=900).startup_timeout_s == 900.0
    recipe = load_recipe(Path(__file__).parents[1] / "recipes" / "retool_math.toml")
    assert recipe.generator.num_gpus > 0 and recipe.generator.startup_timeout_s == GPU_STARTUP_TIMEOUT_S
