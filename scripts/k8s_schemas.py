"""Write the standalone-strict Kubernetes JSON schemas that tests/test_ops_k8s.py validates
infra/k8s/ against, offline, for the kinds the manifests use.

The source is PyPI's kubernetes-validate, which ships every Kubernetes release's schemas in
its "local-strict" form: one file per kind whose ``$ref``s point into a shared
``_definitions.json`` (1.4 MB). "Standalone" inlines those references, as kubeconform's
schemas (yannh/kubernetes-json-schema) do, so each kind is one self-contained file::

    python -m venv /tmp/kv && /tmp/kv/bin/pip install kubernetes-validate==1.37.0
    /tmp/kv/bin/python scripts/k8s_schemas.py v1.33.0 infra/schemas/k8s

A kind the manifests start using needs its file here (the test says which is missing).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

# kind-group-version, named as kubeconform and kubernetes-validate name them
KINDS = ["configmap-v1", "deployment-apps-v1", "horizontalpodautoscaler-autoscaling-v2", "namespace-v1",
         "persistentvolumeclaim-v1", "poddisruptionbudget-policy-v1", "service-v1", "statefulset-apps-v1"]


def inline(node: Any, defs: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """``node`` with every ``{"$ref": ".../_definitions.json#/$defs/NAME"}`` replaced by that
    definition (itself inlined); a description beside the reference is kept."""
    if isinstance(node, list):
        return [inline(v, defs, seen) for v in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        if name in seen:  # only CRD schemas recurse; none of KINDS does
            raise ValueError(f"recursive definition {name} (via {' > '.join(seen)})")
        out = inline(defs[name], defs, (*seen, name))
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return {**out, **extra}
    return {k: inline(v, defs, seen) for k, v in node.items()}


def main(version: str, out: Path) -> None:
    spec = importlib.util.find_spec("kubernetes_validate")  # its data only: no need to import it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("install kubernetes-validate first (see this script's docstring)")
    src = Path(spec.submodule_search_locations[0]) / "kubernetes-json-schema" / f"{version}-local-strict"
    if not src.is_dir():
        raise SystemExit(f"kubernetes-validate has no schemas for {version} (look in {src.parent})")
    defs = json.loads((src / "_definitions.json").read_text())["$defs"]
    out.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        schema = inline(json.loads((src / f"{kind}.json").read_text()), defs)
        (out / f"{kind}.json").write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
        print(f"{kind}.json: {(out / f'{kind}.json').stat().st_size:,} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: k8s_schemas.py VERSION OUT_DIR   (e.g. v1.33.0 infra/schemas/k8s)")
    main(sys.argv[1], Path(sys.argv[2]))
