"""Names and figures both backends, the manifests and the ARM bodies share: each is defined here and only here.

Pure values, no imports: anything (the CLI's argument table included) may import this at no cost.
"""

#: The blob container of a cluster's checkpoints and event logs (one prefix per job below it).
CHECKPOINT_CONTAINER = "checkpoints"
#: The Kubernetes namespace training runs in on AKS, and the service account its pods use (workload identity).
TRAINING_NAMESPACE = "elastictrain"
TRAINING_SERVICE_ACCOUNT = "elastictrain-training"
#: The GPU pool's taint: only pods that tolerate it (the training workers) land on GPU nodes.
GPU_TAINT = "sku=gpu:NoSchedule"
#: The least notice Azure gives a Spot VM before evicting it (a Scheduled Events Preempt): the local cluster's
#: default notice and the one every simulated eviction on AKS gets.
AZURE_NOTICE_SECONDS = 30.0
