"""Routes out of hf_tfm for other runtimes (not remote code): `onnx.py` writes ONNX graphs with their KV cache and runs
them with onnxruntime (`export_onnx`, `OnnxGreedy`); `gguf.py` writes GGUF files that llama.cpp opens
(`write_llama_gguf`). Quantisation of the MoE experts, which transformers'
torchao route leaves in full precision, is the package's (hf_tfm/quantization.py), run after every load."""
