"""Training workflows around `transformers.Trainer`: embedded data, tokenizers, metrics, checkpoints, the main job.

Not remote code: nothing in the modeling files imports from here.
"""
