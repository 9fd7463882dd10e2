"""deploy/kubernetes and the Dockerfile (issue 14): every overlay renders with kustomize and
validates against the Kubernetes 1.32 schemas and the oldest we support, 1.25 (kubernetes-validate,
strict: unknown fields are errors); the front's config finds the workers through the headless
Service's DNS name and nothing else, so scaling is one step; the autoscaling components (an
autoscaling/v2 HPA on the workers' `vllm_srun_queued_work_ratio` through prometheus-adapter rules,
or a KEDA ScaledObject, checked by hand: no pinned schema for that CRD) render with every overlay
and name a metric the worker exports; probes, drain and termination grace, resources, disruption budgets and the non-root,
read-only security context are what docs/deploy.md says; the image installs as the README does.

The renderer is kustomize v5: `kustomize build`, or the one built into `kubectl kustomize`
(kubectl >= 1.27; this project's machines have kubectl 1.32 with kustomize v5.5.0). Without
either the tests skip and say so, except under CI, where they fail.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from vllm_srun.adapters.config.loader import load_config_text
from vllm_srun.app.server import GRACEFUL_SHUTDOWN_S

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSIONS = ("1.25.0", "1.32.0")  # the schemas the manifests are validated against
DOCS = REPO / "docs" / "deploy.md"
OVERLAYS = {"cpu": ("cpu", None), "cuda": ("cuda:0", "nvidia.com/gpu"), "rocm": ("rocm:0", "amd.com/gpu")}
IMAGE_USER = 10001


def renderer() -> list[str]:
    """The kustomize command line, without the folder."""
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    reason = "no kustomize v5 renderer: install kubectl >= 1.27 (kubectl kustomize) or kustomize v5"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@cache
def _render(folder: Path) -> tuple[dict[str, Any], ...]:
    done = subprocess.run([*renderer(), str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr  # no deprecated kustomize fields
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def render(overlay: str) -> list[dict[str, Any]]:
    return list(_render(KUBERNETES / "overlays" / overlay))


def one(docs: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and (component is None or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component)
    ]
    assert len(found) == 1, f"{len(found)} {kind} ({component})"
    return found[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_the_overlays_are_cpu_cuda_and_rocm() -> None:
    found = {p.parent.name for p in (KUBERNETES / "overlays").glob("*/kustomization.yaml")}
    assert found == set(OVERLAYS)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_overlay_renders_and_validates_against_the_pinned_kubernetes(overlay: str) -> None:
    import kubernetes_validate

    docs = render(overlay)
    assert sorted(d["kind"] for d in docs) == sorted(
        ["ConfigMap", "Service", "Service", "StatefulSet", "Deployment", "PodDisruptionBudget", "PodDisruptionBudget"]
    )
    for doc in docs:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)  # raises on any problem


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_front_config_finds_the_workers_through_the_headless_service(overlay: str) -> None:
    assert_config_discovers_the_workers(render(overlay))


def documented_overlay(tmp_path: Path) -> list[dict[str, Any]]:
    """docs/deploy.md "Scale the workers": its overlay, next to the repository's, rendered."""
    text = DOCS.read_text()
    files = dict(re.findall(r"```yaml\n# my-deployment/(\S+)\n(.*?)```", text, flags=re.DOTALL))
    assert sorted(files) == ["kustomization.yaml"]
    assert "kubectl apply -k my-deployment" in text and "kubectl scale statefulset/vllm-srun-worker" in text
    folder = tmp_path / "my-deployment"
    folder.mkdir()
    kustomization = files["kustomization.yaml"]
    for part in ("overlays/cpu", "components/hpa"):  # kustomize wants relative paths
        relative = os.path.relpath(KUBERNETES / part, folder)
        assert f"../deploy/kubernetes/{part}" in kustomization
        kustomization = kustomization.replace(f"../deploy/kubernetes/{part}", relative)
    (folder / "kustomization.yaml").write_text(kustomization)
    return list(_render(folder))


def test_the_documented_autoscaling_overlay_validates_and_scales_on_the_workers_queued_work(tmp_path: Path) -> None:
    import kubernetes_validate

    docs = documented_overlay(tmp_path)
    workers, hpa = one(docs, "StatefulSet", "worker"), one(docs, "HorizontalPodAutoscaler")
    assert "replicas" not in workers["spec"]  # the HPA owns the count; an apply never resets it
    for doc in docs:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "StatefulSet",
        workers["metadata"]["name"],
    )
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    name = metric["pods"]["metric"]["name"]
    assert name in worker_metric_names()
    # prometheus-adapter serves exactly that series as a per-pod metric
    values = yaml.safe_load((KUBERNETES / "components" / "hpa" / "prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    assert rule["seriesQuery"].startswith(f"{name}{{") and rule["name"]["as"] == name
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
    assert_config_discovers_the_workers(docs)


def test_the_keda_component_scales_the_workers_on_the_same_signal(tmp_path: Path) -> None:
    """No pinned schema for KEDA's CRD offline: its ScaledObject (keda.sh/v1alpha1) is checked
    field by field against what KEDA documents for a prometheus trigger."""
    folder = tmp_path / "keda"
    folder.mkdir()
    (folder / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{os.path.relpath(KUBERNETES / 'overlays' / 'cuda', folder)}]\n"
        f"components: [{os.path.relpath(KUBERNETES / 'components' / 'keda', folder)}]\n"
    )
    docs = list(_render(folder))
    workers, scaled = one(docs, "StatefulSet", "worker"), one(docs, "ScaledObject")
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]  # KEDA makes its own
    assert "replicas" not in workers["spec"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert set(spec) <= {
        "scaleTargetRef",
        "minReplicaCount",
        "maxReplicaCount",
        "pollingInterval",
        "cooldownPeriod",
        "triggers",
    }
    target = spec["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "StatefulSet",
        workers["metadata"]["name"],
    )
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert all(isinstance(spec[k], int) and spec[k] > 0 for k in ("pollingInterval", "cooldownPeriod"))
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and set(trigger["metadata"]) == {"serverAddress", "query", "threshold"}
    assert urlsplit(trigger["metadata"]["serverAddress"]).scheme in ("http", "https")
    assert isinstance(trigger["metadata"]["threshold"], str) and float(trigger["metadata"]["threshold"]) > 0
    names = set(re.findall(r"\b(vllm_srun_\w+)", trigger["metadata"]["query"]))
    assert names and names <= worker_metric_names()
    assert workers["metadata"]["name"] in trigger["metadata"]["query"]


def worker_metric_names() -> set[str]:
    """The series a worker exports (its metrics registry, as /metrics writes them)."""
    from vllm_srun.adapters.serving.metrics import RuntimeMetrics

    return set(re.findall(r"^# TYPE (\S+) ", RuntimeMetrics().render(), flags=re.MULTILINE))


def assert_config_discovers_the_workers(docs: list[dict[str, Any]]) -> None:
    """The front's config (as the front loads it) has one replica: the worker StatefulSet's
    headless Service by name (never an address), the Service's port and the model the workers
    serve."""
    workers, front = one(docs, "StatefulSet", "worker"), one(docs, "Deployment", "front")
    headless = next(
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == workers["spec"]["serviceName"]
    )
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"].items() <= workers["spec"]["template"]["metadata"]["labels"].items()
    port = headless["spec"]["ports"][0]["port"]
    worker = container(workers)
    assert worker["ports"][0]["containerPort"] == port and f"--port {port}" in shlex.join(worker["args"])
    served = worker["args"][1]  # vllm-srun serve MODEL …

    config_map = next(
        d
        for d in docs
        if d["kind"] == "ConfigMap"
        and d["metadata"]["name"] == _volume(front, "config")["configMap"]["name"]  # the hashed name
    )
    config = load_config_text(config_map["data"]["config.yaml"])  # as the front loads it
    (deployment,) = config.deployments.values()
    (replica,) = deployment.placement()
    assert (replica.dns, replica.port, replica.model) == (headless["metadata"]["name"], port, served)
    assert replica.attached and replica.device is None and replica.endpoint is None and replica.nameserver is None
    with pytest.raises(ValueError):  # a name: never an address
        ipaddress.ip_address(replica.dns or "")


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_workers_take_device_0_of_their_own_allocation_never_a_host_id(overlay: str) -> None:
    device, gpu = OVERLAYS[overlay]
    docs = render(overlay)
    workers = one(docs, "StatefulSet", "worker")
    worker = container(workers)
    args = worker["args"]
    assert args[args.index("--device") + 1] == device
    resources = worker["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    if gpu is not None:
        assert resources["requests"][gpu] == resources["limits"][gpu] == "1"  # one GPU per pod: device 0
    else:
        assert not any("gpu" in key for key in (*resources["requests"], *resources["limits"]))
    pod = workers["spec"]["template"]["spec"]
    text = yaml.safe_dump(docs)
    for host_specific in ("nodeName", "nodeSelector", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "hostNetwork"):
        assert host_specific not in text
    assert "affinity" not in pod
    assert not re.search(r"GPU-[0-9a-f]{8}-", text)  # no GPU UUIDs


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_probes_drain_grace_budgets_and_security(overlay: str) -> None:
    docs = render(overlay)
    workers, front = one(docs, "StatefulSet", "worker"), one(docs, "Deployment", "front")
    for workload in (workers, front):
        main = container(workload)
        assert main["readinessProbe"]["httpGet"]["path"] == "/health"
        assert main["livenessProbe"]["httpGet"]["path"] == "/health/live"
        assert {"cpu", "memory"} <= main["resources"]["requests"].keys()
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == IMAGE_USER
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert "/tmp" in {m["mountPath"] for m in main["volumeMounts"]}  # the only writable places
        labels = workload["spec"]["template"]["metadata"]["labels"]
        budgets = [
            d
            for d in docs
            if d["kind"] == "PodDisruptionBudget" and d["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(budgets) == 1 and budgets[0]["spec"]["maxUnavailable"] == 1
    assert "/var/cache/vllm-srun" in {m["mountPath"] for m in container(workers)["volumeMounts"]}  # engine cache
    # the worker finishes in-flight requests for GRACEFUL_SHUTDOWN_S after SIGTERM
    assert workers["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > GRACEFUL_SHUTDOWN_S
    # the front: preStop sleep, then SIGTERM drains for --drain-timeout; the grace covers both
    main = container(front)
    sleep = main["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    drain = float(main["args"][main["args"].index("--drain-timeout") + 1])
    assert front["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= float(sleep[1]) + drain + 5
    assert front["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def _volume(workload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == name)


def _readme_install() -> list[str]:
    """The README's first command, step by step."""
    readme = (REPO / "README.md").read_text()
    command = re.search(r"```bash\n(.*?)\n```", readme, flags=re.DOTALL)
    assert command is not None
    return command[1].strip().split(" && ")


def test_the_image_installs_exactly_as_the_readme_does() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    runs = re.findall(r"^RUN (.*)$", dockerfile, flags=re.MULTILINE)
    steps = _readme_install()
    assert steps[-1] == "vllm-srun serve"
    assert runs[0].split(" && ") == steps[:-1]  # install and pull, the README's own words
    cmd = re.search(r"^CMD \[(.*)\]$", dockerfile, flags=re.MULTILINE)
    assert cmd is not None and [part.strip().strip('"') for part in cmd[1].split(",")][:2] == ["vllm-srun", "serve"]
    assert re.search(rf"^USER {IMAGE_USER}$", dockerfile, flags=re.MULTILINE)
    assert "VLLM_SRUN_ENGINE_CACHE=/var/cache/vllm-srun" in dockerfile
    for overlay in OVERLAYS:  # the manifests run the image's own commands
        docs = render(overlay)
        assert container(one(docs, "StatefulSet", "worker"))["command"] == ["vllm-srun"]
        assert container(one(docs, "Deployment", "front"))["command"] == ["vllm-sr"]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_keys_and_the_internal_token_come_from_secrets_never_the_command_line(overlay: str) -> None:
    """R-AUTH-3: the workers listen on 0.0.0.0 only behind the internal token, which both pods
    take from the Secret through the environment; the front's key file is that Secret's file."""
    docs = render(overlay)
    workers, front = one(docs, "StatefulSet", "worker"), one(docs, "Deployment", "front")
    assert not [d for d in docs if d["kind"] == "Secret"]  # made by the operator (docs/deploy.md), never committed
    worker, main = container(workers), container(front)
    for pod in (worker, main):
        (token,) = [e for e in pod["env"] if e["name"] == "VLLM_SRUN_INTERNAL_TOKEN"]
        assert token["valueFrom"]["secretKeyRef"] == {"name": "vllm-srun-auth", "key": "internal-token"}
        assert not any("token" in arg.lower() for arg in pod["args"])
        assert "--allow-unauthenticated" not in pod["args"]
    assert worker["args"][worker["args"].index("--host") + 1] == "0.0.0.0"
    key_file = main["args"][main["args"].index("--api-key-file") + 1]
    mount = next(m for m in main["volumeMounts"] if key_file.startswith(m["mountPath"] + "/"))
    secret = _volume(front, mount["name"])["secret"]
    assert secret["secretName"] == "vllm-srun-auth" and secret["defaultMode"] == 0o400
    assert secret["items"] == [{"key": "api-keys", "path": key_file.rsplit("/", 1)[1]}]  # never the token
    config_map = next(
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == _volume(front, "config")["configMap"]["name"]
    )
    (deployment,) = load_config_text(config_map["data"]["config.yaml"]).deployments.values()
    assert deployment.internal_token_env == "VLLM_SRUN_INTERNAL_TOKEN"
