"""GGUF (llama.cpp's file format) for hf_tfm decoders that convert exactly to Llama.

The route to llama.cpp is hf_tfm's exact converter to the matching transformers family, then llama.cpp's own
`convert_hf_to_gguf.py` on the saved folder:

    from hf_tfm.convert import from_tfm
    from_tfm(model, "llama").save_pretrained("llama-folder")      # plus the tokenizer files
    python llama.cpp/convert_hf_to_gguf.py llama-folder --outtype f32   # on a machine with llama.cpp

llama.cpp is not on the package index, so what can be proved here is proved with `write_llama_gguf`: the same
tensors, names, Q/K row order and metadata llama.cpp's converter writes for a Llama (f32, no tokenizer metadata),
written with the `gguf` package, read back by its `GGUFReader`, and loaded by transformers' own GGUF loader
(`LlamaForCausalLM.from_pretrained(folder, gguf_file=...)`, which undoes llama.cpp's conventions) into the same
logits (tests/test_export.py). A real deployment adds the tokenizer with llama.cpp's converter.
"""

from pathlib import Path

import numpy as np
import torch


def llama_cpp_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's order of a Q or K projection's rows (`permute` in convert_hf_to_gguf.py): per head, the two halves
    rotated together by transformers' rotate_half become interleaved pairs, as llama.cpp's RoPE reads them."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_llama_gguf(model, path) -> Path:
    """Write `model` (an hf_tfm decoder that converts exactly to `LlamaForCausalLM`, or a Llama) as f32 GGUF."""
    from gguf import GGUFWriter, LlamaFileType

    from .convert import from_tfm

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
