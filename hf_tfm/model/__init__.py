"""The model bundle: the files `save_pretrained` copies next to the weights as remote code (flat siblings with relative
imports, the model and what it needs to run), so a checkpoint loads with `trust_remote_code=True` where hf_tfm is not
installed. Reading starts at `modeling_tfm.py` (the public classes), then `modeling_tfm_stack.py` (the base class, the
blocks and the stack), the building blocks (`modeling_tfm_attention.py`, `_positions`, `_layers`, `_moe`), the heads'
vocabulary projection and loss (`modeling_tfm_lm_head.py`), the config (`configuration_tfm.py`, its rules in
`configuration_tfm_rules.py`), what each backend can run (`capabilities.py`) and what each release needs
(`compat.py`)."""
