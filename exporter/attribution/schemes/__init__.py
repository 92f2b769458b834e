"""GPU sharing schemes, one module each: which containers a scheme claims, and what it allocated.

Every module defines ``SCHEME`` (:class:`exporter.attribution.schemes.base.Scheme`); the
registry that orders them is :data:`exporter.attribution.allocations.SCHEMES`.
"""
