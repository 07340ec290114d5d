"""Extract the RayJob ``v1`` openAPIV3Schema from KubeRay's CRD into a strict JSON Schema file.

    python scripts/vendor_kuberay_schema.py ray.io_rayjobs.yaml tests/packaging/kuberay/rayjob-v1.schema.json

The input is ``helm-chart/kuberay-operator/crds/ray.io_rayjobs.yaml`` of a KubeRay release (the
version, commit and sha256 used are in ``tests/packaging/kuberay/README.md``). Every object schema
that lists ``properties`` (and does not say ``x-kubernetes-preserve-unknown-fields``) gets
``additionalProperties: false``, as ``kubectl apply --validate=strict`` refuses unknown fields, and
``apiVersion``/``kind`` are pinned to ``ray.io/v1`` / ``RayJob``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml


def strict(node: Any) -> Any:
    """``node`` with ``additionalProperties: false`` on every closed object schema, recursively."""
    if isinstance(node, list):
        return [strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def main(src: str, dst: str) -> None:
    crd = yaml.safe_load(Path(src).read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": "ray.io/v1"}
    schema["properties"]["kind"] = {"const": "RayJob"}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    Path(dst).write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
