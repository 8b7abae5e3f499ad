import os

# The deterministic protocol needs cuBLAS's workspace fixed before the first CUDA
# call of the process (GPU tests only; harmless on CPU).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
