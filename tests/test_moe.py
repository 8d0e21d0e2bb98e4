"""Mixture of Experts: Mixtral parity, experts backends, router losses and their wiring, layer selection, capacity,
auxiliary-loss-free balancing, every paradigm, remote code, and gradient accumulation under Trainer."""

import copy
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from conftest import VOCAB, assert_same_state_dict, perturb, realigned, tiny_config, tiny_model
from safetensors.torch import load_file
from support.families import tiny_reference
from support.processes import run_without_hf_tfm
from support.trainer import ListDataset, accumulation_run
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    MixtralConfig,
    MixtralForCausalLM,
)
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForCausalLM,
    TfmDecoderForSequenceClassification,
    TfmDecoderModel,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderDecoderModel,
    TfmEncoderForMaskedLM,
    TfmEncoderForQuestionAnswering,
    TfmEncoderForSequenceClassification,
    TfmEncoderForTokenClassification,
    TfmEncoderModel,
)
from hf_tfm.convert import from_tfm, to_tfm
from hf_tfm.model.modeling_tfm_moe import TfmExperts, TfmMoE, TfmRouter, load_balancing_loss, router_z_loss

ATOL = 1e-4
PAD = 0
E, K = 4, 2  # experts, top-k
MOE = dict(num_experts=E, num_experts_per_tok=K)
BACKENDS = ["eager", "batched_mm", "grouped_mm"]


def router_loss_parts(model, router_logits, attention_mask):
    """(the load-balancing loss, the z-loss) of `router_logits`, as the model's heads compute them."""
    config = model.config
    aux = load_balancing_loss(router_logits, config.num_experts, config.num_experts_per_tok, attention_mask)
    return aux, router_z_loss(router_logits, attention_mask)


def moe_model(seed: int = 0, **overrides) -> TfmDecoderForCausalLM:
    """A tiny MoE decoder (every layer MoE by default), perturbed so that routing is decisive, not near-uniform."""
    return perturb(tiny_model(seed, **{**MOE, **overrides}))


def padded_batch(rows: int = 2, length: int = 9, seed: int = 2):
    """Ids with the second row left-padded by 3, its mask, `generate`'s position ids, and labels (-100 on pads)."""
    torch.manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (rows, length))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0
    input_ids[1, :3] = PAD
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return input_ids, attention_mask, position_ids, labels


def routers(model) -> list[TfmRouter]:
    return [module for module in model.modules() if isinstance(module, TfmRouter)]


def record_routing(model) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Hooks on every router; the returned list fills with (top-k weights, top-k indices), one entry per router
    call."""
    records = []
    for router in routers(model):
        router.register_forward_hook(lambda module, args, out: records.append((out[1].detach(), out[2])))
    return records


# ----------------------------------------------------------------------------------------------- Mixtral parity


def mixtral(**overrides):
    return tiny_reference("mixtral", **overrides)


@pytest.mark.parametrize("experts", ["eager", "grouped_mm"])
def test_mixtral_logits_and_losses_match(experts):
    """Converted Mixtral: same logits (left-padded), router logits, aux loss and loss, on the same experts backend."""
    ref = mixtral()
    ours = to_tfm(ref)
    for model in (ref, ours):
        model.set_experts_implementation(experts)
        assert model.config._experts_implementation == experts
    input_ids, attention_mask, position_ids, labels = padded_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    real = attention_mask.bool()
    with torch.no_grad():
        expected, actual = ref(**kwargs), ours(**kwargs)
        assert expected.logits.abs().max() > 100 * ATOL  # not vacuous
        torch.testing.assert_close(actual.logits[real], expected.logits[real], atol=ATOL, rtol=0)

        expected = ref(**kwargs, labels=labels, output_router_logits=True)
        actual = ours(**kwargs, labels=labels, output_router_logits=True)
    assert len(actual.router_logits) == len(expected.router_logits) == 2
    for mine, theirs in zip(actual.router_logits, expected.router_logits):
        torch.testing.assert_close(mine[real.reshape(-1)], theirs[real.reshape(-1)], atol=ATOL, rtol=0)
    assert ref.config.router_aux_loss_coef * expected.aux_loss > 100 * ATOL  # the aux term shows in the loss
    torch.testing.assert_close(actual.aux_loss, expected.aux_loss, atol=ATOL, rtol=0)
    torch.testing.assert_close(actual.loss, expected.loss, atol=ATOL, rtol=0)


def test_mixtral_jitter_noise_trains_as_the_reference():
    """In training mode with jitter noise, the same seed gives the reference's loss and gradients: the router and the
    experts both see the jittered tokens, as Mixtral's do."""
    ref = mixtral(router_jitter_noise=0.2)
    ours = to_tfm(ref)
    input_ids, attention_mask, position_ids, labels = padded_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, labels=labels)
    ref.train(), ours.train()
    torch.manual_seed(3)
    expected = ref(**kwargs, output_router_logits=True)
    torch.manual_seed(3)
    actual = ours(**kwargs)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-6, rtol=0)
    expected.loss.backward(), actual.loss.backward()
    gate = ref.model.layers[0].mlp.experts.gate_up_proj.grad
    torch.testing.assert_close(ours.model.layers[0].mlp.experts.gate_up_proj.grad, gate, atol=1e-5, rtol=0)
    torch.manual_seed(4)  # the control: another draw, another loss
    assert (ours(**kwargs).loss - actual.loss).abs() > 1e-6


@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam3"])
def test_mixtral_generate_matches(num_beams):
    """Greedy and beam search on a left-padded batch give Mixtral's tokens."""
    ref = mixtral()
    ours = to_tfm(ref)
    input_ids, attention_mask, _, _ = padded_batch()
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        pad_token_id=PAD,
        do_sample=False,
        num_beams=num_beams,
        max_new_tokens=4,
    )
    assert torch.equal(ours.generate(**kwargs), ref.generate(**kwargs))


def test_mixtral_round_trip_restores_state_dict():
    """Mixtral -> hf_tfm -> Mixtral reproduces the original state dict exactly."""
    ref = mixtral()
    expected = ref.state_dict()
    assert_same_state_dict(from_tfm(to_tfm(ref), "mixtral").state_dict(), expected)


def mixtral_shaped(**overrides) -> TfmDecoderForCausalLM:
    """An hf_tfm model that is a Mixtral except for `overrides`."""
    fields = dict(
        position_embedding_type="rope",
        norm_type="rmsnorm",
        ffn_type="glu",
        attention_bias=False,
        mlp_bias=False,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        **MOE,
    )
    return tiny_model(**{**fields, **overrides})


INEXPRESSIBLE = [
    (partial(from_tfm, name="mixtral"), lambda: mixtral_shaped(num_experts=0), "num_experts"),
    (partial(from_tfm, name="mixtral"), lambda: mixtral_shaped(capacity_factor=1.25), "capacity_factor"),
    (partial(from_tfm, name="mixtral"), lambda: mixtral_shaped(scoring_func="sigmoid"), "scoring_func"),
    (
        partial(from_tfm, name="mixtral"),
        lambda: mixtral_shaped(shared_expert_intermediate_size=16),
        "shared_expert_intermediate_size",
    ),
    # not MoE fields, but silently wrong logits (not an error) if the converter lets them through
    (partial(from_tfm, name="mixtral"), lambda: mixtral_shaped(attention_multiplier=1.0), "attention_multiplier"),
    (partial(from_tfm, name="mixtral"), lambda: mixtral_shaped(scale_lm_head_input=True), "scale_lm_head_input"),
    (to_tfm, lambda: mixtral(sliding_window=4), "sliding_window"),
]


@pytest.mark.parametrize("convert, make_source, field", INEXPRESSIBLE, ids=[case[2] for case in INEXPRESSIBLE])
def test_mixtral_inexpressible_config_raises(convert, make_source, field):
    """A config the other side cannot express exactly raises ValueError naming that field (and no other of them)."""
    assert isinstance(from_tfm(mixtral_shaped(), "mixtral"), MixtralForCausalLM)  # the baseline itself converts
    with pytest.raises(ValueError, match=field) as error:
        convert(make_source())
    others = [name for _, _, name in INEXPRESSIBLE if name != field and f"{name}=" in str(error.value)]
    assert not others, str(error.value)


# ---------------------------------------------------------------------------------------------- experts backends


VARIANTS = {
    "softmax": {},
    "sigmoid": dict(scoring_func="sigmoid"),
    "softmax-shared-gated": dict(shared_expert_intermediate_size=16, shared_expert_gate=True),
    "sigmoid-shared": dict(scoring_func="sigmoid", shared_expert_intermediate_size=16),
    # Switch Transformer's experts: ungated, top-1, a capacity per sequence, its router losses
    "switch": dict(
        moe_ffn_type="mlp",
        hidden_act="relu",
        num_experts_per_tok=1,
        norm_topk_prob=False,
        expert_capacity=4,
        router_loss_style="switch",
        numerics=["router_in_float32", "router_scores_in_model_dtype"],
    ),
}


def forward_backward(model, experts: str):
    model.set_experts_implementation(experts)
    input_ids, attention_mask, position_ids, labels = padded_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, labels=labels)
    out.loss.backward()
    return out.logits.detach(), {name: param.grad for name, param in model.named_parameters()}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_experts_backends_agree(variant):
    """eager, batched_mm and grouped_mm give the same logits and the same gradient for every parameter on CPU."""
    base = moe_model(router_z_loss_coef=0.01, **VARIANTS[variant])
    expected_logits, expected_grads = forward_backward(copy.deepcopy(base), "eager")
    assert not [name for name, grad in expected_grads.items() if grad is None]
    for experts in BACKENDS[1:]:
        logits, grads = forward_backward(copy.deepcopy(base), experts)
        torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=0)
        for name, grad in expected_grads.items():
            torch.testing.assert_close(
                grads[name], grad, atol=1e-5, rtol=0, msg=lambda m, n=name, x=experts: f"{x} {n}: {m}"
            )


def test_set_experts_implementation_switches_code_path(monkeypatch):
    """Default grouped_mm (no silent eager fallback); set_experts_implementation(name) makes every layer run it."""
    mapping = ALL_EXPERTS_FUNCTIONS._global_mapping  # the class-wide dict every ExpertsInterface reads
    calls = []
    # "eager" is not registered: get_interface falls back to TfmExperts' own forward; registering a spy under that
    # key intercepts the eager path the same way
    implementations = {
        "eager": TfmExperts.forward.__wrapped__,
        "batched_mm": mapping["batched_mm"],
        "grouped_mm": mapping["grouped_mm"],
    }
    for name, function in implementations.items():

        def spy(*args, _name=name, _function=function, **kwargs):
            calls.append(_name)
            return _function(*args, **kwargs)

        monkeypatch.setitem(mapping, name, spy)

    model = moe_model()
    input_ids = padded_batch()[0]
    for requested in [None, "eager", "batched_mm", "grouped_mm", "eager"]:
        if requested is not None:
            model.set_experts_implementation(requested)
        expected = requested or "grouped_mm"
        assert model.config._experts_implementation == expected
        calls.clear()
        with torch.no_grad():
            model(input_ids)
        assert calls == [expected] * 2, (requested, calls)


def test_expert_widths_grouped_mm_cannot_run_default_to_eager_and_are_named_when_asked():
    """torch's grouped matmul needs 16-byte rows (widths a multiple of 8 in bf16). Experts 36 wide default to eager, as
    transformers falls back where grouped_mm cannot run, and train in bf16, where a Mixtral of that width fails
    ("strides should be multiple of 16 bytes"); asking for grouped_mm by name is refused, naming the field."""
    model = moe_model(moe_intermediate_size=36).to(torch.bfloat16).train()
    assert model.config._experts_implementation == "eager"
    input_ids, _, _, labels = padded_batch()
    model(input_ids=input_ids, labels=labels).loss.backward()
    with pytest.raises(
        ValueError, match=r"moe_intermediate_size=36 cannot run with experts_implementation='grouped_mm'"
    ):
        model.set_experts_implementation("grouped_mm")
    model.set_experts_implementation("batched_mm")
    model(input_ids=input_ids, labels=labels).loss.backward()
    assert moe_model(moe_intermediate_size=40).config._experts_implementation == "grouped_mm"
    config = MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=36, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    reference = MixtralForCausalLM(config).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="strides should be multiple of 16 bytes"):
        reference(input_ids=input_ids, labels=labels)


@pytest.mark.parametrize("experts", ["grouped_mm", "batched_mm"])
def test_experts_backend_is_a_class_level_answer(experts, tmp_path):
    """Every hf_tfm class answers transformers' class-level question (`_can_set_experts_implementation`, a classmethod,
    as transformers' own tests and exporters ask it) with yes: any config may have MoE layers. A dense model takes an
    experts backend as transformers' dense models do, a no-op; an MoE model loads and runs with any backend."""
    assert TfmDecoderForCausalLM._can_set_experts_implementation() is True
    dense, moe = tiny_model(), moe_model()
    dense.set_experts_implementation(experts)
    dense.save_pretrained(tmp_path / "dense")
    moe.save_pretrained(tmp_path / "moe")
    AutoModelForCausalLM.from_pretrained(tmp_path / "dense", experts_implementation=experts)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "moe", experts_implementation=experts)
    assert loaded.config._experts_implementation == experts
    with torch.no_grad():
        torch.testing.assert_close(loaded(torch.tensor([[3, 4, 5]])).logits, moe(torch.tensor([[3, 4, 5]])).logits)


# --------------------------------------------------------------------------------------------------- router losses

# 2 layers x 4 tokens x 4 experts, no ties within any token's top-2
HAND_LOGITS = (
    torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.5, 3.0, -2.0, 1.0], [-1.0, 0.0, 2.5, 1.5], [1.0, -0.5, 0.2, 2.0]]),
    torch.tensor([[0.0, 2.0, 1.0, -1.5], [3.0, -1.0, 0.5, 0.0], [1.2, 0.1, -0.3, 2.2], [-2.0, 1.0, 1.5, 0.3]]),
)


def hand_losses(layers, mask: list[int]) -> tuple[float, float]:
    """The Switch/Mixtral aux loss and ST-MoE z-loss in plain Python: aux = E * sum_e f_e * P_e with f_e the
    fraction of real tokens (over all layers) that have e among their top-k and P_e the mean router probability of
    e; z = the mean over real tokens of logsumexp(logits)^2, summed over layers."""
    counts, probs, rows, z_loss = [0.0] * E, [0.0] * E, 0, 0.0
    for layer in layers:
        squares = []
        for logits, real in zip(layer.tolist(), mask):
            if not real:
                continue
            total = sum(math.exp(x) for x in logits)
            p = [math.exp(x) / total for x in logits]
            for e in sorted(range(E), key=lambda e: -p[e])[:K]:
                counts[e] += 1
            probs = [acc + pe for acc, pe in zip(probs, p)]
            squares.append(math.log(total) ** 2)
            rows += 1
        z_loss += sum(squares) / len(squares)
    aux = E * sum((counts[e] / rows) * (probs[e] / rows) for e in range(E))
    return aux, z_loss


@pytest.mark.parametrize("mask", [None, [[0, 1], [1, 1]]], ids=["no-mask", "padded"])
def test_router_losses_hand_checked(mask):
    """router_losses gives the hand-computed load-balancing loss and z-loss; padding tokens count in neither."""
    model = moe_model()
    attention_mask = None if mask is None else torch.tensor(mask)
    flat = [1] * 4 if mask is None else [real for row in mask for real in row]
    aux, z_loss = router_loss_parts(model, HAND_LOGITS, attention_mask)
    expected_aux, expected_z = hand_losses(HAND_LOGITS, flat)
    assert float(aux) == pytest.approx(expected_aux, rel=1e-6)
    assert float(z_loss) == pytest.approx(expected_z, rel=1e-6)
    if mask is not None:  # rewrite the padded token's logits wildly: nothing changes
        changed = tuple(layer.clone() for layer in HAND_LOGITS)
        for layer in changed:
            layer[torch.tensor(flat) == 0] = torch.tensor([9.0, -7.0, 8.0, 30.0])
        changed_aux, changed_z = router_loss_parts(model, changed, attention_mask)
        assert float(changed_aux) == pytest.approx(expected_aux, rel=1e-6)
        assert float(changed_z) == pytest.approx(expected_z, rel=1e-6)
        unmasked_aux, _ = router_loss_parts(model, changed, None)
        assert abs(float(unmasked_aux) - expected_aux) > 1e-3  # the rewrite would matter if the token counted


def test_loss_adds_weighted_router_losses():
    """With labels, loss = causal-LM cross-entropy + router_aux_loss_coef * aux + router_z_loss_coef * z."""
    model = moe_model(router_aux_loss_coef=0.05, router_z_loss_coef=0.01)
    input_ids, attention_mask, position_ids, labels = padded_batch()
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, labels=labels)
        aux, z_loss = router_loss_parts(model, out.router_logits, attention_mask)
    ce = F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert 0.05 * aux > 1e-3 and 0.01 * z_loss > 1e-3  # both terms are visible at the tolerance below
    torch.testing.assert_close(out.aux_loss, aux, atol=0, rtol=0)
    torch.testing.assert_close(out.loss, ce + 0.05 * aux + 0.01 * z_loss, atol=1e-6, rtol=0)


def test_loss_with_num_items_in_batch_scales_router_terms():
    """Under num_items_in_batch=N: loss = CE_sum / N + (coef terms) * valid shifted targets / N (Trainer then does
    not divide by the accumulation steps)."""
    model = moe_model(router_aux_loss_coef=0.05, router_z_loss_coef=0.01)
    input_ids, attention_mask, position_ids, labels = padded_batch()
    targets = int((labels[:, 1:] != -100).sum())
    num_items = torch.tensor(37)
    assert targets != 37
    with torch.no_grad():
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            labels=labels,
            num_items_in_batch=num_items,
        )
        aux, z_loss = router_loss_parts(model, out.router_logits, attention_mask)
    ce_sum = F.cross_entropy(
        out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
    )
    expected = ce_sum / 37 + (0.05 * aux + 0.01 * z_loss) * targets / 37
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("how", ["argument", "config"])
def test_router_logits_only_when_asked(how):
    """No labels: router outputs only if output_router_logits asks; then one [tokens, E] per MoE layer + aux."""
    input_ids, attention_mask, _, _ = padded_batch()
    model = moe_model(num_hidden_layers=3, moe_layers=[0, 2])
    with torch.no_grad():
        plain = model(input_ids, attention_mask=attention_mask)
        assert plain.aux_loss is None and plain.router_logits is None and plain.loss is None
        if how == "config":
            model.config.output_router_logits = True
            out = model(input_ids, attention_mask=attention_mask)
        else:
            out = model(input_ids, attention_mask=attention_mask, output_router_logits=True)
        aux, _ = router_loss_parts(model, out.router_logits, attention_mask)
    assert out.loss is None
    assert len(out.router_logits) == 2
    assert all(logits.shape == (input_ids.numel(), E) for logits in out.router_logits)
    torch.testing.assert_close(out.aux_loss, aux, atol=0, rtol=0)
    torch.testing.assert_close(out.logits, plain.logits, atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------------ gradients


@pytest.mark.parametrize("experts", BACKENDS)
def test_every_routed_expert_gets_gradient(experts):
    """With every expert hit, each expert's gate_up/down slice and every router row get task-loss gradient."""
    model = moe_model(router_aux_loss_coef=0.0)
    model.set_experts_implementation(experts)
    records = record_routing(model)
    input_ids = torch.randint(3, VOCAB, (4, 12))
    model(input_ids, labels=input_ids).loss.backward()
    for (_, index), layer in zip(records, model.model.layers):
        assert set(index.flatten().tolist()) == set(range(E))  # precondition: every expert routed to
        for e in range(E):
            assert layer.mlp.experts.gate_up_proj.grad[e].abs().sum() > 0, e
            assert layer.mlp.experts.down_proj.grad[e].abs().sum() > 0, e
        assert (layer.mlp.router.weight.grad.abs().sum(dim=-1) > 0).all()


@pytest.mark.parametrize("experts", BACKENDS)
def test_unrouted_expert_gets_no_gradient(experts):
    """An expert that no token chooses (a very negative balancing bias) gets exactly zero gradient."""
    model = moe_model(router_aux_loss_coef=0.0, router_bias_update_rate=0.01)
    model.set_experts_implementation(experts)
    for router in routers(model):
        router.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, -10.0]))
    input_ids = torch.randint(3, VOCAB, (4, 12))
    model(input_ids, labels=input_ids).loss.backward()
    for layer in model.model.layers:
        experts_module = layer.mlp.experts
        assert torch.equal(experts_module.gate_up_proj.grad[3], torch.zeros_like(experts_module.gate_up_proj[3]))
        assert torch.equal(experts_module.down_proj.grad[3], torch.zeros_like(experts_module.down_proj[3]))
        assert experts_module.gate_up_proj.grad[:3].abs().sum(dim=(1, 2)).min() > 0


# ------------------------------------------------------------------------------------------------ layer selection


@pytest.mark.parametrize(
    "overrides, moe",
    [
        (dict(), [0, 1, 2, 3]),
        (dict(decoder_sparse_step=2), [1, 3]),
        (dict(decoder_sparse_step=3), [2]),
        (dict(mlp_only_layers=[0, 3]), [1, 2]),
        (dict(decoder_sparse_step=2, mlp_only_layers=[3]), [1]),
        (dict(moe_layers=[0, 2]), [0, 2]),
        (dict(moe_layers=[3], decoder_sparse_step=2, mlp_only_layers=[3]), [3]),  # moe_layers overrides both
        (dict(moe_layers=[]), []),
        (dict(num_experts=0), []),
    ],
    ids=lambda value: str(value) if isinstance(value, dict) else None,
)
def test_layer_selection(overrides, moe):
    """decoder_sparse_step, mlp_only_layers and moe_layers make exactly the expected layers MoE (4 layers)."""
    model = moe_model(num_hidden_layers=4, **overrides)
    kinds = [type(layer.mlp) for layer in model.model.layers]
    assert [kind is TfmMoE for kind in kinds] == [i in moe for i in range(4)]
    assert [i for i in range(4) if model.config.is_moe_layer(i)] == moe
    if moe:
        with torch.no_grad():
            assert len(model(padded_batch()[0], output_router_logits=True).router_logits) == len(moe)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(num_experts_per_tok=5), "num_experts_per_tok"),
        (dict(num_experts_per_tok=0), "num_experts_per_tok"),
        (dict(moe_layers=[2]), "moe_layers"),
        (dict(moe_layers=[-1]), "moe_layers"),
        (dict(mlp_only_layers=[5]), "mlp_only_layers"),
        (dict(capacity_factor=0.0), "capacity_factor"),
        (dict(capacity_factor=-1.0), "capacity_factor"),
        (dict(scoring_func="relu"), "scoring_func"),
        (dict(scoring_func="top_k_softmax", norm_topk_prob=False), "norm_topk_prob"),
        (dict(scoring_func="top_k_softmax", router_choice_bias=True), "router_choice_bias"),
        (dict(scoring_func="top_k_softmax", router_bias_update_rate=0.01), "router_bias_update_rate"),
        (dict(scoring_func="top_k_softmax", num_expert_groups=2), "num_expert_groups"),
        (dict(num_experts=-1), "num_experts"),
        (dict(decoder_sparse_step=0), "decoder_sparse_step"),
        (dict(router_aux_loss_coef=-0.1), "router_aux_loss_coef"),
        (dict(moe_ffn_type="swiglu"), "moe_ffn_type"),
        (dict(router_loss_style="gshard"), "router_loss_style"),
        (dict(expert_capacity=0), "expert_capacity"),
        (dict(expert_capacity=4, capacity_factor=1.0), "expert_capacity"),
        (dict(moe_ffn_type="mlp", swiglu_limit=7.0), "swiglu_limit"),
    ],
    ids=lambda value: str(value) if isinstance(value, dict) else None,
)
def test_invalid_moe_config_raises(overrides, field):
    """Every invalid MoE setting raises ValueError naming its field at construction time (2 layers, 4 experts)."""
    with pytest.raises(ValueError, match=f"`{field}`"):
        tiny_config(**{**MOE, **overrides})


# ------------------------------------------------------------------------------------------------------- capacity


def test_within_capacity_first_come_first_served():
    """Hand case: capacity ceil(1.0 * 4 * 2 / 4) = 2; first choices are served before second ones, in token order."""
    router = moe_model(capacity_factor=1.0).model.layers[0].mlp.router
    index = torch.tensor([[0, 1], [0, 1], [0, 2], [0, 1]])
    expected = torch.tensor([[True, True], [True, True], [False, True], [False, False]])
    assert torch.equal(router.within_capacity(index, sequences=2), expected)  # a factor counts the whole batch


def test_expert_capacity_is_counted_per_sequence():
    """Hand case: 2 sequences of 3 tokens, capacity 1 token per expert per sequence (Switch Transformer): each
    sequence serves its own first token of each expert, whatever the other sequence took."""
    router = moe_model(expert_capacity=1, num_experts_per_tok=1).model.layers[0].mlp.router
    index = torch.tensor([[0], [0], [1], [0], [1], [1]])
    expected = torch.tensor([[True], [False], [True], [True], [True], [False]])
    assert torch.equal(router.within_capacity(index, sequences=2), expected)


def test_small_capacity_drops_assignments():
    """capacity_factor 0.5: each expert keeps min(load, ceil(cf*T*k/E)) assignments; output differs from dropless."""
    dropless = moe_model()
    capped = TfmDecoderForCausalLM(tiny_config(**MOE, capacity_factor=0.5)).eval()
    capped.load_state_dict(dropless.state_dict())
    input_ids = torch.randint(3, VOCAB, (1, 12))
    capacity = math.ceil(0.5 * 12 * K / E)  # 3
    records = record_routing(capped)
    with torch.no_grad():
        capped_logits = capped(input_ids).logits
        dropless_logits = dropless(input_ids).logits
    assert len(records) == 2
    for weights, index in records:
        for e in range(E):
            load = int((index == e).sum())
            kept = int(((index == e) & (weights > 0)).sum())
            assert kept == min(load, capacity), (e, load, kept)
    assert (capped_logits - dropless_logits).abs().max() > 100 * ATOL


def test_large_capacity_is_dropless():
    """With capacity_factor 4.0 no assignment overflows: the output equals the dropless model's exactly."""
    dropless = moe_model()
    roomy = TfmDecoderForCausalLM(tiny_config(**MOE, capacity_factor=4.0)).eval()
    roomy.load_state_dict(dropless.state_dict())
    input_ids = torch.randint(3, VOCAB, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(roomy(input_ids).logits, dropless(input_ids).logits, atol=0, rtol=0)


# --------------------------------------------------------------------------------- auxiliary-loss-free balancing


def test_router_bias_update_follows_load():
    """Train forwards count tokens_per_expert; update_router_biases adds -rate*sign(load - mean) and resets counts."""
    rate = 0.1
    model = moe_model(router_bias_update_rate=rate)  # perturb gives the biases non-zero starting values
    input_ids = torch.randint(3, VOCAB, (2, 12))
    with torch.no_grad():
        model(input_ids)
    assert all(router.tokens_per_expert.sum() == 0 for router in routers(model))
    model.train()
    records = record_routing(model)
    with torch.no_grad():
        model(input_ids)
        model(input_ids[:, :7])
    before = [router.expert_bias.clone() for router in routers(model)]
    for i, router in enumerate(routers(model)):
        counted = sum(torch.bincount(index.flatten(), minlength=E) for _, index in records[i::2])
        assert torch.equal(router.tokens_per_expert, counted.float())
        assert router.tokens_per_expert.sum() == (24 + 14) * K
    loads = [router.tokens_per_expert.clone() for router in routers(model)]
    assert any(len(set(load.tolist())) > 1 for load in loads)  # unbalanced, so the update is not vacuous
    model.update_router_biases()
    for router, old, load in zip(routers(model), before, loads):
        torch.testing.assert_close(router.expert_bias, old - rate * torch.sign(load - load.mean()), atol=1e-7, rtol=0)
        assert torch.equal(router.tokens_per_expert, torch.zeros(E))
    after = [router.expert_bias.clone() for router in routers(model)]
    model.update_router_biases()  # nothing routed since: biases stay
    assert all(torch.equal(router.expert_bias, bias) for router, bias in zip(routers(model), after))


@pytest.mark.parametrize("scoring_func", ["softmax", "sigmoid"])
def test_expert_bias_chooses_but_does_not_weight(scoring_func):
    """The balancing bias decides which experts are chosen, but their weights come from the unbiased scores."""
    router = moe_model(router_bias_update_rate=0.01, scoring_func=scoring_func).model.layers[0].mlp.router
    hidden = torch.randn(12, 32)
    with torch.no_grad():
        router.expert_bias.zero_()
        _, _, unbiased_index = router(hidden)
        router.expert_bias.copy_(torch.tensor([5.0, 0.0, 0.0, 5.0]))  # scores are in [0, 1]: 5 always wins
        logits, weights, index = router(hidden)
    assert torch.equal(index.sort(dim=-1).values, torch.tensor([[0, 3]] * 12))
    assert not torch.equal(unbiased_index.sort(dim=-1).values, index.sort(dim=-1).values)  # the bias changed choices
    scores = torch.softmax(logits, dim=-1) if scoring_func == "softmax" else torch.sigmoid(logits)
    chosen = scores.gather(-1, index)
    torch.testing.assert_close(weights, chosen / chosen.sum(dim=-1, keepdim=True), atol=1e-6, rtol=0)


def test_expert_bias_saved_and_reloaded(tmp_path):
    """expert_bias is saved (tokens_per_expert is not) and reloaded: identical logits, load counting from zero."""
    model = moe_model(router_bias_update_rate=0.01)
    for i, router in enumerate(routers(model)):
        router.expert_bias.copy_(torch.tensor([0.3, -0.2, 0.1, -0.4]) * (i + 1))
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert sum(key.endswith("router.expert_bias") for key in saved) == 2
    assert not any("tokens_per_expert" in key for key in saved)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert_same_state_dict(loaded.state_dict(), model.state_dict())  # expert_bias included
    loaded = realigned(loaded)
    input_ids = torch.randint(3, VOCAB, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids).logits, model(input_ids).logits, atol=0, rtol=0)
        loaded.train()(input_ids)
    assert all(router.tokens_per_expert.sum() == 24 * K for router in routers(loaded))


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_norm_topk_prob(norm_topk_prob):
    """norm_topk_prob=True: the top-k weights sum to 1; False: they are the raw softmax probabilities."""
    model = moe_model(norm_topk_prob=norm_topk_prob)
    router = model.model.layers[0].mlp.router
    with torch.no_grad():
        logits, weights, index = router(torch.randn(12, 32))
    probabilities = torch.softmax(logits, dim=-1)
    assert torch.equal(index, probabilities.topk(K, dim=-1).indices)
    if norm_topk_prob:
        torch.testing.assert_close(weights.sum(dim=-1), torch.ones(12), atol=1e-6, rtol=0)
    else:
        torch.testing.assert_close(weights, probabilities.gather(-1, index), atol=0, rtol=0)
        assert (weights.sum(dim=-1) < 1 - 1e-3).all()
    other = TfmDecoderForCausalLM(tiny_config(**MOE, norm_topk_prob=not norm_topk_prob)).eval()
    other.load_state_dict(model.state_dict())
    input_ids = torch.randint(3, VOCAB, (1, 8))
    with torch.no_grad():  # the flag reaches the layers
        assert (model(input_ids).logits - other(input_ids).logits).abs().max() > 100 * ATOL


def test_top_k_softmax_weights_are_the_renormalised_softmax():
    """GPT-OSS's scoring (the k best logits, a softmax over them) picks the experts and gives the weights that
    softmax scoring with norm_topk_prob does, to float32 rounding, and the model's outputs agree; bf16 exactness
    against GPT-OSS itself is tests/test_bf16_parity.py's."""
    model = moe_model()
    other = TfmDecoderForCausalLM(tiny_config(**MOE, scoring_func="top_k_softmax")).eval()
    other.load_state_dict(model.state_dict())
    hidden = torch.randn(12, 32)
    with torch.no_grad():
        _, weights, index = model.model.layers[0].mlp.router(hidden)
        _, top_k_weights, top_k_index = other.model.layers[0].mlp.router(hidden)
    assert torch.equal(top_k_index, index)
    torch.testing.assert_close(top_k_weights, weights, atol=1e-6, rtol=0)
    input_ids = torch.randint(3, VOCAB, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(other(input_ids).logits, model.eval()(input_ids).logits, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------ other paradigms

ROUTER_COEFS = dict(router_aux_loss_coef=0.05, router_z_loss_coef=0.01)


def moe_encoder() -> TfmEncoderForMaskedLM:
    torch.manual_seed(0)
    return perturb(TfmEncoderForMaskedLM(tiny_config(TfmEncoderConfig, **MOE, **ROUTER_COEFS)))


def moe_seq2seq() -> TfmEncoderDecoderForConditionalGeneration:
    """2 encoder and 3 decoder layers, every second one MoE; a wide init so that greedy decoding varies."""
    torch.manual_seed(0)
    config = tiny_config(
        TfmEncoderDecoderConfig,
        **MOE,
        **ROUTER_COEFS,
        decoder_layers=3,
        decoder_sparse_step=2,
        initializer_range=0.5,
        decoder_start_token_id=1,
    )
    return TfmEncoderDecoderForConditionalGeneration(config).eval()


PARADIGMS = {
    "encoder": (moe_encoder, AutoModelForMaskedLM),
    "encoder-decoder": (moe_seq2seq, AutoModelForSeq2SeqLM),
}


def paradigm_inputs(name: str) -> tuple[dict, torch.Tensor]:
    """Inputs (a left-padded source) and labels: masked-LM labels for the encoder; for the encoder-decoder, decoder
    targets (the decoder input is the labels shifted right), the second row's tail ignored."""
    input_ids, attention_mask, _, labels = padded_batch()
    if name == "encoder-decoder":
        torch.manual_seed(4)
        labels = torch.randint(3, VOCAB, (2, 5))
        labels[1, 3:] = -100
    return dict(input_ids=input_ids, attention_mask=attention_mask), labels


@pytest.mark.parametrize("name", sorted(PARADIGMS))
def test_other_paradigms_train_and_reload(name, tmp_path):
    """MoE encoder / encoder-decoder: backward reaches every expert; Auto reload gives same logits and greedy
    tokens."""
    make, auto_class = PARADIGMS[name]
    model = make()
    moe_layers = [module for module in model.modules() if isinstance(module, TfmMoE)]
    assert len(moe_layers) == 2  # encoder: both layers; encoder-decoder: encoder layer 1 and decoder layer 1
    inputs, labels = paradigm_inputs(name)
    model(**inputs, labels=labels).loss.backward()
    for layer in moe_layers:
        for param in (layer.experts.gate_up_proj, layer.experts.down_proj, layer.router.weight):
            assert param.grad is not None and torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0

    model.save_pretrained(tmp_path)
    loaded = auto_class.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    assert_same_state_dict(loaded.state_dict(), model.state_dict())
    loaded = realigned(loaded)
    if name == "encoder-decoder":
        inputs["labels"] = labels  # gives the decoder its (shifted) input
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, atol=0, rtol=0)
    if name == "encoder-decoder":
        del inputs["labels"]
        greedy = dict(**inputs, do_sample=False, max_new_tokens=6, min_new_tokens=6)
        tokens = model.generate(**greedy)
        assert len(set(tokens[:, 1:].flatten().tolist())) > 2  # not a degenerate repetition
        assert torch.equal(loaded.generate(**greedy), tokens)


def expected_loss(model, task: torch.Tensor, stacks, labels: torch.Tensor, num_items) -> torch.Tensor:
    """task loss (mean, or sum / num_items) + for each stack (router logits, mask): (aux and z terms), scaled by
    the batch's share of targets under num_items."""
    loss = task if num_items is None else task / num_items
    for router_logits, mask in stacks:
        aux, z_loss = router_loss_parts(model, router_logits, mask)
        extra = model.config.router_aux_loss_coef * aux + model.config.router_z_loss_coef * z_loss
        loss = loss + (extra if num_items is None else extra * (labels != -100).sum() / num_items)
    return loss


@pytest.mark.parametrize("num_items", [None, 23], ids=["mean", "num_items_in_batch"])
@pytest.mark.parametrize("name", sorted(PARADIGMS))
def test_other_paradigms_loss_formula(name, num_items):
    """Encoder and encoder-decoder losses add each MoE stack's weighted aux + z losses, scaled under num_items."""
    model = PARADIGMS[name][0]()
    inputs, labels = paradigm_inputs(name)
    kwargs = {} if num_items is None else dict(num_items_in_batch=torch.tensor(num_items))
    reduction = "mean" if num_items is None else "sum"
    with torch.no_grad():
        out = model(**inputs, labels=labels, **kwargs)
        if name == "encoder":
            body = model.model(**inputs, output_router_logits=True)
            stacks = [(body.router_logits, inputs["attention_mask"])]
        else:
            stacks = [(out.encoder_router_logits, inputs["attention_mask"]), (out.decoder_router_logits, None)]
            assert len(out.encoder_router_logits) == len(out.decoder_router_logits) == 1
            torch.testing.assert_close(out.encoder_aux_loss, router_loss_parts(model, *stacks[0])[0], atol=0, rtol=0)
            torch.testing.assert_close(out.decoder_aux_loss, router_loss_parts(model, *stacks[1])[0], atol=0, rtol=0)
    task = F.cross_entropy(out.logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction=reduction)
    expected = expected_loss(model, task, stacks, labels, num_items)
    assert (expected - (task if num_items is None else task / num_items)).abs() > 1e-2  # the router terms show
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=0)


HEADS = {
    "decoder-causal-lm": (TfmDecoderForCausalLM, TfmDecoderConfig, {}),
    "decoder-sequence-classification": (TfmDecoderForSequenceClassification, TfmDecoderConfig, {}),
    "encoder-masked-lm": (TfmEncoderForMaskedLM, TfmEncoderConfig, {}),
    "encoder-token-classification": (TfmEncoderForTokenClassification, TfmEncoderConfig, {}),
    "encoder-sequence-classification": (TfmEncoderForSequenceClassification, TfmEncoderConfig, {}),
    "encoder-question-answering": (TfmEncoderForQuestionAnswering, TfmEncoderConfig, {}),
    "encoder-decoder": (
        TfmEncoderDecoderForConditionalGeneration,
        TfmEncoderDecoderConfig,
        dict(decoder_start_token_id=1),
    ),
}


def head_targets(name: str, input_ids: torch.Tensor) -> dict:
    if name in ("decoder-causal-lm", "encoder-masked-lm"):
        return dict(labels=input_ids.masked_fill(input_ids == PAD, -100))
    if name == "encoder-token-classification":
        return dict(labels=torch.randint(0, 3, input_ids.shape).masked_fill(input_ids == PAD, -100))
    if name.endswith("sequence-classification"):
        return dict(labels=torch.tensor([0, 2]))
    if name == "encoder-question-answering":
        return dict(start_positions=torch.tensor([3, 5]), end_positions=torch.tensor([4, 7]))
    return dict(labels=torch.randint(3, VOCAB, (2, 5)))


@pytest.mark.parametrize("name", sorted(HEADS))
def test_every_head_adds_router_losses(name):
    """Every head's loss includes the weighted router losses (larger with router coefs > 0 than with both 0), and
    the head reports the aux loss and the router logits separately."""
    model_class, config_class, overrides = HEADS[name]
    torch.manual_seed(0)
    model = perturb(model_class(tiny_config(config_class, **MOE, **ROUTER_COEFS, num_labels=3, **overrides)))
    input_ids, attention_mask, _, _ = padded_batch()
    targets = head_targets(name, input_ids)
    with torch.no_grad():
        output = model(input_ids, attention_mask=attention_mask, **targets)
        with_router = output.loss
        if name == "encoder-decoder":
            reported = [
                output.encoder_aux_loss,
                output.decoder_aux_loss,
                output.encoder_router_logits,
                output.decoder_router_logits,
            ]
        else:
            reported = [output.aux_loss, output.router_logits]
        assert all(value is not None for value in reported)
        model.config.router_aux_loss_coef = model.config.router_z_loss_coef = 0.0
        task_only = model(input_ids, attention_mask=attention_mask, **targets).loss
    assert with_router - task_only > 1e-2, (float(with_router), float(task_only))


HEADS_AND_BODIES = {
    **HEADS,
    "decoder-model": (TfmDecoderModel, TfmDecoderConfig, {}),
    "encoder-model": (TfmEncoderModel, TfmEncoderConfig, {}),
    "encoder-decoder-model": (TfmEncoderDecoderModel, TfmEncoderDecoderConfig, {}),
}


@pytest.mark.parametrize("moe", [True, False], ids=["moe", "dense"])
@pytest.mark.parametrize("name", sorted(HEADS_AND_BODIES))
def test_every_class_accepts_output_router_logits(name, moe):
    """output_router_logits=True without labels: an MoE model reports each MoE layer's router logits and the aux
    loss, a dense model none, for every head and body (the heads once passed the argument twice: a TypeError)."""
    model_class, config_class, overrides = HEADS_AND_BODIES[name]
    experts = MOE if moe else {}
    torch.manual_seed(0)
    model = model_class(tiny_config(config_class, **experts, num_labels=3, **overrides)).eval()
    input_ids, attention_mask, _, _ = padded_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    if name.startswith("encoder-decoder"):
        inputs["decoder_input_ids"] = torch.randint(3, VOCAB, (2, 5))
    with torch.no_grad():
        output = model(**inputs, output_router_logits=True)
    fields = (
        ["encoder_router_logits", "decoder_router_logits"] if name.startswith("encoder-decoder") else ["router_logits"]
    )
    router_logits = [getattr(output, field, None) for field in fields]
    if not moe:  # a dense head answers with transformers' output class, without router fields; a body () or None
        assert not any(router_logits)
        return
    assert all(len(layers) == 2 and layers[0].shape[-1] == E for layers in router_logits)
    if name == "encoder-decoder":
        assert output.encoder_aux_loss is not None and output.decoder_aux_loss is not None
    elif not name.endswith("model"):  # bodies report router logits only; heads add the aux loss
        assert output.aux_loss is not None


# --------------------------------------------------------------------------------------------------- remote code


@pytest.mark.slow
def test_trust_remote_code_moe_without_package(tmp_path):
    """A saved MoE decoder loads without hf_tfm (remote code): exact logits under eager and a live grouped_mm."""
    model = moe_model(shared_expert_intermediate_size=16, shared_expert_gate=True, router_bias_update_rate=0.01)
    model.save_pretrained(tmp_path / "moe")
    input_ids, attention_mask, _, _ = padded_batch()
    expected = {}
    for experts in ("eager", "grouped_mm"):
        model.set_experts_implementation(experts)
        with torch.no_grad():
            expected[experts] = model(input_ids, attention_mask=attention_mask).logits
    torch.save({"expected": expected, "input": input_ids, "mask": attention_mask}, tmp_path / "expected.pt")
    result = run_without_hf_tfm(
        """
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        calls = []
        grouped = ALL_EXPERTS_FUNCTIONS["grouped_mm"]
        def spy(*args, **kwargs):
            calls.append(1)
            return grouped(*args, **kwargs)
        ALL_EXPERTS_FUNCTIONS.register("grouped_mm", spy)
        data = torch.load("expected.pt")
        for experts, want in data["expected"].items():
            model = AutoModelForCausalLM.from_pretrained("moe", trust_remote_code=True, experts_implementation=experts)
            model = model.eval()
            with torch.no_grad():  # fresh aligned memory instead of the memory-mapped file (see `realigned`)
                for tensor in [*model.parameters(), *model.buffers()]:
                    tensor.data = tensor.data.clone()
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            assert model.config._experts_implementation == experts, model.config._experts_implementation
            calls.clear()
            with torch.no_grad():
                logits = model(data["input"], attention_mask=data["mask"]).logits
            assert len(calls) == (2 if experts == "grouped_mm" else 0), (experts, calls)
            torch.testing.assert_close(logits, want, rtol=0, atol=0)
        print("loaded", len(data["expected"]))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "loaded 2" in result.stdout


# ------------------------------------------------------------------------------------------ gradient accumulation


def test_gradient_accumulation_moe(tmp_path):
    """Trainer accumulation 2 x 4 matches batch 8 x 1 for an MoE decoder (loss rel 1e-3, parameters atol 1e-4)."""
    # Not exact: each micro-batch computes the aux loss (a product of two batch means, so nonlinear) on its own
    # tokens, weighted by its share of the targets. Measured on this data after one SGD step of lr 0.5 (largest
    # parameter difference / relative loss difference), aux coef with z coef 0: 0 -> 6e-8 / 0 (exact);
    # 0.001 -> 2.1e-5 / 6e-6; 0.01 -> 2.1e-4 / 6e-5; 0.05 -> 1.0e-3 / 3e-4; with z coef 0.001: 0.02 (Mixtral's) ->
    # 4.2e-4 / 1.2e-4 and this test's 0.001 -> 5.7e-5 / 9e-6. The z-loss alone (0.001) gives 5e-5: it is linear, but
    # averaged over each micro-batch's tokens while weighted by its targets. Without the num_items_in_batch scaling
    # of the router terms this test fails (3.6e-3 / 4.5e-3).
    torch.manual_seed(0)
    rows = []
    for valid in [6, 5, 2, 6, 4, 3, 6, 2]:  # micro-batches of 2 hold different target counts
        ids = torch.randint(3, VOCAB, (6,))
        labels = ids.clone()
        labels[valid:] = -100
        rows.append({"input_ids": ids, "labels": labels})
    data = ListDataset(rows)

    # hf_tfm's default router_aux_loss_coef (0.001); the tolerances above do not hold from about 0.005 up
    def make():
        return moe_model(seed=1, router_aux_loss_coef=0.001, router_z_loss_coef=0.001)

    accumulated, accumulated_loss = accumulation_run(tmp_path, data, 2, 4, make_model=make)
    full, full_loss = accumulation_run(tmp_path, data, 8, 1, make_model=make)
    start = make()
    moved = False
    for (name, p_acc), p_full, p_start in zip(accumulated.named_parameters(), full.parameters(), start.parameters()):
        torch.testing.assert_close(p_acc, p_full, rtol=0, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
        moved |= not torch.allclose(p_full, p_start, atol=1e-3)
    assert moved, "the optimizer step should change the parameters"
    assert len(accumulated_loss) == len(full_loss) == 1
    assert accumulated_loss[0] == pytest.approx(full_loss[0], rel=1e-3)
