"""A symbolic trace of one module's forward as vLLM's Transformers backend makes it (`vllm/model_executor/models/
transformers/fx_utils.py::trace`), without vLLM: `torch.fx` with every submodule a leaf, transformers' attention
interface a leaf call (a node marked `leaf_call`), no cache (`cache=None`: vLLM never passes one), and each traced
operation also run on meta tensors so that shape questions (`x.shape[:-1]`, unpacking a split) have answers. The
hidden states (and an encoder's) come in as `[1, 8, hidden_size]`, as vLLM feeds them.

What stops this trace stops vLLM's: a branch on a traced value, an autocast or device query on one, a shape read of a
tensor whose value is unknown. vLLM then finds no attention call in the layer and refuses the model at load."""

import contextlib
import operator
from unittest import mock

import torch
from torch import fx, nn
from transformers.modeling_utils import AttentionInterface

UNKNOWN = object()  # a traced value whose meta tensor could not be computed
MODULE_CALL = nn.Module.__call__  # fx patches it while tracing; the meta runs call modules for real


class MetaProxy(fx.Proxy):
    """A proxy carrying the meta value of what it stands for: `len`, iteration and attributes read it."""

    meta_value: object = UNKNOWN

    def __len__(self) -> int:
        if self.meta_value is UNKNOWN:
            return super().__len__()
        return len(self.meta_value)

    def __getattr__(self, name: str) -> "MetaAttribute":
        return MetaAttribute(self, name)


class MetaAttribute(MetaProxy, fx.proxy.Attribute):
    def __init__(self, root: fx.Proxy, name: str):
        super().__init__(root, name)
        with contextlib.suppress(Exception):
            self.meta_value = getattr(root.meta_value, name)


class LeafTracer(fx.Tracer):
    """Every submodule one `call_module` node; each node's value computed on meta tensors as it is recorded."""

    def __init__(self, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.hidden_size, self.dtype = hidden_size, dtype

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return True

    def iter(self, proxy: fx.Proxy):
        """Unpacking: by the meta value's length; the forward's `**kwargs` are empty (vLLM passes none)."""
        node = proxy.node
        if node.op == "call_method" and node.target == "keys":
            node = node.args[0]
        if node.op == "placeholder" and str(node.target).startswith("**"):
            return iter(())
        if proxy.meta_value is UNKNOWN:
            return super().iter(proxy)
        return iter([proxy[i] for i in range(len(proxy.meta_value))])

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return MetaProxy(node, self)

    def create_proxy(self, kind, target, args, kwargs, *rest, **options):
        proxy = super().create_proxy(kind, target, args, kwargs, *rest, **options)
        if isinstance(proxy, MetaProxy) and proxy.meta_value is UNKNOWN:
            with contextlib.suppress(Exception):
                proxy.meta_value = self.meta_value(kind, target, args, kwargs)
        return proxy

    def meta_value(self, kind: str, target, args: tuple, kwargs: dict):
        if kind == "placeholder":
            if str(target).endswith("hidden_states"):
                return torch.empty(1, 8, self.hidden_size, dtype=self.dtype, device="meta")
            return UNKNOWN
        if kind == "get_attr":
            value = operator.attrgetter(str(target))(self.root)
            return torch.empty_like(value, device="meta") if isinstance(value, torch.Tensor) else value
        # an unknown argument makes the operation raise, and its value stays unknown
        values, named = fx.node.map_aggregate(args, _meta), fx.node.map_aggregate(kwargs, _meta)
        if kind == "call_function":
            return target(*values, **named)
        if kind == "call_method":
            return getattr(values[0], str(target))(*values[1:], **named)
        if kind == "call_module":
            child = self.root.get_submodule(str(target))
            state = {name: torch.empty_like(t, device="meta") for name, t in child.state_dict(keep_vars=True).items()}
            with mock.patch.object(nn.Module, "__call__", MODULE_CALL):
                return torch.func.functional_call(child, state, tuple(values), named)
        return UNKNOWN


def _meta(arg):
    return arg.meta_value if isinstance(arg, MetaProxy) else arg


def leaf_call(function):
    """`function` recorded as one node marked `leaf_call`, returning two values (output, weights), as vLLM records
    the attention interface; called without proxies, it runs."""

    def leaf(*args, **kwargs):
        proxies = [arg for arg in args if isinstance(arg, fx.Proxy)]
        if not proxies:
            return function(*args, **kwargs)
        proxy = proxies[0].tracer.create_proxy("call_function", function, tuple(proxies), {})
        proxy.node.meta["leaf_call"] = True
        proxy.meta_value = (UNKNOWN, UNKNOWN)
        return proxy

    return leaf


def trace(module: nn.Module, hidden_size: int, dtype: torch.dtype = torch.float32) -> fx.Graph:
    """The graph of `module.forward`; raises where the trace stops (vLLM keeps the partial graph and logs it)."""
    original = AttentionInterface.get_interface

    def get_interface(self, *args, **kwargs):
        return leaf_call(original(self, *args, **kwargs))

    with mock.patch.object(AttentionInterface, "get_interface", get_interface):
        return LeafTracer(hidden_size, dtype).trace(module, concrete_args={"cache": None})


def reaches_attention(graph: fx.Graph) -> bool:
    return any(node.meta.get("leaf_call") for node in graph.nodes)
