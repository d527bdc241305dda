"""Traced functions (registered once, replayed) and captures.
"""
