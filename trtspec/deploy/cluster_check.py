"""Would the rendered objects come up on a cluster? Read as the scheduler and the controllers read them.

Schemas say a manifest is well-formed; this says whether the pods it makes can all be bound and get
ready on the smallest cluster the config allows (every arrival order tried, as a scheduler binds what
arrives first), whether a name we render collides with one a controller creates, and what the
volume, memory and time budgets need from the cluster. `trtspec deploy --check` prints it.

Scheduling here counts GPUs (and the GPU product a pod requires); CPU and memory are assumed to fit
beside them on a GPU node, which the per-pod sizes in sizing.py keep within a node's usual share.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from trtspec.config import DeploymentConfig
from trtspec.deploy import sizing, stages
from trtspec.deploy.topology import topology

Manifest = dict[str, Any]
GPU = "nvidia.com/gpu"
MAX_ORDERS = 5040  # 7! arrival orders: every order for the pod counts these configs make


@dataclass
class Pod:
    """A pod a controller would create, with what it holds and what it waits for before it is ready."""

    name: str
    gpus: int
    products: tuple[str, ...]  # required nvidia.com/gpu.product values; empty: any
    completes: bool  # a Job's pod: gives its GPUs back when done
    after: tuple[str, ...] = ()  # pods that must be done (Jobs) or bound (a group's pods) first
    node: int | None = None


@dataclass
class Node:
    gpus: int
    product: str | None
    free: int = field(init=False)

    def __post_init__(self) -> None:
        self.free = self.gpus


def objects(files: dict[str, list[Manifest]]) -> list[Manifest]:
    """The Kubernetes objects among the rendered files (not kustomization.yaml, not helm values)."""
    return [d for group in files.values() for d in group if "metadata" in d and d.get("kind") != "Kustomization"]


def _requests(pod_spec: dict[str, Any]) -> tuple[int, tuple[str, ...]]:
    """GPUs the scheduler reserves for a pod: max(any init container, sum of the containers)."""

    def gpus(container: dict[str, Any]) -> int:
        return int(container.get("resources", {}).get("requests", {}).get(GPU, 0))

    main = sum(gpus(c) for c in pod_spec.get("containers", []))
    init = max((gpus(c) for c in pod_spec.get("initContainers", [])), default=0)
    terms = (
        pod_spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    products = tuple(
        v
        for t in terms
        for e in t.get("matchExpressions", [])
        if e["key"] == "nvidia.com/gpu.product"
        for v in e["values"]
    )
    return max(main, init), products


def pods(files: dict[str, list[Manifest]]) -> list[Pod]:
    """The pods the workload objects make at their minimum size (the HPA's minReplicas)."""
    docs = [d for group in files.values() for d in group]
    hpa = {
        d["spec"]["scaleTargetRef"]["name"]: d["spec"]["minReplicas"]
        for d in docs
        if d["kind"] == "HorizontalPodAutoscaler"
    }
    out: list[Pod] = []
    jobs = [d for d in docs if d["kind"] == "Job"]
    job_pods = []
    for job in jobs:
        gpus, products = _requests(job["spec"]["template"]["spec"])
        job_pods.append(Pod(f"{job['metadata']['name']}-x", gpus, products, completes=True))
    out += job_pods
    waits = tuple(p.name for p in job_pods)  # every server waits for the Job (downloads, or the build)
    for d in (d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet")):
        name = d["metadata"]["name"]
        replicas = d["spec"].get("replicas", hpa.get(name, 1))
        if d["kind"] == "Deployment":
            gpus, products = _requests(d["spec"]["template"]["spec"])
            out += [Pod(f"{name}-{i}", gpus, products, completes=False, after=waits) for i in range(replicas)]
        elif d["kind"] == "LeaderWorkerSet":
            lwt = d["spec"]["leaderWorkerTemplate"]
            size = lwt["size"]
            for g in range(replicas):
                workers = [
                    Pod(f"{name}-{g}-{i}", *_requests(lwt["workerTemplate"]["spec"]), completes=False)
                    for i in range(1, size)
                ]
                # the leader waits until its group's pods run, then for the repository
                after = waits + tuple(w.name for w in workers)
                out += [Pod(f"{name}-{g}", *_requests(lwt["leaderTemplate"]["spec"]), completes=False, after=after)]
                out += workers
    return out


def smallest_cluster(cfg: DeploymentConfig) -> list[Node]:
    """Exactly the GPUs the config needs at its minimum replicas, of the smallest GPU allowed."""
    topo = topology(cfg)
    a = cfg.deploy.autoscaling
    replicas = a.min_replicas if a.enabled else cfg.deploy.replicas
    if topo.cpu_only:
        return [Node(0, None)]
    products = sizing.gpu_products(cfg)
    product = products[0] if products else None
    per_node = topo.gpus_per_pod if not topo.multi_node else cfg.deploy.gpus_per_node
    return [Node(per_node, product) for _ in range(replicas * topo.pods_per_replica)]


def _fits(pod: Pod, node: Node) -> bool:
    return pod.gpus <= node.free and (not pod.products or node.product is None or node.product in pod.products)


def stuck(pod_list: list[Pod], nodes: list[Node], order: tuple[int, ...]) -> list[str]:
    """Bind pods as they arrive in `order` while any fits; Jobs finish and free their GPUs once what they
    wait for is done. Returns the pods that never get ready (empty: this order comes up)."""
    pods_ = [Pod(p.name, p.gpus, p.products, p.completes, p.after) for p in pod_list]
    nodes_ = [Node(n.gpus, n.product) for n in nodes]
    by_name = {p.name: p for p in pods_}
    done: set[str] = set()
    progress = True
    while progress:
        progress = False
        for i in order:
            pod = pods_[i]
            if pod.node is None and pod.name not in done:
                node = next((j for j, n in enumerate(nodes_) if _fits(pod, n)), None)
                if node is not None:
                    pod.node, nodes_[node].free = node, nodes_[node].free - pod.gpus
                    progress = True
        for pod in pods_:
            if pod.name in done or pod.node is None:
                continue
            ready = all(
                (a in done) if by_name[a].completes else (by_name[a].node is not None or a in done) for a in pod.after
            )
            if ready:
                done.add(pod.name)
                progress = True
                if pod.completes:  # a finished Job's pod gives its GPUs back
                    nodes_[pod.node].free += pod.gpus
    return [p.name for p in pods_ if p.name not in done]


def deadlocks(pod_list: list[Pod], nodes: list[Node]) -> list[str]:
    """One line per arrival order that leaves pods waiting for ever (the first few)."""
    problems = []
    orders = itertools.islice(itertools.permutations(range(len(pod_list))), MAX_ORDERS)
    for order in orders:
        if left := stuck(pod_list, nodes, order):
            arrival = ", ".join(pod_list[i].name for i in order)
            problems.append(f"pods {', '.join(left)} never get ready when they arrive as: {arrival}")
            if len(problems) >= 3:
                break
    return problems


def controller_objects(files: dict[str, list[Manifest]]) -> list[tuple[str, str]]:
    """(kind, name) of what the controllers create from our objects, by each controller's naming."""
    made: list[tuple[str, str]] = []
    for d in objects(files):
        name = d["metadata"]["name"]
        if d["kind"] == "LeaderWorkerSet":
            # LWS: a StatefulSet of leaders named like the LWS, one of workers per group (<lws>-<group>),
            # and with subdomainPolicy Shared (the default) a headless Service named like the LWS
            replicas = d["spec"].get("replicas", 1)
            made += [("StatefulSet", name), ("Service", name)]
            made += [("StatefulSet", f"{name}-{g}") for g in range(replicas)]
    return made


def name_problems(files: dict[str, list[Manifest]]) -> list[str]:
    ours = [(d["kind"], d["metadata"]["name"]) for d in objects(files)]
    problems = [
        f"{kind} {name} is also created by a controller"
        for kind, name in controller_objects(files)
        if (kind, name) in ours
    ]
    for kind, name in ours:
        if kind == "Service" and len(name) > 63:
            problems.append(f"Service {name} is longer than 63 characters (a DNS label)")
        if kind == "LeaderWorkerSet" and len(name) > 63 - len("-0-00-") - 10:
            # pods <lws>-<group>-<index> and the StatefulSet revision label <sts>-<10-char hash> are labels
            problems.append(f"LeaderWorkerSet {name} is too long for its pods' names and revision labels")
    return problems


@dataclass
class Finding:
    level: str  # "error" or "info"
    what: str


def check(cfg: DeploymentConfig, files: dict[str, list[Manifest]]) -> list[Finding]:
    """Everything a cluster would trip over, most serious first."""
    findings: list[Finding] = []
    if reason := sizing.fits(cfg):
        findings.append(Finding("error", reason))
    pod_list, nodes = pods(files), smallest_cluster(cfg)
    locked = deadlocks(pod_list, nodes)
    findings += [Finding("error", f"deadlock: {p}") for p in locked]
    findings += [Finding("error", f"name: {p}") for p in name_problems(files)]
    if sizing.needs_storage_class(cfg):
        findings.append(
            Finding(
                "error",
                "the volume is ReadWriteMany (pods on several nodes) and deploy.storage.storage_class is unset: "
                "most default storage classes are ReadWriteOnce and the claim would stay Pending; set it to a "
                "ReadWriteMany class, or keep one node (deploy.autoscaling.enabled false, replicas 1)",
            )
        )
    b = sizing.budgets(cfg)
    gpus = sum(n.gpus for n in nodes)
    products = ", ".join(sizing.gpu_products(cfg)) or "any"
    verdict = "do not all come up" if locked else "come up in every arrival order"
    cluster = f"{len(nodes)} node(s), {gpus} GPU(s) ({products})"
    findings.append(Finding("info", f"smallest cluster: {cluster}; {len(pod_list)} pod(s) {verdict}"))
    findings.append(Finding("info", f"budgets: download {b.download_s}s, build {b.build_s}s, load {b.load_s}s"))
    serve, build = sizing.memory_limit(cfg, "serve"), sizing.memory_limit(cfg, "build")
    # a pod reserves max(any init container, the sum of its containers) for its whole life
    held = max(serve, build, key=sizing.quantity_bytes) if stages.build_needs_gpu(cfg) else serve
    shm = sizing.shm_size(cfg)
    findings.append(Finding("info", f"per server pod: memory {serve} serving, {held} reserved; /dev/shm {shm}"))
    if stages.needs_job(cfg) and not sizing.read_write_many(cfg):
        findings.append(
            Finding(
                "info",
                "ReadWriteOnce volume: the Job and the server mount it from one node at a time (fine on one node"
                " or a node-local provisioner; block storage across nodes would hold the Job in Multi-Attach)",
            )
        )
    return findings
