"""JSON Schemas for the custom resources trtspec renders, which kubernetes-validate does not know.

Written for these tests from the APIs' reference documentation (LeaderWorkerSet
leaderworkerset.x-k8s.io/v1; prometheus-operator monitoring.coreos.com/v1 PodMonitor and
PrometheusRule), not copied from the projects' generated CRDs, which cannot be fetched here. Each
covers the fields those APIs define at the levels trtspec writes, with additionalProperties false,
so a misspelt or misplaced field fails. Pod templates inside a LeaderWorkerSet are validated
separately, as core/v1 PodTemplateSpec, against the official Kubernetes schemas.
"""

from __future__ import annotations

from typing import Any

_META = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _META,
            "spec": spec,
        },
    }


LEADER_WORKER_SET = _resource(
    "leaderworkerset.x-k8s.io/v1",
    "LeaderWorkerSet",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["leaderWorkerTemplate"],
        "properties": {
            "replicas": {"type": "integer", "minimum": 0},
            "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
            "networkConfig": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"subdomainPolicy": {"enum": ["Shared", "UniquePerReplica"]}},
            },
            "rolloutStrategy": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "type": {"enum": ["RollingUpdate"]},
                    "rollingUpdateConfiguration": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "maxSurge": {"type": ["integer", "string"]},
                            "maxUnavailable": {"type": ["integer", "string"]},
                        },
                    },
                },
            },
            "leaderWorkerTemplate": {
                "type": "object",
                "additionalProperties": False,
                "required": ["workerTemplate"],
                "properties": {
                    "size": {"type": "integer", "minimum": 1},
                    "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "Default", "None"]},
                    "leaderTemplate": {"type": "object"},
                    "workerTemplate": {"type": "object"},
                    "subGroupPolicy": {"type": "object"},
                },
            },
        },
    },
)

_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        "targetPort": {"type": ["integer", "string"]},
        "path": {"type": "string"},
        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": {"type": "string", "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
        "scrapeTimeout": {"type": "string"},
        "honorLabels": {"type": "boolean"},
        "relabelings": {"type": "array"},
        "metricRelabelings": {"type": "array"},
    },
}

POD_MONITOR = _resource(
    "monitoring.coreos.com/v1",
    "PodMonitor",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector"],
        "properties": {
            "selector": _LABEL_SELECTOR,
            "namespaceSelector": {"type": "object"},
            "jobLabel": {"type": "string"},
            "podTargetLabels": {"type": "array", "items": {"type": "string"}},
            "podMetricsEndpoints": {"type": "array", "items": _ENDPOINT},
        },
    },
)

_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
    "properties": {
        "record": {"type": "string"},
        "alert": {"type": "string"},
        "expr": {"type": ["string", "integer"]},
        "for": {"type": "string"},
        "keep_firing_for": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

PROMETHEUS_RULE = _resource(
    "monitoring.coreos.com/v1",
    "PrometheusRule",
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "groups": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "interval": {"type": "string"},
                        "limit": {"type": "integer"},
                        "rules": {"type": "array", "items": _RULE},
                    },
                },
            }
        },
    },
)

CUSTOM = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): LEADER_WORKER_SET,
    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}
