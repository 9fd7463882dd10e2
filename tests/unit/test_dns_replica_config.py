"""A deployment's replica found through DNS (`{dns, port, model}`, issue 26): accepted with its
optional fields, refused with one line per problem when it is incomplete or mixed with another
placement."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_srun.adapters.config.loader import load_config_data
from vllm_srun.adapters.config.schema import ConfigError


def load(replica: dict[str, Any], **deployment: Any) -> Any:
    spec = {"artifact": "m", "replicas": [replica], **deployment}
    return load_config_data({"global": {"model_catalog": {"deployments": {"primary": spec}}}})


def test_a_dns_replica_is_accepted_and_counts_as_attached() -> None:
    config = load(
        {"dns": "workers.ns.svc.cluster.local", "port": 8100, "model": "minilm", "nameserver": "10.0.0.10:53"}
    )
    (replica,) = config.deployments["primary"].placement()
    assert (replica.dns, replica.port, replica.model, replica.attached) == (
        "workers.ns.svc.cluster.local",
        8100,
        "minilm",
        True,
    )
    assert replica.resolve_every_ms is None  # the default, 5 s


@pytest.mark.parametrize(
    ("replica", "problem"),
    [
        (
            {"dns": "w.svc", "model": "m"},
            "deployments.primary.replicas[0]: a replica found through 'dns' needs the runtimes' 'port'",
        ),
        (
            {"dns": "w.svc", "port": 80},
            "deployments.primary.replicas[0]: a replica found through 'dns' names its runtimes' model with 'model'",
        ),
        (
            {"dns": "w.svc", "port": 80, "model": "m", "endpoint": "http://h:1"},
            "deployments.primary.replicas[0]: 'dns' cannot be combined with 'endpoint'",
        ),
        (
            {"device": "cpu", "port": 80},
            "deployments.primary.replicas[0]: 'port' is only for a replica found through 'dns'",
        ),
        ({"dns": "not a name", "port": 80, "model": "m"}, "deployments.primary.replicas[0].dns"),
        ({"dns": "w.svc", "port": 70000, "model": "m"}, "deployments.primary.replicas[0].port"),
    ],
)
def test_an_incomplete_or_mixed_dns_replica_is_refused_in_one_line(replica: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(replica)
    assert any(line.startswith(problem) for line in caught.value.problems), caught.value.problems


def test_worker_limits_are_refused_on_a_deployment_found_through_dns() -> None:
    with pytest.raises(ConfigError, match="max_queue: refused on a deployment with an attached endpoint"):
        load({"dns": "w.svc", "port": 80, "model": "m"}, max_queue=4)
