"""Hostile clients (R-AUTH, R-API-9): API keys and their tenants, slowing key guessing, and the
connection hygiene policy.
"""
