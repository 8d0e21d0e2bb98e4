"""The config.json files an earlier hf_tfm saved, with what their models computed then: tests/data/saved-configs/.

    python -m tests.support.saved_configs        # rewrites tests/data/saved-configs/ with the checked-out hf_tfm
    python -m tests.support.saved_configs NAME   # writes one record (a preset added since), the others kept

For every preset and a few option variants no preset has (norm placements, position schemes, MoE with capacity, the
rounding flags, an encoder-decoder MoE), the config as `save_pretrained` wrote it, the state dict's names and shapes,
and a sample of the logits of the paradigm's main head holding deterministic weights (`deterministic_weights`: each
tensor from a generator seeded by its own name, so that they do not depend on the order modules are built in).
tests/test_saved_configs.py loads each config with the current hf_tfm and checks that it builds the same state dict and
computes the same logits. Written once by the version whose configs are to keep loading; never regenerated to make a
test pass.
"""

import json
import zlib
from pathlib import Path

import torch

FOLDER = Path(__file__).resolve().parents[1] / "data" / "saved-configs"
TINY = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
# what no preset holds: name -> (paradigm model_type, fields)
VARIANTS = {
    "decoder-post-norm-alibi-moe-capacity": (
        "tfm_decoder",
        dict(
            TINY,
            norm_position="post",
            position_embedding_type="alibi",
            num_experts=4,
            num_experts_per_tok=2,
            capacity_factor=1.0,
            shared_expert_intermediate_size=32,
            shared_expert_gate=True,
            router_z_loss_coef=0.001,
            router_aux_loss_coef=0.01,
            moe_layers=[1],
        ),
    ),
    "decoder-sandwich-sinusoidal-glu": (
        "tfm_decoder",
        dict(TINY, norm_position="sandwich", position_embedding_type="sinusoidal", ffn_type="glu", hidden_act="gelu"),
    ),
    "decoder-parallel-learned-offset-fused-qkv": (
        "tfm_decoder",
        dict(TINY, parallel_residual=True, position_offset=2, fused_qkv_proj=True, lm_head_bias=True),
    ),
    "decoder-relative-bias-rmsnorm-untied": (
        "tfm_decoder",
        dict(
            TINY,
            position_embedding_type="relative_bias",
            norm_type="rmsnorm",
            tie_word_embeddings=False,
            num_key_value_heads=2,
            scale_lm_head_input=True,
        ),
    ),
    "decoder-rounding-flags-moe": (
        "tfm_decoder",
        dict(
            TINY,
            position_embedding_type="rope",
            norm_type="rmsnorm",
            rmsnorm_scale_in_float32=True,
            rope_tables_in_float32=True,
            rope_in_float32=True,
            scale_embeddings=True,
            round_embedding_scale=True,
            num_experts=4,
            router_in_float32=True,
            router_weights_in_model_dtype=True,
            scoring_func="sigmoid",
            router_choice_bias=True,
        ),
    ),
    "decoder-no-positions-output-norm": (
        "tfm_decoder",
        dict(
            TINY,
            position_embedding_type="none",
            norm_position="output",
            final_norm=False,
            embedding_norm=True,
            first_layer_attn_norm=True,
            attention_out_bias=False,
            final_logit_softcapping=30.0,
        ),
    ),
    "encoder-rope-sliding-qknorm-tokentypes": (
        "tfm_encoder",
        dict(
            TINY,
            position_embedding_type="rope",
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            qk_norm="per_head",
            type_vocab_size=2,
            pad_token_id=0,
        ),
    ),
    "encoder-disentangled-shared-layers-factorised": (
        "tfm_encoder",
        dict(
            TINY,
            position_embedding_type="disentangled",
            relative_attention_num_buckets=8,
            pos_att_type=["c2p"],
            share_att_key=False,
            relative_embeddings_norm=False,
            layer_sharing=[0, 0],
            embedding_size=32,
            ffn_dropout=0.0,
        ),
    ),
    "decoder-projected-token-table-post-norm": (
        "tfm_decoder",
        dict(TINY, word_embed_proj_dim=32, norm_position="post", final_norm=False),
    ),
    "encoder-decoder-moe-relative-bias": (
        "tfm_encoder_decoder",
        dict(
            TINY,
            position_embedding_type="relative_bias",
            norm_type="rmsnorm",
            decoder_layers=3,
            num_experts=4,
            num_experts_per_tok=1,
            decoder_sparse_step=2,
            pad_token_id=0,
            decoder_start_token_id=0,
            ffn_type="glu",
        ),
    ),
}
HEADS = {
    "tfm_decoder": "TfmDecoderForCausalLM",
    "tfm_encoder": "TfmEncoderForMaskedLM",
    "tfm_encoder_decoder": "TfmEncoderDecoderForConditionalGeneration",
}


def deterministic_weights(model: torch.nn.Module) -> None:
    """Every floating tensor of the state dict from a generator seeded by its name: small normal values (norm weights
    about 1), the same whatever order the model builds its modules in."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not tensor.is_floating_point():
                continue
            generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            values = torch.randn(tensor.shape, generator=generator) * 0.05
            if name.endswith("norm.weight") or "layernorm" in name:
                values += 1.0
            tensor.copy_(values)


def inputs_for(config) -> dict:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, min(config.vocab_size, 250), (2, 8), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding in the second row
    inputs = {"input_ids": ids, "attention_mask": mask}
    if config.model_type == "tfm_encoder_decoder":
        inputs["decoder_input_ids"] = torch.randint(3, min(config.vocab_size, 250), (2, 5), generator=generator)
    return inputs


def logits_sample(model) -> dict:
    with torch.no_grad():
        logits = model.eval()(**inputs_for(model.config)).logits.float()
    return {
        "first_logits": logits[..., :6].flatten().tolist(),
        "sum": logits.sum().item(),
        "abs_mean": logits.abs().mean().item(),
    }


def saved_configs() -> dict:
    """name -> config of every preset and variant, built by the checked-out hf_tfm."""
    import hf_tfm
    from hf_tfm.model.configuration_tfm import PARADIGM_CONFIGS

    configs = {name: hf_tfm.preset_config(name) for name in hf_tfm.preset_names()}
    for name, (model_type, fields) in VARIANTS.items():
        configs[name] = PARADIGM_CONFIGS[model_type](**fields)
    return configs


def main() -> None:
    import subprocess
    import sys

    import hf_tfm

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    names = sys.argv[1:]
    for name, config in saved_configs().items():
        if names and name not in names:
            continue
        folder = FOLDER / name
        config.save_pretrained(folder)
        for code in folder.glob("*.py"):  # the remote code save_pretrained copies beside it: not what is kept
            code.unlink()
        torch.manual_seed(0)
        model = getattr(hf_tfm, HEADS[config.model_type])(config)
        deterministic_weights(model)
        expected = {
            "hf_tfm_commit": commit,
            "state_dict": {key: "x".join(map(str, value.shape)) for key, value in model.state_dict().items()},
            "logits": logits_sample(model),
        }
        (folder / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
        print(name)


if __name__ == "__main__":
    main()
