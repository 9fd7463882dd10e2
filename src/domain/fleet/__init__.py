"""The replicas of a deployment, as the front sees them (R-REP): membership, dispatch by least
outstanding bytes, outlier ejection, restart backoff, DNS discovery and which workers a
reconfiguration keeps.
"""
