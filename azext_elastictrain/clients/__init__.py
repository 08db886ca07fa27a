"""Outside systems, one module each: ARM (``arm``), Kubernetes (``kube``), blob storage (``blob``)."""
