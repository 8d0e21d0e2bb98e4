"""The one head pattern: the decoder's token-classification and question-answering heads (exact against Llama's,
plus hf_tfm's router losses and zero loss without targets), and what every head shares: the MoE output classes and
the task-layer names the saving code knows. Tiny shapes, fp32, CPU."""

import ast
import dataclasses
import inspect
import pickle
import textwrap

import pytest
import torch
import transformers
from conftest import VOCAB, assert_same_state_dict, perturb, tiny_config
from support.minilm import minilm_dir
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForQuestionAnswering,
    LlamaForTokenClassification,
    pipeline,
)
from transformers.modeling_outputs import (
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.utils import find_labels

import hf_tfm
from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForCausalLM,
    TfmDecoderForQuestionAnswering,
    TfmDecoderForTokenClassification,
    TfmDecoderModel,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
)
from hf_tfm.convert import config_to_tfm, weights_to_tfm
from hf_tfm.convert.common import load_exact
from hf_tfm.convert.families import FAMILIES
from hf_tfm.model import modeling_tfm as modeling
from hf_tfm.model.modeling_tfm_loading import AUTO_CLASSES, HEAD_MODULES
from hf_tfm.model.modeling_tfm_moe import load_balancing_loss, router_z_loss

PAD = 0
LABELS = 3
E = 4
MOE = dict(num_experts=E, num_experts_per_tok=2, router_aux_loss_coef=0.05, router_z_loss_coef=0.01)
HEADS = {
    "token-classification": (TfmDecoderForTokenClassification, LlamaForTokenClassification),
    "question-answering": (TfmDecoderForQuestionAnswering, LlamaForQuestionAnswering),
}


def router_loss_parts(model, router_logits, attention_mask):
    """(the load-balancing loss, the z-loss) of `router_logits`, as the model's heads compute them."""
    config = model.config
    aux = load_balancing_loss(router_logits, config.num_experts, config.num_experts_per_tok, attention_mask)
    return aux, router_z_loss(router_logits, attention_mask)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 8, the second right-padded by 3."""
    torch.manual_seed(2)
    input_ids = torch.randint(3, VOCAB, (2, 8))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    return input_ids.masked_fill(attention_mask == 0, PAD), attention_mask


def targets(name: str, input_ids: torch.Tensor) -> dict:
    if name == "token-classification":
        torch.manual_seed(3)
        return dict(labels=torch.randint(0, LABELS, input_ids.shape).masked_fill(input_ids == PAD, -100))
    return dict(start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([3, 4]))


def no_targets(name: str, input_ids: torch.Tensor) -> dict:
    """Nothing to score: every label ignored, or every answer position beyond the input."""
    if name == "token-classification":
        return dict(labels=torch.full_like(input_ids, -100))
    length = input_ids.shape[1]
    return dict(start_positions=torch.tensor([length, length + 3]), end_positions=torch.tensor([length, length]))


def head(name: str, **overrides):
    torch.manual_seed(0)
    return perturb(HEADS[name][0](tiny_config(num_labels=LABELS, **overrides)))


def outputs_of(name: str, output) -> list[torch.Tensor]:
    return [output.logits] if name == "token-classification" else [output.start_logits, output.end_logits]


# -------------------------------------------------------------------------------------------------- Llama parity


@pytest.mark.parametrize("name", sorted(HEADS))
def test_matches_llama_head(name):
    """Llama's head with its weights converted gives the same logits and loss (Llama's QA keeps its body under
    `transformer`; hf_tfm's under `model`, as in every head)."""
    ours_class, llama_class = HEADS[name]
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        num_labels=LABELS,
    )
    torch.manual_seed(0)
    llama = perturb(llama_class(config))
    tfm_config = config_to_tfm(config)
    tfm_config.num_labels = LABELS
    ours = ours_class(tfm_config)
    source = {key.replace("transformer.", "model."): value for key, value in llama.state_dict().items()}
    ours = load_exact(ours, weights_to_tfm(FAMILIES["llama"].weights, source, ours))
    assert type(getattr(ours, ours.task_layer)) is type(getattr(llama, ours.task_layer))  # same name, same layer
    input_ids, attention_mask = batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, **targets(name, input_ids))
    with torch.no_grad():
        expected, actual = llama(**inputs), ours(**inputs)
    for want, got in zip(outputs_of(name, expected), outputs_of(name, actual), strict=True):
        assert got.shape == ((2, 8, LABELS) if name == "token-classification" else (2, 8))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=0)
    # a dense model answers with Llama's own output class: no router fields
    assert type(actual) is type(expected) and not hasattr(actual, "aux_loss")


def test_trainer_finds_the_label_names():
    assert find_labels(TfmDecoderForTokenClassification) == ["labels"]
    assert find_labels(TfmDecoderForQuestionAnswering) == ["start_positions", "end_positions"]


def test_token_classification_loss_is_exact_under_gradient_accumulation():
    """Under Trainer's num_items_in_batch (the scored tokens of all micro-batches), the micro-batch losses sum to
    the full batch's mean loss: the token head passes it on (transformers' generic token head drops it)."""
    model = head("token-classification")
    input_ids, attention_mask = batch()
    labels = targets("token-classification", input_ids)["labels"]
    num_items = (labels != -100).sum()
    with torch.no_grad():
        full = model(input_ids, attention_mask=attention_mask, labels=labels).loss
        parts = [
            model(
                input_ids[row : row + 1],
                attention_mask=attention_mask[row : row + 1],
                labels=labels[row : row + 1],
                num_items_in_batch=num_items,
            ).loss
            for row in range(2)
        ]
    torch.testing.assert_close(sum(parts), full, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------- MoE and losses


@pytest.mark.parametrize("name", sorted(HEADS))
def test_moe_loss_adds_weighted_router_losses(name):
    """An MoE head's loss is the task loss + aux and z losses weighted by their coefficients, and the head reports
    the aux loss and each MoE layer's router logits."""
    model = head(name, **MOE)
    input_ids, attention_mask = batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, **targets(name, input_ids))
    with torch.no_grad():
        output = model(**inputs)
        aux, z_loss = router_loss_parts(model, output.router_logits, attention_mask)
        model.config.router_aux_loss_coef = model.config.router_z_loss_coef = 0.0
        task_only = model(**inputs).loss
    assert len(output.router_logits) == 2 and output.router_logits[0].shape == (input_ids.numel(), E)
    torch.testing.assert_close(output.aux_loss, aux, atol=0, rtol=0)
    assert 0.05 * aux + 0.01 * z_loss > 1e-2  # the router terms show
    torch.testing.assert_close(output.loss, task_only + 0.05 * aux + 0.01 * z_loss, atol=1e-6, rtol=0)
    with torch.no_grad():  # without targets: router outputs only when asked
        assert model(input_ids, attention_mask=attention_mask).router_logits is None
        asked = model(input_ids, attention_mask=attention_mask, output_router_logits=True)
    assert len(asked.router_logits) == 2 and asked.aux_loss is not None and asked.loss is None


@pytest.mark.parametrize("num_items_in_batch", [None, 0], ids=["mean", "num-items-0"])
@pytest.mark.parametrize("name", sorted(HEADS))
def test_no_targets_give_zero_loss_and_zero_gradients(name, num_items_in_batch):
    """Nothing to score gives loss 0 (transformers' loss is NaN there) whose backward gives zero gradients."""
    model = head(name).train()
    input_ids, attention_mask = batch()
    kwargs = {} if num_items_in_batch is None else dict(num_items_in_batch=torch.tensor(num_items_in_batch))
    loss = model(input_ids, attention_mask=attention_mask, **no_targets(name, input_ids), **kwargs).loss
    assert loss.item() == 0.0
    loss.backward()
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    assert grads and all(torch.equal(grad, torch.zeros_like(grad)) for grad in grads)


def test_token_labels_must_match_the_input():
    input_ids, attention_mask = batch()
    with pytest.raises(ValueError, match="labels have shape"):
        head("token-classification")(input_ids, labels=torch.zeros(2, 7, dtype=torch.long))


# ------------------------------------------------------------------------------------------ Auto classes, saving

AUTO = {
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_auto_class_builds_saves_and_reloads(name, tmp_path):
    """The Auto class builds the decoder head from a TfmDecoderConfig; save and Auto reload give the same weights
    and outputs; config.json's auto_map names the head."""
    auto_class = getattr(transformers, AUTO[name])
    torch.manual_seed(0)
    model = perturb(auto_class.from_config(tiny_config(num_labels=LABELS)))
    assert type(model) is HEADS[name][0]
    model.save_pretrained(tmp_path)
    assert model.config.auto_map[AUTO[name]] == f"modeling_tfm.{HEADS[name][0].__name__}"
    loaded = auto_class.from_pretrained(tmp_path).eval()
    assert type(loaded) is HEADS[name][0]
    assert_same_state_dict(loaded.state_dict(), model.state_dict())
    input_ids, attention_mask = batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    with torch.no_grad():
        expected, actual = model(**inputs), loaded(**inputs)
    for want, got in zip(outputs_of(name, expected), outputs_of(name, actual), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_causal_lm_checkpoint_fine_tunes_into_the_head(name, tmp_path):
    """A causal LM's save loads into the new head (body weights kept, the task layer new), and the head's save
    loads into the bare body (its task layer left over): neither is a weight mismatch."""
    torch.manual_seed(0)
    TfmDecoderForCausalLM(tiny_config()).save_pretrained(tmp_path / "lm")
    model = getattr(transformers, AUTO[name]).from_pretrained(tmp_path / "lm", num_labels=LABELS)
    lm = AutoModelForCausalLM.from_pretrained(tmp_path / "lm")
    assert_same_state_dict(model.model.state_dict(), lm.model.state_dict())
    model.save_pretrained(tmp_path / "head")
    body = AutoModel.from_pretrained(tmp_path / "head")
    assert type(body) is TfmDecoderModel
    assert_same_state_dict(body.state_dict(), model.model.state_dict())


def test_token_classification_pipeline(tmp_path):
    """transformers' token-classification pipeline runs on the decoder head (as on LlamaForTokenClassification)."""
    # a decoder has no token types: the tokenizer leaves them out, as Llama's does
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir(), model_input_names=["input_ids", "attention_mask"])
    names = ["O", "B-PER", "I-PER"]
    config = tiny_config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        id2label=dict(enumerate(names)),
        label2id={label: i for i, label in enumerate(names)},
    )
    TfmDecoderForTokenClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    tags = pipeline("token-classification", model=str(tmp_path), ignore_labels=[])("Ada Lovelace wrote code")
    assert [tag["word"] for tag in tags] == tokenizer.tokenize("Ada Lovelace wrote code")
    assert {tag["entity"] for tag in tags} <= set(names)


# ------------------------------------------------------------------------------------------- what heads share

CONFIGS = {TfmDecoderConfig: {}, TfmEncoderConfig: {}, TfmEncoderDecoderConfig: dict(decoder_start_token_id=1)}
ALL_HEADS = [
    pytest.param(getattr(hf_tfm, name), config_class, id=name)
    for config_class in CONFIGS
    for name in AUTO_CLASSES[config_class.model_type].values()
    if issubclass(getattr(hf_tfm, name), modeling.TfmHead)
]


@pytest.mark.parametrize("model_class, config_class", ALL_HEADS)
def test_every_head_adds_one_named_task_layer(model_class, config_class):
    """A head's weights are its body's (`model`) and its task layer's, under the name it declares, which the saving
    code knows (a checkpoint from that head loads into the bare body)."""
    model = model_class(tiny_config(config_class, num_labels=LABELS, **CONFIGS[config_class]))
    assert {key.split(".")[0] for key in model.state_dict()} == {"model", model_class.task_layer}
    assert model_class.task_layer in HEAD_MODULES


# a head's own arguments: what its task layer reads, not the body
HEAD_ARGUMENTS = {"self", "labels", "start_positions", "end_positions", "logits_to_keep", "kwargs"}


@pytest.mark.parametrize("model_class, config_class", ALL_HEADS)
def test_every_head_hands_its_arguments_to_the_body_by_name(model_class, config_class):
    """A head's forward keeps its task's signature and hands everything to the one head body (`TfmHead.run`): the
    body's arguments written out by name (`attention_mask=attention_mask`) in one `dict(...)`, which `run` passes to
    the body (`self.model(**inputs, ...)`), so a reader or a tool follows an argument from the head to the attention;
    the head's own targets by name too; and **kwargs."""
    forward = inspect.unwrap(model_class.forward)
    tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) == "self.run"]
    assert len(calls) == 1, f"{model_class.__name__}.forward should hand over to self.run once"
    packed = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) == "dict"]
    assert len(packed) == 1
    passed = {keyword.arg: ast.unparse(keyword.value) for keyword in packed[0].keywords}
    body_arguments = set(inspect.signature(forward).parameters) - HEAD_ARGUMENTS
    assert body_arguments == set(passed), f"not handed to the body: {sorted(body_arguments - set(passed))}"
    assert all(passed[name] == name for name in body_arguments if name != "use_cache")  # labels decide use_cache
    targets = ast.unparse(calls[0].args[1])
    assert all(
        f"'{name}': {name}" in targets
        for name in HEAD_ARGUMENTS & set(inspect.signature(forward).parameters) - {"self", "kwargs", "logits_to_keep"}
    )
    assert any(keyword.arg is None for keyword in calls[0].keywords)  # and **kwargs
    run_source = inspect.getsource(modeling.TfmHead.run)
    assert "self.model(**inputs, output_router_logits=routed, **kwargs)" in run_source


OUTPUTS = {
    modeling.TfmMaskedLMOutput: MaskedLMOutput,
    modeling.TfmSequenceClassifierOutput: SequenceClassifierOutput,
    modeling.TfmSequenceClassifierOutputWithPast: SequenceClassifierOutputWithPast,
    modeling.TfmTokenClassifierOutput: TokenClassifierOutput,
    modeling.TfmQuestionAnsweringOutput: QuestionAnsweringModelOutput,
}


@pytest.mark.parametrize("output_class", list(OUTPUTS), ids=lambda cls: cls.__name__)
def test_router_outputs_extend_the_transformers_output(output_class):
    """Each MoE output is the transformers class plus aux_loss and router_logits, a pickle-able, pytree-registered
    ModelOutput of its own name."""
    parent = OUTPUTS[output_class]
    assert issubclass(output_class, parent)
    names = [field.name for field in dataclasses.fields(output_class)]
    assert names == [field.name for field in dataclasses.fields(parent)] + ["aux_loss", "router_logits"]
    assert (
        f"{output_class.__module__}.{output_class.__qualname__}"
        == f"hf_tfm.model.modeling_tfm.{output_class.__name__}"
    )
    first = names[1]  # loss is the first field; give the second (logits or start_logits) and the MoE fields
    output = output_class(**{first: torch.ones(2)}, aux_loss=torch.tensor(0.5), router_logits=(torch.zeros(3, E),))
    again = pickle.loads(pickle.dumps(output))
    assert type(again) is output_class and torch.equal(again.aux_loss, output.aux_loss)
    leaves, spec = torch.utils._pytree.tree_flatten(output)
    assert len(leaves) == 3 and type(torch.utils._pytree.tree_unflatten(leaves, spec)) is output_class
