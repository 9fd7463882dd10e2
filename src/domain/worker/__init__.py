"""How a worker runs its models (R-ARG, R-API-6, R-LOAD, R-CPU, R-DT-3, R-DEV-2, R-PERF-3): what it
is told, a served model's life and load retries, the thread budget and adaptive threads, which
kernels serve a forward, GPU calibration, and the result cache.
"""
