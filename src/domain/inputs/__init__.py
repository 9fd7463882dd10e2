"""What a request may carry (R-MEDIA, R-PERF-5): media limits and sampling, a deployment's input
budget, and an offline batch file's lines (`vllm-srun batch`).
"""
