"""The local harness the tests and the benchmarks share: real services (``services``: Azurite, etcd, the real az),
nodes of an elastic job started by the product's own launch (``elastic``), in-process replicas running the README's
loop (``replica_worker``) and a coordinator to kill and start again (``restartable_coordinator``).

Not shipped (setup.py packages only azext_elastictrain); imported with the repository root on ``sys.path``:
pytest puts it there (pytest.ini), each scripts/bench/*.py inserts it. tests/support/ keeps what only the tests use.
"""
