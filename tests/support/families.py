"""Each converted family's tiny reference model, built from its record (`hf_tfm.convert.families.FAMILIES`, the
record's `tiny` config fields), with weights perturbed so that a dropped, swapped or transposed tensor shows. Every
test that needs a family's reference model builds it here, never from another test module."""

import pytest
import torch
import transformers
from conftest import perturb

from hf_tfm.compat import gpt_oss_declares_swiglu, switch_routes_as_switch
from hf_tfm.convert.families import FAMILIES


def train_the_choice_bias(model) -> None:
    """DeepSeek-V3's `e_score_correction_bias` as training leaves it: large enough to move which experts are chosen."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=torch.Generator().manual_seed(1)) * 0.5)


def eager_for_the_soft_cap(model) -> None:
    if model.config.attn_logit_softcapping is not None:
        model.set_attn_implementation("eager")  # transformers 5.17 defaults Gemma 2 to sdpa, which drops the cap


# what a family's tiny model needs beyond its config
PREPARE = {"deepseek_v3": train_the_choice_bias, "gemma2": eager_for_the_soft_cap}
# the encoder-decoders' weights perturbed more: their logits stay well apart through two stacks
PERTURB_SCALE = {"t5": 0.3, "bart": 0.3, "switch_transformers": 0.3}


def skip_where_the_reference_is_not_its_family(name: str) -> None:
    """Skip a test that runs `name`'s reference class where the installed transformers computes it wrongly
    (hf_tfm.compat's rows say which releases)."""
    if name == "switch_transformers" and not switch_routes_as_switch():
        pytest.skip("this transformers' SwitchTransformers does not route as Switch Transformer (hf_tfm/compat.py)")


def tiny_reference_config(name: str, **overrides):
    """The reference config of `name`'s tiny model, with `overrides`."""
    record = FAMILIES[name]
    fields = {**record.tiny, **overrides}
    if name == "gpt_oss" and not gpt_oss_declares_swiglu():  # transformers before 5.19 always clamps at 7.0
        fields.pop("swiglu_limit", None)
    return getattr(transformers, record.config_class)(**fields)


def tiny_reference(name: str, model_class=None, model_kwargs: dict | None = None, prepare=None, **overrides):
    """`name`'s tiny reference model (its usual checkpoint's class, or `model_class` built with `model_kwargs`),
    config `overrides` applied, weights seeded, set up by `prepare(model)` (a variant's own weights), then perturbed,
    in eval mode."""
    skip_where_the_reference_is_not_its_family(name)
    model_class = model_class or getattr(transformers, FAMILIES[name].reference)
    torch.manual_seed(0)
    model = model_class(tiny_reference_config(name, **overrides), **(model_kwargs or {}))
    for step in (PREPARE.get(name), prepare):
        if step is not None:
            step(model)
    return perturb(model, scale=PERTURB_SCALE.get(name, 0.1))


def untied_bart():
    """BART with its own LM head and unscaled embeddings, and still one token table, as its checkpoints store it
    (three times, equal)."""

    def one_token_table(model):
        shared = model.model.shared.weight
        model.model.encoder.embed_tokens.weight = model.model.decoder.embed_tokens.weight = shared

    return tiny_reference("bart", prepare=one_token_table, scale_embedding=False, tie_word_embeddings=False)
