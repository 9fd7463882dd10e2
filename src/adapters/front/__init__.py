"""The deployment front of `vllm-sr serve`: fleet, dispatch proxy, reports (R-REP)."""
