"""GGUF (llama.cpp's file format) for hf_tfm decoders that convert exactly to Llama.

Two routes to llama.cpp. For a tokenizer llama.cpp's converter knows, hf_tfm's exact converter to the matching
transformers family, then llama.cpp's own `convert_hf_to_gguf.py` on the saved folder:

    from hf_tfm.convert import from_tfm
    from_tfm(model, "llama").save_pretrained("llama-folder")      # plus the tokenizer files
    python llama.cpp/convert_hf_to_gguf.py llama-folder --outtype f32   # on a machine with llama.cpp

For any model and tokenizer, `write_llama_gguf` writes the same file directly with the `gguf` package: the tensors,
names, Q/K row order and metadata llama.cpp's converter writes for a Llama (f32), and the vocabulary llama.cpp needs to
open a file: the model's tokenizer (byte-level BPE as llama.cpp's "gpt2" vocabulary with its merges, WordPiece as
"bert", Unigram as "llama" with its scores), or without one a "none" vocabulary that takes token ids only.
tests/test_export.py reads it back with `GGUFReader` and transformers' own GGUF loader (model and tokenizer); `make
test-llama-cpp` runs it in llama.cpp itself (llama-cpp-python, built from source): logits within 2e-6, the same greedy
tokens, also quantised. llama.cpp's own converter refuses the BPE tokenizers hf_tfm trains (it lists known
pre-tokenizers by hash).
"""

import json
from pathlib import Path

import numpy as np
import torch


def llama_cpp_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's order of a Q or K projection's rows (`permute` in convert_hf_to_gguf.py): per head, the two halves
    rotated together by transformers' rotate_half become interleaved pairs, as llama.cpp's RoPE reads them."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


# llama.cpp's token types (gguf.TokenType): a normal token, a control (special) token
NORMAL, CONTROL = 1, 3
# tokenizers' model type -> llama.cpp's vocabulary type
VOCABULARIES = {"BPE": "gpt2", "WordPiece": "bert", "Unigram": "llama"}


def add_vocabulary(writer, tokenizer, vocab_size: int) -> None:
    """The tokenizer metadata llama.cpp reads (`tokenizer.ggml.*`): the tokens in id order with their types, the BPE
    merges or the Unigram scores, and the special ids. `tokenizer` is a transformers fast tokenizer (None: llama.cpp's
    "none" vocabulary, ids only). Ids past the tokenizer's (a padded or larger vocabulary) get placeholder tokens."""
    if tokenizer is None:
        writer.add_tokenizer_model("none")
        return
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    model = state["model"]
    kind = model["type"]
    if kind not in VOCABULARIES:
        raise ValueError(
            f"a {kind} tokenizer has no llama.cpp vocabulary; the GGUF writer takes {', '.join(VOCABULARIES)}"
        )
    if kind == "Unigram":
        pieces = {index: (piece, score) for index, (piece, score) in enumerate(model["vocab"])}
    else:
        pieces = {index: (token, 0.0) for token, index in model["vocab"].items()}
    special = set()
    for added in state.get("added_tokens", []):
        pieces[added["id"]] = (added["content"], 0.0)
        if added.get("special"):
            special.add(added["id"])
    if max(pieces) >= vocab_size:
        raise ValueError(f"the tokenizer has ids up to {max(pieces)}, beyond the model's vocab_size={vocab_size}")
    tokens = [pieces.get(index, (f"[PAD{index}]", 0.0))[0] for index in range(vocab_size)]
    types = [CONTROL if index in special or index not in pieces else NORMAL for index in range(vocab_size)]
    writer.add_tokenizer_model(VOCABULARIES[kind])
    if kind == "BPE":
        writer.add_tokenizer_pre("default")
        merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]]
        writer.add_token_merges(merges)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores([pieces.get(index, ("", 0.0))[1] for index in range(vocab_size)])
    specials = {
        "bos": tokenizer.bos_token_id,
        "eos": tokenizer.eos_token_id,
        "unk": tokenizer.unk_token_id,
        "pad": tokenizer.pad_token_id,
    }
    for name, token_id in specials.items():
        if token_id is not None:
            getattr(writer, f"add_{name}_token_id")(token_id)
    writer.add_add_bos_token(False)  # hf_tfm's tokenizers add no start token; the caller's prompt says


def write_llama_gguf(model, path, tokenizer=None) -> Path:
    """Write `model` (an hf_tfm decoder that converts exactly to `LlamaForCausalLM`, or a Llama) as f32 GGUF, with
    `tokenizer`'s vocabulary (`add_vocabulary`)."""
    from gguf import GGUFWriter, LlamaFileType

    from ..convert.engine import from_tfm

    llama = model if type(model).__name__ == "LlamaForCausalLM" else from_tfm(model, "llama")
    config, state = llama.config, {k: v.detach().float() for k, v in llama.state_dict().items()}
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    path = Path(path)
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("hf_tfm")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_rope_dimension_count(head_dim)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(LlamaFileType.ALL_F32)
    add_vocabulary(writer, tokenizer, config.vocab_size)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    per_layer = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(config.num_hidden_layers):
        names.update(
            {f"model.layers.{i}.{ours}.weight": f"blk.{i}.{theirs}.weight" for ours, theirs in per_layer.items()}
        )
    for name, gguf_name in names.items():
        tensor = state[name]
        if name.endswith("q_proj.weight"):
            tensor = llama_cpp_rows(tensor, heads)
        elif name.endswith("k_proj.weight"):
            tensor = llama_cpp_rows(tensor, kv_heads)
        writer.add_tensor(gguf_name, np.ascontiguousarray(tensor.numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
