"""The tensor handle and what a user does with it: operators, views, indexing, numpy's
protocols and functions, printing, random tensors, and the op stream that carries it all.
"""
