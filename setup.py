"""The az elastictrain extension and its training runtime."""
from setuptools import find_packages, setup

VERSION = "0.1.0"

CLASSIFIERS = [
    "Development Status :: 3 - Alpha",
    "Intended Audience :: Developers",
    "Programming Language :: Python :: 3",
    "Programming Language :: Python :: 3.11",
    "License :: OSI Approved :: MIT License",
]

# The CLI side runs in az's own Python: besides what azure-cli ships (azure-storage-blob among it) it needs the
# official Kubernetes client, which 'az extension add' installs from here. 37.x is the client of Kubernetes 1.37;
# its API objects and the calls we make (server-side apply, watch, logs) are those of every AKS-supported version.
DEPENDENCIES: list = ["kubernetes==37.0.2"]

EXTRAS = {
    # What training scripts need inside the job (the runtime).
    "train": [
        "torch==2.13.0",
        "azure-storage-blob>=12.19",
        "azure-identity>=1.15",
        "python-etcd>=0.4.5",  # torchrun's etcd-v2 rendezvous backend
        "xxhash>=3.0",  # the memory tier's checksum (runtime/memory_tier.py): xxh3-64, ~3x zlib's CRC32 here
        "numpy",
        "scikit-learn",
        "torchft==0.2.0",  # the in-process recovery mode (runtime/replicas.py): quorum, in-place re-form, peer healing
    ],
    "plot": ["matplotlib"],  # az elastictrain job timeline --output-file
    "test": [
        "pytest>=8",
        "pytest-timeout",
        "pytest-xdist==3.8.0",  # scripts/test.sh: all but the torchrun tests on every core
        "hypothesis==6.170.15",  # property tests (retention planning, ElasticSampler schedules)
        "matplotlib",  # job timeline --output-file (the demo draws with it)
        "kubernetes-validate>=1.30.0",  # rendered objects vs the official Kubernetes schemas
        "jsonschema>=4.23",  # ElasticJobs vs our CRD's openAPIV3Schema
        "mypy==2.4.1",  # scripts/test.sh: the type checker, strict on the whole package (mypy.ini)
    ],
}

setup(
    name="elastictrain",
    version=VERSION,
    description="Elastic, fault-tolerant PyTorch training on Azure Spot GPUs",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    classifiers=CLASSIFIERS,
    python_requires=">=3.10",
    packages=find_packages(include=["azext_elastictrain", "azext_elastictrain.*"]),
    install_requires=DEPENDENCIES,
    extras_require=EXTRAS,
    # manifests/: the in-cluster objects (a kustomize base) core.aks.manifests renders from.
    package_data={"azext_elastictrain": ["azext_metadata.json", "manifests/*.yaml"]},
)
