"""Every attention hf_tfm builds stays traceable as vLLM's Transformers backend traces it (tests/support/fx_trace.py:
torch.fx, submodules and the attention interface as leaves): the trace reaches the attention interface's call and
the end of the forward. vLLM serves a model only when it finds that call in every layer, and fuses the projections
around it from the graph; `make test-vllm` and CI's vLLM smoke serve real models, this guard costs a second.

The modules come from every preset (every family's attention: separate or fused q/k/v, queries scaled as projected,
QK-norms per head and over the projection, partial and nested RoPE, ALiBi, T5's bias, sinks, sliding windows,
DeBERTa's disentangled attention, latent attention, cross-attention) and from the options no preset sets."""

import ast
import inspect
import textwrap

import pytest
import torch
from support.fx_trace import reaches_attention, trace
from transformers import AutoModel

import hf_tfm
from hf_tfm.model.capabilities import backend_refusal
from hf_tfm.model.modeling_tfm_attention import AttentionModule

OPTIONS = {  # preset -> fields: options of make_self_attention's outcomes that no preset sets
    "llama-1.3m": dict(attention_sinks=True, sliding_window=4, attn_logit_softcapping=30.0),
    "qwen3-1.3m": dict(fused_qkv_proj=True, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
    "deepseek-v3-2.4m": dict(q_lora_rank=None),
}


def attention_modules() -> dict[str, torch.nn.Module]:
    """One attention module of each class and preset (and option set), named `preset[+options]:path`."""
    found = {}
    configs = [(name, {}) for name in hf_tfm.preset_names()] + [(name, fields) for name, fields in OPTIONS.items()]
    for name, fields in configs:
        torch.manual_seed(0)
        config = hf_tfm.preset_config(name, **fields)
        with torch.device("meta"):
            model = AutoModel.from_config(config)
        label = name + ("+" + ",".join(fields) if fields else "")
        kinds = set()
        for path, module in model.named_modules():
            if isinstance(module, AttentionModule) and (type(module), "cross" in path) not in kinds:
                kinds.add((type(module), "cross" in path))
                found[f"{label}:{path}"] = (module, config)
    return found


MODULES = attention_modules()


def test_every_attention_class_is_covered():
    classes = {type(module).__name__ for module, _ in MODULES.values()}
    built = {
        cls.__name__
        for cls in vars(hf_tfm.model.modeling_tfm_attention).values()
        if inspect.isclass(cls) and issubclass(cls, AttentionModule) and cls is not AttentionModule
    }
    assert classes == built


# DeBERTa's position scores reach the backend inside the mask, merged by reading the mask's dtype and layout, which
# a trace cannot; vLLM's attention takes no mask, so vLLM refuses the model at load by this field instead
REFUSED_BY_VLLM = {"TfmDisentangledAttention": "position_embedding_type"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_trace_reaches_the_attention_call_and_the_end(name):
    module, config = MODULES[name]
    if type(module).__name__ in REFUSED_BY_VLLM:
        assert REFUSED_BY_VLLM[type(module).__name__] in backend_refusal(config, "vllm")
        return
    graph = trace(module, config.hidden_size)
    assert reaches_attention(graph)
    assert any(node.op == "output" for node in graph.nodes)


def interface_calls(forward) -> list[ast.Call]:
    """The calls, in `forward`'s own source, of a name assigned from `ALL_ATTENTION_FUNCTIONS.get_interface(...)`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(forward))))
    names = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func) == "ALL_ATTENTION_FUNCTIONS.get_interface"
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
    }
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) in names]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_forward_itself_calls_the_interface_with_its_scale_and_sinks(name):
    """vLLM looks for exactly one interface call in the source of the class's own `forward` (not a helper it calls),
    and reads the scale and the sinks from its `scaling=` and `s_aux=` keywords: without them it would serve the
    model with head_dim ** -0.5 and no sinks."""
    module, _ = MODULES[name]
    (call,) = interface_calls(type(module).forward)
    keywords = {keyword.arg: ast.unparse(keyword.value) for keyword in call.keywords}
    assert keywords["scaling"] == "self.scaling"
    assert isinstance(module.scaling, float)
    if module.sinks is not None:
        assert keywords.get("s_aux") == "self.sinks"
