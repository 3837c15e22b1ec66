"""The deploy/kubernetes kustomizations rendered offline, as ``kubectl kustomize`` renders
the parts they use: resources (files and other kustomizations), strategic-merge patches
(maps merged, lists of containers, volumes, env and mounts merged by their keys, ``null``
deleting a key), ``labels`` (metadata only) and ``images``. Held against kubectl's own
rendering where kubectl exists (tests/process/test_deploy.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

# The merge key of each list a strategic-merge patch merges item by item (Kubernetes'
# patchMergeKey); any other list is replaced whole.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


def render(directory: Path) -> list[dict[str, Any]]:
    """The documents ``kubectl kustomize directory`` would print."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in spec.get("resources", []):
        path = directory / name
        if path.is_dir():
            docs.extend(render(path))
        else:
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for patch in spec.get("patches", []):
        apply_patch(docs, yaml.safe_load((directory / patch["path"]).read_text()))
    for entry in spec.get("labels", []):
        for doc in docs:
            doc["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for image in spec.get("images", []):
        for doc in docs:
            for container in _containers(doc):
                if container["image"].split(":")[0] == image["name"]:
                    container["image"] = f"{image['newName']}:{image['newTag']}"
    return docs


def apply_patch(docs: list[dict[str, Any]], patch: dict[str, Any]) -> None:
    """Merge ``patch`` into the document of its kind and name."""
    key = (patch["kind"], patch["metadata"]["name"])
    target = next(d for d in docs if (d["kind"], d["metadata"]["name"]) == key)
    merge(target, patch)


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for name, value in patch.items():
        if value is None:
            target.pop(name, None)
        elif isinstance(value, dict) and isinstance(target.get(name), dict):
            merge(target[name], value)
        elif isinstance(value, list) and name in MERGE_KEYS and name in target:
            _merge_list(target[name], value, MERGE_KEYS[name])
        else:
            target[name] = copy.deepcopy(value)


def _merge_list(items: list[Any], patch: list[Any], key: str) -> None:
    """As kubectl orders them: the patch's items first (merged into the item of the same
    key, if any), then the items it does not name."""
    named = [entry.get(key) for entry in patch]
    merged = []
    for entry in patch:
        found = next((i for i in items if i.get(key) == entry.get(key)), None)
        if found is None:
            merged.append(copy.deepcopy(entry))
        else:
            merge(found, entry)
            merged.append(found)
    items[:] = merged + [i for i in items if i.get(key) not in named]


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(pod.get("containers", [])) + list(pod.get("initContainers", []))
