"""Model cards filled from the real model and run: metadata that `huggingface_hub.ModelCard` validates, an
architecture table read off the config, and only the evaluation numbers the caller actually measured."""

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..modeling_tfm import TfmPreTrainedModel
from ..modeling_tfm_layers import TfmExperts

# per model type: Hub pipeline tag, paradigm name, and the Auto class a card tells users to load with
PIPELINE_TAGS = {"tfm_decoder": "text-generation", "tfm_encoder": "fill-mask", "tfm_encoder_decoder": "text2text-generation"}
PARADIGMS = {"tfm_decoder": "decoder-only", "tfm_encoder": "encoder-only", "tfm_encoder_decoder": "encoder-decoder"}
AUTO_CLASSES = {
    "tfm_decoder": "AutoModelForCausalLM",
    "tfm_encoder": "AutoModelForMaskedLM",
    "tfm_encoder_decoder": "AutoModelForSeq2SeqLM",
}


@dataclass
class Measurement:
    split: str
    metric: str  # an `evaluate` metric id, e.g. "perplexity", "loss"
    value: float


def architecture_rows(model: TfmPreTrainedModel) -> list[tuple[str, str]]:
    config = model.config
    heads = f"{config.num_attention_heads} / {config.num_key_value_heads} (head_dim {config.head_dim})"
    position = config.position_embedding_type
    if position == "rope":
        position += f" ({config.rope_parameters['rope_type']}, theta {config.rope_parameters['rope_theta']:g})"
    layers = str(config.num_hidden_layers)
    if config.model_type == "tfm_encoder_decoder":
        layers = f"{config.num_hidden_layers} encoder + {config.decoder_layers} decoder"
    return [
        ("paradigm", PARADIGMS[config.model_type]),
        ("layers", layers),
        ("hidden size", str(config.hidden_size)),
        ("attention heads / kv heads", heads),
        ("position scheme", position),
        ("norm", f"{config.norm_type}, {config.norm_position}-norm"),
        ("feed-forward", f"{config.ffn_type} ({config.hidden_act}), intermediate {config.intermediate_size}"),
        ("experts / top-k", f"{config.num_experts} / top-{config.num_experts_per_tok}" if config.num_experts else "dense"),
        ("vocabulary", str(config.vocab_size)),
        ("tied embeddings", str(config.tie_word_embeddings)),
        ("parameters (total / active per token)", f"{model.num_parameters():,} / {active_parameters(model):,}"),
    ]


def active_parameters(model: TfmPreTrainedModel) -> int:
    """Parameters a token passes through: all of them, less the routed experts it is not sent to."""
    idle = 0
    for module in model.modules():
        if isinstance(module, TfmExperts):
            per_expert = (module.gate_up_proj.numel() + module.down_proj.numel()) // module.num_experts
            idle += (module.num_experts - model.config.num_experts_per_tok) * per_expert
    return model.num_parameters() - idle


def write_model_card(
    folder: str | Path,
    model: TfmPreTrainedModel,
    results: list[Measurement],
    dataset: str,
    training: str,
    repo_id: str | None = None,
    license: str = "apache-2.0",
) -> ModelCard:
    """Render `model_cards/tfm_model.md` for `model` and save it as `folder/README.md`."""
    model_type = model.config.model_type
    name = repo_id or Path(folder).name
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag=PIPELINE_TAGS[model_type],
        license=license,
        tags=["hf_tfm", model_type, PARADIGMS[model_type], model.config.position_embedding_type],
        datasets=[dataset],
        model_name=name,
        eval_results=[
            EvalResult(
                task_type=PIPELINE_TAGS[model_type],
                dataset_type=dataset,
                dataset_name=dataset,
                dataset_split=result.split,
                metric_type=result.metric,
                metric_value=result.value,
            )
            for result in results
        ],
    )
    card = ModelCard.from_template(
        data,
        template_path=str(files("hf_tfm.model_cards").joinpath("tfm_model.md")),
        model_name=name,
        paradigm=PARADIGMS[model_type],
        summary=f"{model.num_parameters() / 1e6:.2f}M parameters",
        architecture=architecture_rows(model),
        training=training,
        results=[{"split": r.split, "metric": r.metric, "value": f"{r.value:.4g}"} for r in results],
        auto_class=AUTO_CLASSES[model_type],
        repo_id=name,
        limitations=(
            "A small research model trained for minutes on a CPU; it demonstrates the pipeline, not a useful "
            "language model. Its text reflects the training data only and is not safe for any downstream use."
        ),
    )
    card.save(Path(folder) / "README.md")
    return card
