"""Routes out of hf_tfm for other runtimes (not remote code): `onnx.py` writes ONNX graphs with their KV cache and runs
them with onnxruntime (`export_onnx`, `OnnxGreedy`); `gguf.py` writes GGUF files that llama.cpp opens
(`write_llama_gguf`). Quantisation of the MoE experts is part of the model (modeling_tfm_quantization.py, remote
code), so that a quantised checkpoint loads anywhere."""
