"""Launchers: a local cluster of processes, workers on other hosts over SSH, and Slurm.
"""
