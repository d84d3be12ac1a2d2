"""CI plumbing: the environment report and the convergence-decision check.

Small services later stages use; what it may import: jatools/stages.py.
"""
