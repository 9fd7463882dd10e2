"""What a setting may be and what an unset one becomes (R-ARG, R-PROF, R-DEV, R-DT): every bound and
default, the profiles, the engine arguments and their resolved batch limits, device names and
memory classes, and the precision rules.
"""
