"""Job names the Kubernetes API server would refuse are refused at `job run`, before anything is sent; the fake API
server (tests/support/fake_kube.py) refuses them as the real one does, with its Status shape."""
from __future__ import annotations

import copy

import pytest

from azext_elastictrain.clients.kube import KubeError
from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.spec import JobSpec, SpecError
from tests.support.fake_kube import FakeKube, validate_name

CLUSTER = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                          checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
RENDER = {"torchelastic": m.render_elastic_job, "k8s-job": m.render_k8s_job}


def _job(name: str, *, nodes: int = 3, max_nodes: int = 3) -> JobSpec:
    return JobSpec(name=name, script="train.py", min_nodes=1, max_nodes=max_nodes, nodes=nodes)


@pytest.mark.parametrize("engine", sorted(RENDER))
def test_a_name_that_starts_with_a_digit_is_refused_for_its_service(engine) -> None:
    """A Service's name is a DNS-1035 label: it starts with a letter (the operator's <job>-worker-<i>, the
    Indexed Job's headless <job>)."""
    with pytest.raises(SpecError, match="'1cifar' cannot be used on Kubernetes: .* starts with a letter .*'job-1c"):
        RENDER[engine](_job("1cifar"), CLUSTER, IMAGE)


def test_the_operators_worker_services_bound_the_name_of_an_elastic_job() -> None:
    """kubeflow/common names a Service per worker <job>-worker-<index>: 63 characters at most."""
    longest = "a" * (63 - len("-worker-2"))
    assert m.render_elastic_job(_job(longest, nodes=3), CLUSTER, IMAGE)["metadata"]["name"] == longest
    with pytest.raises(SpecError, match=r"Service 'a{55}-worker-2' would have 64 characters .* at most 54"):
        m.render_elastic_job(_job(longest + "a", nodes=3), CLUSTER, IMAGE)


def test_the_highest_index_hostname_bounds_the_name_of_an_indexed_job() -> None:
    """An Indexed Job's pods are <job>-<index> (index up to completions-1 = --max-nodes - 1): a DNS-1123 label."""
    longest = "k" * (63 - len("-11"))
    objects = m.render_k8s_job(_job(longest, max_nodes=12), CLUSTER, IMAGE)
    for obj in objects:
        validate_name(obj)  # the fake API server takes what we render
    with pytest.raises(SpecError, match=r"pod hostname 'k{61}-11' would have 64 characters .* at most 60"):
        m.render_k8s_job(_job(longest + "k", max_nodes=12), CLUSTER, IMAGE)


def test_the_fake_api_server_refuses_a_service_name_as_the_real_one_does() -> None:
    """kubernetes ValidateServiceName: 422 Invalid, the DNS-1035 message, details with the cause's field."""
    service, _ = m.render_k8s_job(_job("cifar"), CLUSTER, IMAGE)
    bad = copy.deepcopy(service)
    bad["metadata"]["name"] = "1cifar"
    kube = FakeKube()
    with pytest.raises(KubeError) as refused:
        kube.apply(bad)
    assert (refused.value.status, refused.value.reason) == (422, "Invalid")
    assert str(refused.value).startswith('Service "1cifar" is invalid: metadata.name: Invalid value: "1cifar": a '
                                         "DNS-1035 label must consist of lower case alphanumeric characters")
    (cause,) = refused.value.details["causes"]
    assert (refused.value.details["kind"], cause["reason"], cause["field"]) == ("Service", "FieldValueInvalid",
                                                                                "metadata.name")
    assert kube.get("v1", "Service", "1cifar", "elastictrain") is None


def test_the_fake_api_server_refuses_an_indexed_job_whose_last_hostname_is_too_long() -> None:
    _, job = m.render_k8s_job(_job("k" * 60, max_nodes=12), CLUSTER, IMAGE)
    job["metadata"]["name"] = "k" * 62
    with pytest.raises(KubeError, match=r'Job.batch "k{62}" is invalid: metadata.name: .*invalid DNS label: k{62}-11'):
        FakeKube().apply(job)
