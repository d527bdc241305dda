"""The ``fabric`` command (click): a thin shell over the library.
"""
