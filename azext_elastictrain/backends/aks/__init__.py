"""A cluster on AKS: ARM for the cluster, Kubernetes for its jobs, blob storage for their events."""
