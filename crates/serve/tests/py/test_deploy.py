"""deploy/ against the server: the manifests' flags, probes and autoscaling metric exist."""

import os
import subprocess

import httpx2 as httpx
import yaml

from conftest import qtts_bin

DEPLOY = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "deploy")


def docs(name):
    with open(os.path.join(DEPLOY, "k8s", name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def container():
    dep = next(d for d in docs("qtts.yaml") if d["kind"] == "Deployment")
    return dep["spec"]["template"]["spec"]["containers"][0]


def test_manifest_flags_are_flags_of_qtts_serve():
    help_text = subprocess.run([qtts_bin(), "serve", "--help"], capture_output=True, text=True,
                               check=True).stdout
    flags = [a for a in container()["args"] if a.startswith("--")]
    assert flags
    for f in flags:
        assert f in help_text, f"{f} is not a flag of qtts serve"
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        entry = next(l for l in f if l.startswith("ENTRYPOINT"))
    for f in ["--http", "--wyoming"]:
        assert f in entry and f in help_text


def test_probes_answer_and_the_autoscaling_metric_exists(server):
    c = container()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        path = c[probe]["httpGet"]["path"]
        assert httpx.get(server.base + path).status_code == 200, probe
    cpu = c["resources"]["requests"]["cpu"]
    assert cpu == c["resources"]["limits"]["cpu"] and float(cpu).is_integer()
    hpa = docs("hpa.yaml")[0]
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric in server.get("/metrics")
