"""Helpers only the tests use (fakes of Azure, Kubernetes and the operator; the README harness).  What the
benchmarks share with the tests (real Azurite and etcd, elastic nodes, replicas) is the top-level ``harness``
package."""
