"""Kubernetes manifests for one config, as plain dicts: kustomize-ready, one file per kind.

The patterns are NVIDIA's (https://github.com/triton-inference-server/tutorials/tree/main/Deployment/Kubernetes,
TensorRT-LLM_Autoscaling_and_Load_Balancing and EKS_Multinode_Triton_TRTLLM): the autoscaling
tutorial's Deployment (probes on /v2/health/*, ports 8000/8001/8002, nvidia.com/gpu = tp x pp, /dev/shm
as a memory emptyDir, a PodMonitor and an HPA through prometheus-adapter), and the EKS multi-node
guide's LeaderWorkerSet (group size = tp x pp / GPUs per node, a Service on the leader, ranks started
from the leader over kubessh, so the pods need exec RBAC). Where each stage runs (downloads in a Job
without GPUs, a build on the GPUs a server pod already holds) is stages.py's; sizes and time budgets
are sizing.py's; cluster_check.py reads the result as the scheduler and the controllers would. Pods
run non-root with a read-only root filesystem.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from trtspec.build.builder import SKIP_WARM_UP_ENV
from trtspec.config import DeploymentConfig
from trtspec.deploy import monitoring, sizing, stages
from trtspec.deploy.topology import CONFIG_PATH, WORKSPACE, Topology, image_for, topology

Manifest = dict[str, Any]

UID = 1000  # the triton-server user of NVIDIA's Triton images; Dockerfile.cpu creates the same
HF_TOKEN_DIR = "/var/run/secrets/huggingface"
LWS_API = "leaderworkerset.x-k8s.io/v1"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU Feature Discovery's
GROUP_KEY_FIELD = "metadata.labels['leaderworkerset.sigs.k8s.io/group-key']"


def local_checkpoints(cfg: DeploymentConfig) -> dict[str, dict[str, str]]:
    """Role -> {local dir: where the pods expect it on the volume} (the README step copies it there). Two
    folders of one name (.../target/hf and .../draft/hf, a model and its self-draft cut) get two places."""
    moved: dict[str, dict[str, str]] = {}
    for role in ("target", "draft"):
        section = getattr(cfg, role)
        if section is None or section.checkpoint.startswith("embedded:"):
            continue
        local = cfg.checkpoint_path(section)
        if local is None:
            continue
        taken = {dest: src for places in moved.values() for src, dest in places.items()}
        dest = str(WORKSPACE / "checkpoints" / local.name)
        if taken.get(dest, str(local)) != str(local):
            dest = str(WORKSPACE / "checkpoints" / f"{local.name}-{role}")
        moved[role] = {str(local): dest}
    return moved


def cluster_config(cfg: DeploymentConfig) -> dict[str, Any]:
    """The config as the pods read it: engines and repository on the shared volume, local
    checkpoints under /workspace/checkpoints, embedded ones and hub ids as they are."""
    data = cfg.model_dump(mode="json", exclude_none=True)
    data["build"]["output_dir"] = str(WORKSPACE / "engines")
    data["serve"]["repository"] = str(WORKSPACE / "model_repository")
    for role, moved in local_checkpoints(cfg).items():
        data[role]["checkpoint"] = next(iter(moved.values()))
    for item in stages.fetches(cfg):  # hub ids: the Job downloads them onto the volume (no GPU held)
        for role in ("target", "draft"):
            if role in data and data[role]["checkpoint"] == item.repo_id:
                data[role]["checkpoint"] = str(item.local)
    return data


def _labels(cfg: DeploymentConfig, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "trtspec",
        "app.kubernetes.io/instance": cfg.name,
        "app.kubernetes.io/component": component,
    }


def _meta(cfg: DeploymentConfig, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": cfg.deploy.namespace, "labels": _labels(cfg, component)}


def _resources(cfg: DeploymentConfig, topo: Topology, stage: str = "serve", gpus: bool = True) -> dict[str, Any]:
    """NVIDIA's chart: CPU max(4, GPUs) and 8Gi of memory per CPU, or more where the weights need it
    (sizing.py); a CPU variant gets 2 CPU. `gpus=False`: a container that must not hold any."""
    cpus = max(4, topo.gpus_per_pod) if not topo.cpu_only else 2
    cpu = cfg.deploy.cpu or str(cpus)
    amounts: dict[str, Any] = {"cpu": cpu, "memory": sizing.memory_limit(cfg, stage)}
    if topo.gpus_per_pod and gpus:
        amounts["nvidia.com/gpu"] = topo.gpus_per_pod
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _probe(path: str, period: int, failures: int, delay: int = 0) -> dict[str, Any]:
    probe: dict[str, Any] = {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period}
    probe["failureThreshold"] = failures
    if delay:
        probe["initialDelaySeconds"] = delay
    return probe


STARTUP_PERIOD_S = 10
FETCH_RESOURCES = {"cpu": "2", "memory": "8Gi"}


def _container(
    cfg: DeploymentConfig,
    topo: Topology,
    name: str,
    args: list[str],
    resources: dict[str, Any],
    *,
    shm: bool,
    budgets: sizing.Budgets,
    serving: bool = False,
    wait_s: int | None = None,
) -> dict[str, Any]:
    """`shm`: the caller, which knows the container's role, says whether it uses /dev/shm (ranks, NCCL,
    the python backend: servers, workers and a build on the GPUs; not the Job or a pod that only waits).
    `budgets`: sizing.budgets(cfg), computed once per render (k8s.render) and passed down."""
    env = [
        {"name": "TRTSPEC_CONFIG", "value": str(CONFIG_PATH)},
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": str(WORKSPACE / "hf-cache")},
    ]
    if cfg.deploy.hf_token_secret:  # a file, not an env var: huggingface_hub reads HF_TOKEN_PATH
        env.append({"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/token"})
    if topo.multi_node and serving:
        env.append({"name": "GROUP_KEY", "valueFrom": {"fieldRef": {"fieldPath": GROUP_KEY_FIELD}}})
    if wait_s is not None:  # how long this stage waits for the one before it (sizing.Budgets)
        env.append({"name": "TRTSPEC_WAIT_S", "value": str(wait_s)})
    if stages.needs_job(cfg) and (name != "triton"):  # the Job, and who waits for it, know which Job it is
        env.append({"name": "TRTSPEC_JOB", "value": job_name(cfg)})
        env.append({"name": "TRTSPEC_JOB_ATTEMPTS", "value": str(JOB_ATTEMPTS)})
    container: dict[str, Any] = {
        "name": name,
        "image": image_for(cfg),
        "imagePullPolicy": pull_policy(cfg),
        "args": args,
        "env": env,
        "resources": resources,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": _mounts(cfg, shm=shm),
    }
    if serving:
        s = cfg.serve
        # all interfaces, said explicitly: `trtspec serve` alone binds loopback, which no Service reaches
        env.append({"name": "TRTSPEC_SERVE_HOST", "value": "0.0.0.0"})
        container["ports"] = [
            {"name": "http", "containerPort": s.http_port},
            {"name": "grpc", "containerPort": s.grpc_port},
            {"name": "metrics", "containerPort": s.metrics_port},
        ]
        # The build ran in an init container (no probes there): the startup probe covers loading only.
        load_s = budgets.load_s
        container["startupProbe"] = _probe("/v2/health/ready", STARTUP_PERIOD_S, -(-load_s // STARTUP_PERIOD_S))
        container["readinessProbe"] = _probe("/v2/health/ready", 5, 3)
        container["livenessProbe"] = _probe("/v2/health/live", 10, 6)
    # Workers and the Job serve nothing; the leader's probes cover a group (RecreateGroupOnPodRestart).
    return container


def _init_container(cfg: DeploymentConfig, topo: Topology, budgets: sizing.Budgets) -> dict[str, Any]:
    """Before a server (a group's leader) starts: build on its own GPUs, or wait for the Job's build."""
    fetch_args = [f.arg for f in stages.fetches(cfg)]
    if stages.build_needs_gpu(cfg):
        resources = _resources(cfg, topo, "build")
        # as long as the Job may take to download, retries included (a failed Job ends the wait sooner)
        wait_s = JOB_ATTEMPTS * budgets.download_s
        args = ["build", *fetch_args]
        return _container(cfg, topo, "build", args, resources, shm=True, budgets=budgets, wait_s=wait_s)
    # a polling loop, but it loads trtspec's config and repository code (torch among its imports)
    small = {"cpu": "250m", "memory": "1Gi"}
    resources = {"requests": dict(small), "limits": dict(small)}
    wait_s = job_deadline_s(budgets)
    return _container(cfg, topo, "wait", ["wait", *fetch_args], resources, shm=False, budgets=budgets, wait_s=wait_s)


def pull_policy(cfg: DeploymentConfig) -> str:
    """Always for an image in a registry; IfNotPresent for a bare local tag (`kind load`, `minikube image
    load`), which no registry serves: Always would fail with ErrImagePull."""
    return "Always" if "/" in image_for(cfg) else "IfNotPresent"


def _pod_annotations(cfg: DeploymentConfig) -> dict[str, str]:
    """The serving digest rolls the pods when what they serve changes (not on alert or HPA edits); a local
    tag carries checkov's skip of CKV_K8S_15 (pull policy Always), with the reason, on this object only."""
    notes = {"trtspec.dev/config-digest": cfg.serving_digest()[:16]}
    if pull_policy(cfg) != "Always":
        notes["checkov.io/skip1"] = "CKV_K8S_15=a bare local tag (kind/minikube image load) cannot be pulled"
    return notes


def _mounts(cfg: DeploymentConfig, shm: bool = True) -> list[dict[str, Any]]:
    """/dev/shm (memory, counted against the limit) only where ranks, NCCL or the python backend use it."""
    mounts = [
        {"name": "workspace", "mountPath": str(WORKSPACE)},
        {"name": "config", "mountPath": str(CONFIG_PATH.parent), "readOnly": True},
        *([{"name": "dshm", "mountPath": "/dev/shm"}] if shm else []),
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if cfg.deploy.hf_token_secret:
        mounts.append({"name": "hf-token", "mountPath": HF_TOKEN_DIR, "readOnly": True})
    return mounts


def _volumes(cfg: DeploymentConfig, shm: bool = True) -> list[dict[str, Any]]:
    volumes = [
        {"name": "workspace", "persistentVolumeClaim": {"claimName": f"{cfg.name}-workspace"}},
        {"name": "config", "configMap": {"name": f"{cfg.name}-config"}},
        *([{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": sizing.shm_size(cfg)}}] if shm else []),
        {"name": "tmp", "emptyDir": {}},
    ]
    if cfg.deploy.hf_token_secret:
        secret = {"secretName": cfg.deploy.hf_token_secret, "items": [{"key": "HF_TOKEN", "path": "token"}]}
        volumes.append({"name": "hf-token", "secret": secret})
    return volumes


def _pod(
    cfg: DeploymentConfig,
    topo: Topology,
    containers: list[dict[str, Any]],
    account: str | None,
    init: list[dict[str, Any]] = (),  # type: ignore[assignment]
    gpus: bool = True,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": account is not None,
        **({"initContainers": list(init)} if init else {}),
        "containers": containers,
        "volumes": _volumes(cfg, shm=any(m["name"] == "dshm" for c in containers for m in c["volumeMounts"])),
    }
    if account:
        spec["serviceAccountName"] = account
    if cfg.deploy.node_selector:
        spec["nodeSelector"] = dict(cfg.deploy.node_selector)
    if not topo.cpu_only:  # the Job too: deploy.node_selector may pick the tainted GPU nodes for it as well
        spec["tolerations"] = [t.model_dump(exclude_none=True) for t in cfg.deploy.tolerations]
    # only GPUs whose memory holds the weights per GPU (and, for engines, of the architecture they are built for)
    if not topo.cpu_only and gpus and (products := sizing.gpu_products(cfg)):
        term = {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": products}
        required = {"nodeSelectorTerms": [{"matchExpressions": [term]}]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    if cfg.deploy.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": cfg.deploy.image_pull_secret}]
    return spec


def _server_pod(
    cfg: DeploymentConfig, topo: Topology, args: list[str], account: str | None, budgets: sizing.Budgets
) -> dict[str, Any]:
    # the leader waits for its group's pods within the load budget, so its own message comes before the probe's
    wait_s = budgets.load_s if args == ["leader"] else None
    resources = _resources(cfg, topo)
    main = _container(cfg, topo, "triton", args, resources, shm=True, budgets=budgets, serving=True, wait_s=wait_s)
    return _pod(cfg, topo, [main], account, init=[_init_container(cfg, topo, budgets)])


def namespace(cfg: DeploymentConfig) -> Manifest:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cfg.deploy.namespace}}


def config_map(cfg: DeploymentConfig) -> Manifest:
    text = yaml.safe_dump(cluster_config(cfg), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cfg, f"{cfg.name}-config", "config"),
        "data": {CONFIG_PATH.name: text},
    }


def volume_claim(cfg: DeploymentConfig, topo: Topology) -> Manifest:
    """Pods of a group, or replicas the HPA adds, land on different nodes: they need ReadWriteMany."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany" if sizing.read_write_many(cfg) else "ReadWriteOnce"],
        "resources": {"requests": {"storage": cfg.deploy.storage.size}},
    }
    if cfg.deploy.storage.storage_class:
        spec["storageClassName"] = cfg.deploy.storage.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(cfg, f"{cfg.name}-workspace", "storage"),
        "spec": spec,
    }


def prepare_job(cfg: DeploymentConfig, topo: Topology, budgets: sizing.Budgets) -> Manifest:
    """Downloads, and the build where it needs no GPU (stages.py): a Job that never asks for a GPU, so the
    servers holding theirs while they wait for it can never keep it from running."""
    args = ["prepare", *(f.arg for f in stages.fetches(cfg))]
    if stages.job_builds(cfg):
        resources = _resources(cfg, topo, "build", gpus=False)
    else:  # downloads only: a few streams to disk
        resources = {"requests": dict(FETCH_RESOURCES), "limits": dict(FETCH_RESOURCES)}
    container = _container(cfg, topo, "prepare", args, resources, shm=False, budgets=budgets)
    if topo.multi_node:  # the warm-up load would need the whole group; the leader's start proves it instead
        container["env"].append({"name": SKIP_WARM_UP_ENV, "value": "1"})
    pod = _pod(cfg, topo, [container], None, gpus=False)
    pod["restartPolicy"] = "Never"
    notes = _pod_annotations(cfg)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        # Named by the config digest: a Job's template is immutable, so a changed config is a new Job.
        # (Job names feed a 63-character label, hence the cut.)
        "metadata": {**_meta(cfg, job_name(cfg), "prepare"), "annotations": notes},
        "spec": {
            "backoffLimit": JOB_ATTEMPTS - 1,
            # the downloads may take hours: a deadline from the budgets, not the default of none
            "activeDeadlineSeconds": job_deadline_s(budgets),
            "template": {"metadata": {"labels": _labels(cfg, "prepare"), "annotations": notes}, "spec": pod},
        },
    }


JOB_ATTEMPTS = 3  # the prepare Job's pod runs at most this often (backoffLimit + 1)


def job_deadline_s(budgets: sizing.Budgets) -> int:
    """Every attempt may take the whole download and build budget; whoever waits for the Job waits this long."""
    return JOB_ATTEMPTS * (budgets.download_s + budgets.build_s)


def job_name(cfg: DeploymentConfig) -> str:
    return f"{cfg.name[:46]}-prepare-{cfg.serving_digest()[:8]}"


def service_name(cfg: DeploymentConfig) -> str:
    """Not the workload's own name: a LeaderWorkerSet's controller creates a headless Service of that
    name for its pods' DNS (subdomainPolicy Shared), and a Service applied first would take it."""
    return f"{cfg.name[:59]}-api"


def deployment(cfg: DeploymentConfig, topo: Topology, budgets: sizing.Budgets) -> Manifest:
    labels = _labels(cfg, "server")
    template = {"metadata": {"labels": labels, "annotations": _pod_annotations(cfg)}}
    spec: dict[str, Any] = {
        **_replicas(cfg),
        "selector": {"matchLabels": labels},
        # GPUs are scarce: replace a pod in place rather than ask for a surge pod's GPUs.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        "template": {**template, "spec": _server_pod(cfg, topo, ["serve"], None, budgets)},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**_meta(cfg, cfg.name, "server"), "annotations": _pod_annotations(cfg)},
        "spec": spec,
    }


def _replicas(cfg: DeploymentConfig) -> dict[str, int]:
    """With the HPA on, replicas is its to set: a value here would undo its choice on every apply."""
    return {} if cfg.deploy.autoscaling.enabled else {"replicas": cfg.deploy.replicas}


def leader_worker_set(cfg: DeploymentConfig, topo: Topology, budgets: sizing.Budgets) -> Manifest:
    account = f"{cfg.name}-launcher"
    leader_labels = {**_labels(cfg, "server"), "trtspec.dev/role": "leader"}
    worker_labels = {**_labels(cfg, "server"), "trtspec.dev/role": "worker"}
    # a worker hosts ranks the leader starts over kubessh: NCCL and MPI use its /dev/shm
    worker = _container(cfg, topo, "triton", ["worker"], _resources(cfg, topo), shm=True, budgets=budgets)
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": _meta(cfg, cfg.name, "server"),
        "spec": {
            **_replicas(cfg),
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": topo.pods_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": leader_labels, "annotations": _pod_annotations(cfg)},
                    "spec": _server_pod(cfg, topo, ["leader"], account, budgets),
                },
                "workerTemplate": {  # workers are exec'd into; they need no API access themselves
                    "metadata": {"labels": worker_labels, "annotations": _pod_annotations(cfg)},
                    "spec": _pod(cfg, topo, [worker], None),
                },
            },
        },
    }


def launcher_rbac(cfg: DeploymentConfig) -> list[Manifest]:
    """kubessh is `kubectl exec`: the leader may list the group's pods and exec into them, nothing more."""
    name = f"{cfg.name}-launcher"
    meta = _meta(cfg, name, "launcher")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": True},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                # kubectl exec over WebSocket (the default since 1.30) is authorized as `get`, SPDY as `create`
                {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cfg.deploy.namespace}],
        },
    ]


def _serving_selector(cfg: DeploymentConfig, topo: Topology) -> dict[str, str]:
    selector = _labels(cfg, "server")
    if topo.multi_node:  # only the leader serves and exports metrics
        selector["trtspec.dev/role"] = "leader"
    return selector


def service(cfg: DeploymentConfig, topo: Topology) -> Manifest:
    s = cfg.serve
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(cfg, service_name(cfg), "server"),
        "spec": {
            "type": cfg.deploy.service_type,
            "selector": _serving_selector(cfg, topo),
            "ports": [
                {"name": "http", "port": s.http_port, "targetPort": "http"},
                {"name": "grpc", "port": s.grpc_port, "targetPort": "grpc"},
                {"name": "metrics", "port": s.metrics_port, "targetPort": "metrics"},
            ],
        },
    }


def network_policy(cfg: DeploymentConfig) -> Manifest:
    """Ingress only to the serving ports, plus anything between the deployment's own pods (a group's
    ranks talk NCCL and MPI on ports nobody fixes). Egress stays open: builds fetch checkpoints."""
    s = cfg.serve
    ports = [{"protocol": "TCP", "port": p} for p in (s.http_port, s.grpc_port, s.metrics_port)]
    own = {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": cfg.name}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(cfg, cfg.name, "server"),
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/instance": cfg.name}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": ports}, {"from": [own]}],
        },
    }


def _monitoring_meta(cfg: DeploymentConfig) -> dict[str, Any]:
    """kube-prometheus-stack selects PodMonitors and rules by its release label: deploy.monitoring_labels."""
    meta = _meta(cfg, cfg.name, "server")
    meta["labels"].update(cfg.deploy.monitoring_labels)
    return meta


def pod_monitor(cfg: DeploymentConfig, topo: Topology) -> Manifest:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _monitoring_meta(cfg),
        "spec": {
            "selector": {"matchLabels": _serving_selector(cfg, topo)},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
            # the rules and the dashboard select this deployment's series by it
            "podTargetLabels": ["app.kubernetes.io/instance"],
        },
    }


def prometheus_rule(cfg: DeploymentConfig) -> Manifest:
    """Recording rules (the per-pod load the HPA reads through prometheus-adapter, the queue-to-compute
    ratio of NVIDIA's autoscaling tutorial, the speculation rates) and the alerts on them."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _monitoring_meta(cfg),
        "spec": {"groups": monitoring.rule_groups(cfg)},
    }


def dashboard_config_map(cfg: DeploymentConfig) -> Manifest:
    """The Grafana dashboard, labelled for the dashboard sidecar of kube-prometheus-stack's Grafana."""
    meta = _meta(cfg, f"{cfg.name}-dashboard"[:63], "monitoring")
    meta["labels"]["grafana_dashboard"] = "1"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {dashboard_file(cfg): json.dumps(monitoring.dashboard(cfg), indent=2)},
    }


def dashboard_file(cfg: DeploymentConfig) -> str:
    return f"trtspec-{cfg.name}.json"


DEFAULT_START_S = 1800  # a new server pod's start when no estimate is given (render passes sizing's load budget)
SCALE_DOWN_PERIOD_S = 300  # one pod removed per period: the load of the ones left shows in a few scrapes
# the API's bounds (autoscaling/v2 HPAScalingRules)
MAX_PERIOD_S, MAX_STABILIZATION_S = 1800, 3600


def autoscaler(cfg: DeploymentConfig, topo: Topology, start_s: int = DEFAULT_START_S) -> Manifest:
    """An HPA on the per-pod load (monitoring.load_signal, recorded as monitoring.LOAD and served by
    prometheus-adapter's rule in monitoring.ADAPTER_VALUES), paced by how long a new pod takes to serve
    (start_s): one pod added per start time, since the load stays high until the pod added last serves;
    scale-down waits at least as long (and at least 5 minutes), one pod at a time, so a dip shorter
    than a restart never gives back a pod it would take start_s to get again."""
    a = cfg.deploy.autoscaling
    target = (
        {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "name": cfg.name}
        if topo.multi_node
        else {"apiVersion": "apps/v1", "kind": "Deployment", "name": cfg.name}
    )
    load = f"{round(monitoring.hpa_target(cfg) * 1000)}m"
    one_pod = {"type": "Pods", "value": 1}
    behavior = {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "policies": [{**one_pod, "periodSeconds": max(1, min(start_s, MAX_PERIOD_S))}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": min(max(start_s, 300), MAX_STABILIZATION_S),
            "policies": [{**one_pod, "periodSeconds": SCALE_DOWN_PERIOD_S}],
        },
    }
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(cfg, cfg.name, "server"),
        "spec": {
            "scaleTargetRef": target,
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": monitoring.LOAD},
                        "target": {"type": "AverageValue", "averageValue": load},
                    },
                }
            ],
            "behavior": behavior,
        },
    }


def render(cfg: DeploymentConfig) -> dict[str, list[Manifest]]:
    """File name -> the manifests in it, in the order kubectl should apply them."""
    topo = topology(cfg)
    budgets = sizing.budgets(cfg)  # once per render: every probe, wait and deadline below derives from it
    files: dict[str, list[Manifest]] = {
        "namespace.yaml": [namespace(cfg)],
        "config.yaml": [config_map(cfg)],
        "storage.yaml": [volume_claim(cfg, topo)],
    }
    if stages.needs_job(cfg):
        files["prepare-job.yaml"] = [prepare_job(cfg, topo, budgets)]
    if topo.multi_node:
        files["launcher-rbac.yaml"] = launcher_rbac(cfg)
        files["leaderworkerset.yaml"] = [leader_worker_set(cfg, topo, budgets)]
    else:
        files["deployment.yaml"] = [deployment(cfg, topo, budgets)]
    files["service.yaml"] = [service(cfg, topo)]
    files["networkpolicy.yaml"] = [network_policy(cfg)]
    files["podmonitor.yaml"] = [pod_monitor(cfg, topo)]
    files["prometheusrule.yaml"] = [prometheus_rule(cfg)]
    files["dashboard.yaml"] = [dashboard_config_map(cfg)]
    if cfg.deploy.autoscaling.enabled:
        files["hpa.yaml"] = [autoscaler(cfg, topo, start_s=budgets.load_s)]
    files["kustomization.yaml"] = [
        {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": cfg.deploy.namespace,
            "resources": list(files),
        }
    ]
    return files
