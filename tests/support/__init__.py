"""What the tests use but is not a test: the parity harness, a local Hub server, the workers that torchrun launches,
the release matrix, the lean-install check, and the suites that need their own venv (vLLM, llama.cpp)."""
