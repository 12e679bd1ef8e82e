"""The LoRA proof of tests/engine/training/test_lora_vllm.py on the real pretrained model, SmolLM2-135M-
Instruct (Llama architecture, tied embeddings): vLLM's log-probs with a new adapter equal the
learner's peft log-probs within 1e-4 and differ from the base model's; a request spanning an
update keeps its adapter; an adapter no request uses is unloaded."""

import pytest

from tests.engine.training.test_lora_vllm import check_adapters_reach_vllm


@pytest.mark.e2e
@pytest.mark.vllm
def test_smollm2_adapters_reach_vllm_exactly(smol_model, tmp_path):
    check_adapters_reach_vllm(str(smol_model), tmp_path, lr=1e-3, long_tokens=96)
