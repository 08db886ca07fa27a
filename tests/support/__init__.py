"""Shared test helpers.  ``tests.support.services`` starts real local services
(Azurite, etcd) and runs the real az; scripts and benchmarks may import it with
the repo root on ``sys.path``."""
