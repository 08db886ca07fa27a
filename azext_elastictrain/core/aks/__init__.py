"""Translation to AKS: the ARM bodies, the Kubernetes objects, the region preflight, the Spot
evictions planned and the kubeconfig merge. Pure: no network, no SDK."""
