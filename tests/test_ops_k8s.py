"""The Kubernetes manifests in infra/k8s/, checked offline by real tools: each kustomization is
rendered by kustomize (the standalone binary, or the one built into kubectl), every rendered
object is validated against its kind's Kubernetes 1.33 JSON schema (standalone-strict, shipped
in infra/schemas/k8s), and the environment of the ragqa containers is loaded into ragqa's
Settings. The other checks are the ones a reviewer would make by eye: probes on the right
paths, a scheduler with a standby only where the lease makes it safe, ragqa on the PostgreSQL it
deploys, no volume shared between pods, tensor parallelism matching the GPUs, the autoscaler's
metric served."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.settings_env import setting_path_exists

INFRA = Path(__file__).resolve().parent.parent / "infra"
K8S = INFRA / "k8s"
SCHEMAS = INFRA / "schemas" / "k8s"
KUSTOMIZATIONS = ["base", "overlays/production"]


def kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    built = Path.home() / ".cache/ragqa/bin/kustomize"  # scripts/env.sh's ensure_kustomize
    if built.is_file():
        return [str(built), "build"]
    if shutil.which("kubectl"):  # kubectl kustomize renders locally; no cluster is involved
        return ["kubectl", "kustomize"]
    return None


KUSTOMIZE = kustomize_command()
pytestmark = pytest.mark.skipif(KUSTOMIZE is None, reason="neither kustomize nor kubectl is installed "
                                "(scripts/test.sh builds kustomize from the Go module proxy)")
# The values of the secret's keys; Kubernetes refuses to start a container whose secret key is
# missing (unless optional), as compose refuses a ${VAR:?} that is unset.
SECRETS = {("ragqa-secrets", "elastic-password"): "es-secret",
           ("ragqa-secrets", "api-keys"): '[{"id": "ops", "hash": "sha256:' + "0" * 64 + '", "scopes": ["admin"]}]',
           ("ragqa-secrets", "hf-token"): "", ("ragqa-secrets", "postgres-password"): "pg-secret"}


@cache
def render(kustomization: str) -> tuple[dict[str, Any], ...]:
    import yaml

    run = subprocess.run([*KUSTOMIZE, str(K8S / kustomization)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stderr
    return tuple(d for d in yaml.safe_load_all(run.stdout) if d)


def objects(kustomization: str, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in render(kustomization) if o["kind"] == kind}


def deployment(kustomization: str, name: str, kind: str = "Deployment") -> tuple[dict[str, Any], dict[str, Any]]:
    """A Deployment (or another workload ``kind``) and its one container."""
    dep = objects(kustomization, kind)[name]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return dep, container


def workloads(kustomization: str) -> list[dict[str, Any]]:
    return [*objects(kustomization, "Deployment").values(), *objects(kustomization, "StatefulSet").values()]


@cache
def validator(kind: str, api_version: str) -> Any:  # a jsonschema validator of the kind's schema
    import jsonschema

    group, _, version = api_version.rpartition("/")
    name = "-".join(p for p in (kind.lower(), group.split(".")[0], version) if p)
    path = SCHEMAS / f"{name}.json"
    assert path.is_file(), f"no schema for {kind} {api_version}: add {name} to scripts/k8s_schemas.py and run it"
    schema = json.loads(path.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def violations(doc: dict[str, Any]) -> list[str]:
    """What the schema of ``doc``'s kind finds wrong with it, one line each (a ValidationError's
    own text carries the whole schema, half a megabyte for a Deployment)."""
    where = f"{doc['kind']}/{doc['metadata']['name']}"
    return [f"{where} at {'.'.join(map(str, e.absolute_path)) or '/'}: {e.message[:300]}"
            for e in validator(doc["kind"], doc["apiVersion"]).iter_errors(doc)]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_rendered_object_follows_its_kubernetes_schema(kustomization):
    docs = render(kustomization)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap", "HorizontalPodAutoscaler",
            "PersistentVolumeClaim"} <= kinds
    found = [v for doc in docs for v in violations(doc)]
    assert not found, "\n".join(found)
    images = [c["image"] for d in workloads(kustomization) for c in d["spec"]["template"]["spec"]["containers"]]
    assert all(re.search(r":[\w.-]+$", i) for i in images if i != "ragqa"), images  # pinned tags
    if kustomization != "base":  # an overlay names the real ragqa image
        assert "ragqa" not in images and {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} \
            == {"ragqa"}


def test_the_schemas_reject_a_broken_object():
    dep = json.loads(json.dumps(deployment("base", "ragqa-api")[0]))
    assert violations(dep) == []
    container = dep["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")  # a misspelt field (strict schemas)
    dep["spec"]["replicas"] = "two"
    found = violations(dep)
    assert any("spec.template.spec.containers.0" in v and "'readinesProbe' was unexpected" in v for v in found), found
    assert any("spec.replicas" in v and "'two'" in v for v in found), found


def selects(selector: dict[str, str], dep: dict[str, Any]) -> bool:
    labels = dep["spec"]["template"]["metadata"]["labels"]
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def service_port(kustomization: str, service: str, dep_name: str, kind: str = "Deployment") -> int:
    """The Service's port, after checking that it selects the workload's pods and that its
    targetPort is one of the container's ports."""
    svc = objects(kustomization, "Service")[service]
    dep, container = deployment(kustomization, dep_name, kind)
    assert selects(svc["spec"]["selector"], dep)
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] in {p.get("name") for p in container["ports"]} | {p["containerPort"]
                                                                                for p in container["ports"]}
    return port["port"]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_api_is_probed_on_ready_and_health_and_has_resources(kustomization):
    dep, api = deployment(kustomization, "ragqa-api")
    assert api["command"][:2] == ["ragqa", "serve"] and "0.0.0.0" in api["command"]
    port = api["command"][api["command"].index("--port") + 1]
    assert [p["containerPort"] for p in api["ports"]] == [int(port)]
    assert api["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert api["livenessProbe"]["httpGet"]["path"] == "/health"
    for res in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(api["resources"][res])
    assert service_port(kustomization, "ragqa-api", "ragqa-api") == 8000
    (pdb,) = objects(kustomization, "PodDisruptionBudget").values()
    assert selects(pdb["spec"]["selector"]["matchLabels"], dep)
    # The state is in PostgreSQL: the data directory is the pod's own (the QA log), nothing shared.
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in api["volumeMounts"]}
    assert "emptyDir" in volumes["data"] and mounts["data"] == container_env(kustomization, api)["RAG_DATA_DIR"]
    assert "emptyDir" in volumes["metrics"] and mounts["metrics"] == container_env(kustomization, api)[
        "PROMETHEUS_MULTIPROC_DIR"]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_no_volume_is_shared_between_pods(kustomization):
    pvcs = objects(kustomization, "PersistentVolumeClaim")
    claims = [t["spec"] for s in objects(kustomization, "StatefulSet").values()
              for t in s["spec"]["volumeClaimTemplates"]] + [p["spec"] for p in pvcs.values()]
    assert claims and all(c["accessModes"] == ["ReadWriteOnce"] for c in claims), claims
    users: dict[str, list[str]] = {}
    for dep in workloads(kustomization):
        for volume in dep["spec"]["template"]["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                users.setdefault(volume["persistentVolumeClaim"]["claimName"], []).append(dep["metadata"]["name"])
    assert users == {"vllm-model-cache": ["vllm"]}  # and vLLM runs one pod (Recreate, below)


def adapter_metrics() -> dict[str, tuple[str, str]]:
    """The custom metrics the Prometheus adapter's rules serve: name -> (series, query)."""
    import yaml

    rules = yaml.safe_load((K8S / "prometheus-adapter.yaml").read_text())["rules"]["custom"]
    out = {}
    for rule in rules:
        series = re.match(r"\s*([A-Za-z_:][\w:]*)", rule["seriesQuery"]).group(1)
        # the adapter's `as` is a Go regexp replacement: ${1} -> \g<1>
        name = re.sub(rule["name"]["matches"], re.sub(r"\$\{(\d+)\}", r"\\g<\1>", rule["name"]["as"]), series)
        out[name] = (series, rule["metricsQuery"])
    return out


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_api_scales_on_questions_per_second_served_by_the_adapter_with_cpu_as_fallback(kustomization):
    from serve.metrics import REGISTRY
    from serve.routes_ask import router as ask
    from serve.routes_chat import router as chat

    (hpa,) = objects(kustomization, "HorizontalPodAutoscaler").values()
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "ragqa-api")
    assert 1 < hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"  # the fallback without the adapter
    pods = metrics["Pods"]["pods"]
    served = adapter_metrics()
    assert pods["metric"]["name"] in served, (pods["metric"]["name"], sorted(served))
    series, query = served[pods["metric"]["name"]]
    exported = {m.name + ("_total" if m.type == "counter" else "") for m in REGISTRY.collect()}
    assert series in exported, f"ragqa exports no {series}"
    routes = re.search(r'route=~"([^"]+)"', query).group(1).split("|")
    paths = {r.path for r in [*ask.routes, *chat.routes]}
    assert routes and set(routes) <= paths, (routes, paths)  # the question routes, as the app names them
    assert float(pods["target"]["averageValue"]) > 0


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_scheduler_has_a_standby_that_the_lease_on_the_shared_state_keeps_waiting(kustomization, tmp_path,
                                                                                        monkeypatch):
    from ingest.leader import AdvisoryLease, lease_for

    dep, scheduler = deployment(kustomization, "ragqa-scheduler")
    assert scheduler["command"] == ["ragqa", "schedule"]
    assert dep["spec"]["replicas"] == 2
    autoscaled = {h["spec"]["scaleTargetRef"]["name"] for h in objects(kustomization, "HorizontalPodAutoscaler").values()}
    assert "ragqa-scheduler" not in autoscaled
    # Two are safe only because they share one lease: an advisory lock in the PostgreSQL state. A
    # SQLite state's lease is a file lock, which pods with data directories of their own never share.
    lease = lease_for(settings_of(kustomization, scheduler, monkeypatch).state_url, tmp_path)
    try:
        assert isinstance(lease, AdvisoryLease)
    finally:
        lease.release()  # never acquired: no connection was made
    terms = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(selects(t["podAffinityTerm"]["labelSelector"]["matchLabels"], dep) for t in terms)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_ragqa_keeps_its_state_in_the_postgresql_it_deploys(kustomization, monkeypatch):
    from sqlalchemy import make_url

    sts, pg = deployment(kustomization, "postgres", "StatefulSet")
    assert re.fullmatch(r"postgres:\d+\.\d+", pg["image"]), pg["image"]
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["serviceName"] == "postgres"
    port = service_port(kustomization, "postgres", "postgres", "StatefulSet")
    pg_env = {v["name"]: v for v in pg["env"]}
    (template,) = sts["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in pg["volumeMounts"]}
    assert pg_env["PGDATA"]["value"].startswith(mounts[template["metadata"]["name"]] + "/")
    assert pg["readinessProbe"]["exec"]["command"][0] == "pg_isready"
    # the server drops a dead node's session, and with it the scheduler's lease, within minutes
    conf = dict(a.split("=", 1) for a in pg["args"] if "=" in a)  # its -c settings
    assert int(conf["tcp_keepalives_idle"]) + int(conf["tcp_keepalives_interval"]) * int(
        conf["tcp_keepalives_count"]) <= 180
    # Room for every ragqa process at the autoscaler's largest: each keeps a pool for reads and a
    # connection for writes (ingest/state.py; an API process writes little), and a scheduler
    # also its job store's pool and its lease's connection.
    from ingest.state_sql import make_engine

    pool = make_engine("postgresql+psycopg://ragqa@postgres/ragqa").pool.size()
    (hpa,) = objects(kustomization, "HorizontalPodAutoscaler").values()
    api = deployment(kustomization, "ragqa-api")[1]["command"]
    api_processes = hpa["spec"]["maxReplicas"] * (int(api[api.index("--workers") + 1]) + 1)  # + the supervisor
    schedulers = deployment(kustomization, "ragqa-scheduler")[0]["spec"]["replicas"] + 1  # + a rollout's
    needed = api_processes * (pool + 1) + schedulers * (2 * pool + 2)
    assert int(conf["max_connections"]) >= needed, (needed, conf["max_connections"])
    for name in ("ragqa-api", "ragqa-scheduler"):
        container = deployment(kustomization, name)[1]
        url = make_url(settings_of(kustomization, container, monkeypatch).state_url)
        assert (url.drivername, url.host, url.port) == ("postgresql+psycopg", "postgres", port)
        assert (url.username, url.database) == (pg_env["POSTGRES_USER"]["value"], pg_env["POSTGRES_DB"]["value"])
        assert url.password is None  # libpq reads PGPASSWORD: the same secret key the server's password is
        password = next(v for v in container["env"] if v["name"] == "PGPASSWORD")
        assert password["valueFrom"] == pg_env["POSTGRES_PASSWORD"]["valueFrom"]


def arg(args: list[str], flag: str) -> str | None:
    value = next((a.split("=", 1)[1] for a in args if a.startswith(flag + "=")), None)
    if value is None and flag in args:
        value = args[args.index(flag) + 1]
    return value


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_vllm_splits_an_awq_model_across_its_gpus_with_prefix_caching(kustomization):
    import yaml

    dep, vllm = deployment(kustomization, "vllm")
    args = vllm["args"]
    gpus = vllm["resources"]["limits"]["nvidia.com/gpu"]
    assert int(arg(args, "--tensor-parallel-size")) == int(gpus) >= 1
    assert "--enable-prefix-caching" in args
    assert "awq" in arg(args, "--quantization") and "AWQ" in args[0]
    # below the GpuMemoryHigh alert's threshold, or the alert fires for vLLM's own reservation
    rules = [r for g in yaml.safe_load((INFRA / "prometheus/alerts.yml").read_text())["groups"] for r in g["rules"]]
    threshold = float(re.search(r"> (0\.\d+)", next(r["expr"] for r in rules if r.get("alert") == "GpuMemoryHigh"))[1])
    assert float(arg(args, "--gpu-memory-utilization")) <= threshold - 0.05
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"
    mounts = {m["name"]: m["mountPath"] for m in vllm["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    claim = volumes["model-cache"]["persistentVolumeClaim"]["claimName"]
    assert claim in objects(kustomization, "PersistentVolumeClaim")
    assert mounts["model-cache"] == "/root/.cache/huggingface"
    assert dep["spec"]["strategy"]["type"] == "Recreate"  # the model cache is ReadWriteOnce
    assert service_port(kustomization, "vllm", "vllm") == int(arg(args, "--port"))


def container_env(kustomization: str, container: dict[str, Any]) -> dict[str, str]:
    """A container's environment as Kubernetes would set it: its ConfigMaps (envFrom), then its
    own variables, with each secret key's test value."""
    config_maps = objects(kustomization, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]]["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = SECRETS[ref["name"], ref["key"]]
    return env


def settings_of(kustomization: str, container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """ragqa's Settings in ``container``'s environment (and none of this process's RAG_ variables)."""
    from rag.config import Settings

    for key in [k for k in os.environ if k.startswith("RAG_")]:
        monkeypatch.delenv(key)
    for key, value in container_env(kustomization, container).items():
        monkeypatch.setenv(key, value)
    return Settings.load(None)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
@pytest.mark.parametrize("name", ["ragqa-api", "ragqa-scheduler"])
def test_every_rag_variable_of_a_ragqa_container_is_a_setting_and_validates(kustomization, name, monkeypatch):
    env = container_env(kustomization, deployment(kustomization, name)[1])
    names = [k for k in env if k.startswith("RAG_")]
    assert names and all(setting_path_exists(k) for k in names), [k for k in names if not setting_path_exists(k)]
    settings = settings_of(kustomization, deployment(kustomization, name)[1], monkeypatch)
    assert settings.lexical.backend == "elasticsearch" and settings.vector.backend == "milvus"
    assert settings.generator.backend == "openai" and settings.cache.backend == "redis"
    assert settings.lexical.password is not None and settings.lexical.password.get_secret_value() == "es-secret"
    assert settings.state.url is not None and settings.state.url.startswith("postgresql")
    if name == "ragqa-api":
        assert [k.id for k in settings.serve.api_keys] == ["ops"]
    # the generator is this deployment's vLLM, serving the model ragqa asks for
    vllm_args = deployment(kustomization, "vllm")[1]["args"]
    assert settings.generator.model == vllm_args[0]
    port = service_port(kustomization, "vllm", "vllm")
    assert settings.generator.base_url == f"http://vllm:{port}/v1"


def test_the_documented_secret_has_every_key_the_manifests_read():
    keys = {v["valueFrom"]["secretKeyRef"]["key"] for k in KUSTOMIZATIONS
            for d in workloads(k) for c in d["spec"]["template"]["spec"]["containers"]
            for v in c.get("env", []) if "valueFrom" in v}
    assert keys == {key for _, key in SECRETS}
    for doc in (K8S / "base/kustomization.yaml", INFRA / "README.md"):
        documented = set(re.findall(r"--from-literal=([\w.-]+)=", doc.read_text()))
        assert documented == keys, (doc, documented)


def relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus' relabelling (keep, drop, replace), enough to run the scrape jobs' rules on a
    pod's discovered labels. Debian's promtool is built without Kubernetes discovery, so it
    cannot check this file."""
    labels = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action in ("keep", "drop"):
            if (match is None) == (action == "keep"):
                return None
        elif action == "replace":
            if match is not None:
                labels[rule["target_label"]] = match.expand(
                    re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule.get("replacement", "$1")))
        else:
            raise AssertionError(f"relabel action {action} is not simulated here")
    return labels


def discovered(dep: dict[str, Any], namespace: str) -> dict[str, str]:
    """The labels Prometheus' pod discovery gives a pod of ``dep`` (one per container port)."""
    meta = dep["spec"]["template"]["metadata"]
    (port,) = dep["spec"]["template"]["spec"]["containers"][0].get("ports") or [{"containerPort": 9999}]
    labels = {"__address__": f"10.1.2.3:{port['containerPort']}", "__metrics_path__": "/metrics",
              "__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": dep["metadata"]["name"] + "-x"}
    for kind, values in (("label", meta.get("labels", {})), ("annotation", meta.get("annotations", {}))):
        for key, value in values.items():
            labels[f"__meta_kubernetes_pod_{kind}_" + re.sub(r"\W", "_", key)] = value
    return labels


def test_prometheus_scrapes_each_api_pod_and_vllm_with_the_labels_the_adapter_needs():
    import yaml

    jobs = {j["job_name"]: j for j in yaml.safe_load((K8S / "prometheus-scrape.yaml").read_text())["scrape_configs"]}
    assert set(jobs) == {"ragqa", "vllm"}  # the job names the alerts use
    adapter = yaml.safe_load((K8S / "prometheus-adapter.yaml").read_text())["rules"]["custom"]
    needed = {label for rule in adapter for label in rule["resources"]["overrides"]}
    namespace = {d["metadata"]["namespace"] for d in objects("overlays/production", "Deployment").values()}.pop()
    scraped = {}
    for name, dep in objects("overlays/production", "Deployment").items():
        for job_name, job in jobs.items():
            (sd,) = job["kubernetes_sd_configs"]
            assert sd["role"] == "pod" and sd["namespaces"]["names"] == [namespace]
            target = relabel(discovered(dep, namespace), job["relabel_configs"])
            if target is not None:
                scraped[name] = job_name
                ports = [p["containerPort"] for c in dep["spec"]["template"]["spec"]["containers"] for p in c["ports"]]
                assert target["__address__"] == f"10.1.2.3:{ports[0]}" and target["__metrics_path__"] == "/metrics"
                assert needed <= set(target) and target["pod"] == name + "-x"
    assert scraped == {"ragqa-api": "ragqa", "vllm": "vllm"}  # each pod once; the scheduler serves no HTTP
