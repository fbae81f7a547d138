"""The deployment files of deploy/: the Kubernetes manifests validate against Kubernetes'
own schemas (kubernetes-validate, offline, strict: an unknown field fails) for the oldest
release they support and the newest, and they give agentd what its detection reads; the
Slurm batch script is run by tests/integration/test_schedulers.py."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest

from agentd.cli import EXIT_USAGE
from agentd.config.resolve import resolve
from agentd.schedulers import kubernetes
from agentd.schedulers.kubernetes import detect_kubernetes

kubernetes_validate = pytest.importorskip("kubernetes_validate")
yaml = pytest.importorskip("yaml")

DEPLOY = Path(__file__).parents[2] / "deploy"
VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
"""podFailurePolicy is GA from 1.31: the oldest release the manifests support."""
JOBSET_SPEC = {"replicatedJobs", "network", "failurePolicy", "successPolicy", "startupPolicy"}
JOBSET_NETWORK = {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"}
JOBSET_REPLICATED = {"name", "replicas", "template", "dependsOn"}


def documents(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def single_host_job() -> list[dict]:
    """config/kubernetes-job.yaml: the single-host example (no rendezvous)."""
    return list(yaml.safe_load_all((DEPLOY.parent / "config" / "kubernetes-job.yaml").read_text()))


def job_of_jobset() -> dict:
    """The JobSet's one replicated job, as the batch/v1 Job the JobSet controller makes."""
    [jobset] = documents("jobset.yaml")
    [replicated] = jobset["spec"]["replicatedJobs"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        **replicated["template"],
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_the_manifests_validate_against_kubernetes_schemas(version):
    for document in [*documents("job.yaml"), job_of_jobset(), *single_host_job()]:
        kubernetes_validate.validate(document, version, strict=True)


def test_the_jobset_uses_only_its_api_fields():
    """No JobSet schema ships with Kubernetes': its own fields are checked by name, its Job
    template against batch/v1 above."""
    [jobset] = documents("jobset.yaml")
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert set(jobset["spec"]) <= JOBSET_SPEC
    assert set(jobset["spec"]["network"]) <= JOBSET_NETWORK
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True
    [replicated] = jobset["spec"]["replicatedJobs"]
    assert set(replicated) <= JOBSET_REPLICATED and replicated["replicas"] == 1


def test_validation_fails_on_a_mistake():
    job = documents("job.yaml")[1]
    broken = copy.deepcopy(job)
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProb"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("job", [documents("job.yaml")[1], job_of_jobset()], ids=["job", "jobset"])
def test_a_pod_of_the_manifest_gives_agentd_what_it_reads(job):
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {item["name"]: item.get("value", "from-a-secret") for item in container["env"]}
    assert spec["completionMode"] == "Indexed"
    assert env["AGENTD_NNODES"] == str(spec["completions"]) == str(spec["parallelism"])
    assert "secretKeyRef" in str(container["env"])  # the store token is a Secret's
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"store": kubernetes.PORT, "health": 29401}  # the Dockerfile's health port
    [fail] = [r for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert fail["onExitCodes"]["values"] == [EXIT_USAGE]
    assert fail["onExitCodes"]["containerName"] == container["name"]
    assert pod["restartPolicy"] == "Never"
    config = resolve({"script": "train.py"}, {**env, "AGENTD_SCHEDULER": "none"})
    assert pod["terminationGracePeriodSeconds"] > config.drain_timeout  # the drain ends in time
    index = {"JOB_COMPLETION_INDEX": "2"}
    given = {"nnodes": env["AGENTD_NNODES"], "store_token": env["AGENTD_STORE_TOKEN"]}
    found = detect_kubernetes(index, given, lambda: "t-2", lambda: "t-2.t.ns.svc.cluster.local")
    assert found.values["rdzv_endpoint"].count(",") == 2


def test_the_service_is_the_pods_subdomain_and_selects_them():
    service, job = documents("job.yaml")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True  # found before ready
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    selector = service["spec"]["selector"]
    assert selector == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert [p["port"] for p in service["spec"]["ports"]] == [kubernetes.PORT]


def test_the_batch_script_is_valid_shell():
    script = DEPLOY / "slurm" / "train.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "#SBATCH --ntasks-per-node=1" in text and "AGENTD_STORE_TOKEN" in text
    assert "#SBATCH --signal=USR1@" in text  # every process of the step: the agents drain
