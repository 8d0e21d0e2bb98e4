"""`import hf_tfm` imports transformers' model code first, here, with two optional packages' import-time logging
quieted (and nothing else of logging touched)."""

import logging


def import_transformers_quietly() -> None:
    """transformers' model code imports the optional packages that are installed: torchao (through its quantizers)
    logs at import about GPU kernels a CPU machine cannot load, and registers enums the way torch now logs as
    deprecated. Neither says anything to a user of hf_tfm, so those two loggers are quieted for this import alone."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        import transformers.modeling_utils  # noqa: F401
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


import_transformers_quietly()
