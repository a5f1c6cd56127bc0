"""Stubs of Tollgate's native API (proto/tollgate/v1/ratelimiter.proto), written by generate.py.

The other files here are generated: change the proto and run generate.py rather than editing them.
"""
