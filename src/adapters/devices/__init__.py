"""Device adapters behind the `Device` contract (CPU, CUDA, ROCm, MPS)."""
