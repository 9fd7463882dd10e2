"""Readiness checks run at load: the golden check (R-GOLD) and the batch-invariance probe (R-BAT-5)."""
