"""The local cluster: etcd, Azurite, a Scheduled Events endpoint and torchrun agents on this machine."""
