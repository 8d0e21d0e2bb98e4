"""What a core-only install (`pip install hf-tfm`, no extras) must do: import hf_tfm, build a tiny model of every
paradigm from a preset, save it, load it back with the Auto classes and generate, with none of the packages the
extras add (training, metrics, plotting, LoRA).

    python tests/support/lean_install.py           # a fresh venv holding torch and `pip install .` (make test-lean)
    python tests/support/lean_install.py --block   # a full venv: the extras are made unimportable first (the suite)
"""

import importlib.util
import sys
import tempfile

# what the extras add (import names)
EXTRAS = (
    "accelerate",
    "datasets",
    "evaluate",
    "matplotlib",
    "peft",
    "sacrebleu",
    "rouge_score",
    "sklearn",
    "tensorboard",
)

if "--block" in sys.argv:
    for name in EXTRAS:
        sys.modules[name] = None  # `import name` raises ImportError, find_spec(name) answers None
else:
    present = [name for name in EXTRAS if importlib.util.find_spec(name) is not None]
    assert not present, f"not a core-only install: {present} are installed"

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM  # noqa: E402

import hf_tfm  # noqa: E402

transformers.logging.set_verbosity_error()  # the bare model's load report lists the head it leaves out
transformers.logging.disable_progress_bar()

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 97}
# a preset of each paradigm (the presets ship inside the package), made tiny; the head that generates or fills masks
CASES = {
    "llama-1.3m": AutoModelForCausalLM,
    "mixtral-1.8m": AutoModelForCausalLM,
    "bert-1.4m": AutoModelForMaskedLM,
    "t5-1.9m": AutoModelForSeq2SeqLM,
}

input_ids = torch.tensor([[5, 6, 7, 8]])
for preset, auto_class in CASES.items():
    torch.manual_seed(0)
    seq2seq = {"decoder_start_token_id": 0} if auto_class is AutoModelForSeq2SeqLM else {}
    config = hf_tfm.preset_config(preset, **TINY, pad_token_id=0, eos_token_id=2, **seq2seq)
    model = auto_class.from_config(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        loaded = auto_class.from_pretrained(folder).eval()
        AutoModel.from_pretrained(folder)  # the bare model of the paradigm loads from the same folder
    decoder = {"decoder_input_ids": input_ids} if config.is_encoder_decoder else {}
    with torch.no_grad():
        assert torch.equal(model(input_ids, **decoder).logits, loaded(input_ids, **decoder).logits), preset
    if auto_class is not AutoModelForMaskedLM:
        tokens = loaded.generate(input_ids, max_new_tokens=3, do_sample=False)
        assert tokens.shape[-1] >= 3, (preset, tokens.shape)
    print(f"{preset}: built, saved, loaded{'' if auto_class is AutoModelForMaskedLM else ', generated'}")

loaded_extras = sorted(name for name in EXTRAS if sys.modules.get(name) is not None)
assert not loaded_extras, f"the model path imported {loaded_extras}"
print(f"core-only: transformers {transformers.__version__}, torch {torch.__version__}, hf_tfm at {hf_tfm.__file__}")

# the training commands need the `[train]` extra: a core-only install gets one line saying so, not a traceback
from hf_tfm_cli.entry import main  # noqa: E402

with tempfile.TemporaryDirectory() as folder:
    hf_tfm.preset_config("llama-1.3m", **TINY).save_pretrained(folder)
    try:
        main(["generate", folder, "Return the"])
    except SystemExit as error:
        message = str(error.code)
    else:
        raise AssertionError("hf-tfm generate ran without the training extra")
assert "pip install 'hf-tfm[train]'" in message and "\n" not in message, message
print(f"hf-tfm generate without the extra: {message}")
