"""Sessions (a stream of ops and reads on one device) and the admin client.
"""
