"""One model's scheduler (R-BAT, R-FAIR, R-ADM-1, R-SC): rows and lanes, forward plans, the batch
window, costs per token, the fair queue over tenants and their token rates, admission, the read
pacing of the event loop, shared context, and the simulator that replays the same scheduler.
"""
