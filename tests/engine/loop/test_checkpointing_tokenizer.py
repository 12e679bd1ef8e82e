"""A run checkpoint's weights get the run's tokenizer from the learner's own export (no
transformers import in the controller, which cost seconds at the first checkpoint of a run
without SFT), and from the tokenizer itself only when the export has none."""

from __future__ import annotations

from pathlib import Path

from agentrl.engine.loop.checkpointing import RunCheckpointer


def checkpointer() -> RunCheckpointer:
    return RunCheckpointer(run_dir=None, learners=None, keep=2, tokenizer="some/tokenizer", log=None)  # type: ignore[arg-type]


def test_the_tokenizer_files_come_from_the_learners_export_and_nothing_of_the_weights_is_overwritten(tmp_path, monkeypatch):
    exported, weights = tmp_path / "learner" / "hf", tmp_path / "weights"
    exported.mkdir(parents=True)
    weights.mkdir()
    for name, text in {"tokenizer.json": "{tok}", "tokenizer_config.json": "{cfg}", "chat_template.jinja": "tpl",
                       "config.json": "{learner config}"}.items():
        (exported / name).write_text(text)
    (weights / "config.json").write_text("{served config}")  # a hard link to the published version's file
    (weights / "model.safetensors").write_text("weights")

    def no_loading(*a, **k):
        raise AssertionError("the tokenizer was loaded although the learner exported it")

    monkeypatch.setattr("agentrl.models.loading.load_tokenizer", no_loading)
    checkpointer()._add_tokenizer(exported, weights)
    assert {p.name for p in weights.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                                   "chat_template.jinja"}
    assert (weights / "config.json").read_text() == "{served config}" and (weights / "tokenizer.json").read_text() == "{tok}"


def test_without_an_exported_tokenizer_it_is_loaded_and_saved(tmp_path, monkeypatch):
    saved: list[tuple[str, Path]] = []

    class Tok:
        def __init__(self, name: str) -> None:
            self.name = name

        def save_pretrained(self, folder: Path) -> None:
            saved.append((self.name, Path(folder)))

    monkeypatch.setattr("agentrl.models.loading.load_tokenizer", Tok)
    (tmp_path / "weights").mkdir()
    checkpointer()._add_tokenizer(tmp_path / "learner" / "hf", tmp_path / "weights")
    assert saved == [("some/tokenizer", tmp_path / "weights")]
