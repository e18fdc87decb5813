"""terraform/: formatting, validation of every module and example, `terraform test` files,
the topology file as placement reads it, and refusals with their messages."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from terraform_kit import TERRAFORM_SRC, TerraformTree, requires_aws_mirror, requires_terraform

from scriba.placement import Location, parse_topology_mapping

pytestmark = requires_terraform

# every root terraform validates: the modules, the local environment and the examples
ROOTS = {
    "modules/topology": False,
    "modules/aws-cluster": True,
    "environments/local": False,
    "examples/aws-3az": True,
    "examples/local": False,
}


def test_every_terraform_dir_is_listed() -> None:
    dirs = {str(p.parent.relative_to(TERRAFORM_SRC)) for p in TERRAFORM_SRC.rglob("*.tf")
            if ".terraform" not in p.parts}
    assert dirs == set(ROOTS)


def test_fmt_check_recursive(tmp_path: Path) -> None:
    tree = TerraformTree(tmp_path)
    result = tree.run(".", "fmt", "-check", "-recursive", "-diff", "-no-color", check=False)
    assert result.returncode == 0, result.output
    # negative control: a misformatted file in the copy is caught
    bad = tree.path("modules/topology/bad.tf")
    bad.write_text('locals {\nx=1\n  yy = "a"\n}\n')
    result = tree.run(".", "fmt", "-check", "-recursive", "-no-color", check=False)
    assert result.returncode != 0 and "bad.tf" in result.output


@pytest.mark.parametrize("root", sorted(ROOTS))
def test_validate(tmp_path: Path, root: str) -> None:
    if ROOTS[root]:
        requires_aws_mirror()
    tree = TerraformTree(tmp_path)
    tree.init(root)
    result = tree.run(root, "validate", "-json", "-no-color")
    doc = json.loads(result.stdout)
    assert doc["valid"] is True and doc["error_count"] == 0, doc
    assert doc["warning_count"] == 0, doc["diagnostics"]


def _passed_runs(output: str) -> int:
    match = re.search(r"Success! (\d+) passed, 0 failed", output)
    assert match, output[-4000:]
    return int(match.group(1))


def test_topology_module_terraform_test(tmp_path: Path) -> None:
    tree = TerraformTree(tmp_path)
    tree.init("modules/topology")
    result = tree.run("modules/topology", "test", "-no-color")
    assert _passed_runs(result.output) >= 16


def test_aws_cluster_module_terraform_test(tmp_path: Path) -> None:
    requires_aws_mirror()
    tree = TerraformTree(tmp_path)
    tree.init("modules/aws-cluster")
    result = tree.run("modules/aws-cluster", "test", "-no-color")
    assert _passed_runs(result.output) >= 7


def test_topology_file_is_what_placement_reads(tmp_path: Path) -> None:
    """The module's topology_json, parsed by scriba.placement, gives every bookie its
    computed location (and nothing else)."""
    tree = TerraformTree(tmp_path)
    tree.init("modules/topology")
    regions = {"eu": {"eu-a": {"r1": 2, "r2": 1}, "eu-b": {"r1": 1}},
               "us": {"us-a": {"r1": 1}, "us-b": {"r1": 1}, "us-c": {"r9": 1}}}
    tree.path("modules/topology/t.auto.tfvars.json").write_text(json.dumps({"regions": regions}))
    tree.run("modules/topology", "apply", "-auto-approve", "-no-color")
    outputs = json.loads(tree.run("modules/topology", "output", "-json").stdout)
    locations = parse_topology_mapping(outputs["topology_json"]["value"], fmt="json")
    expected = {
        f"{zone}.{rack}.{n}": Location(region, zone, rack)
        for region, zones in regions.items() for zone, racks in zones.items()
        for rack, count in racks.items() for n in range(1, count + 1)
    }
    assert locations == expected
    assert outputs["bookie_ids"]["value"] == sorted(expected)  # index order is region, zone, rack, n
    assert [b["index"] for b in outputs["bookies"]["value"].values()] == list(range(len(expected)))


# --- refusals, with the messages a user reads ------------------------------------------

TOPOLOGY_REFUSALS = {
    "zones_below_write_quorum": (
        {"regions": {"eu": {"a": {"r": 3}, "b": {"r": 3}}}},
        "zone-aware placement needs at least write_quorum_size zones"),
    "even_members": (
        {"regions": {"eu": {"a": {"r": 1}, "b": {"r": 1}, "c": {"r": 1}}}, "metadata_members": 2},
        "metadata_members: an odd number"),
    "slash_in_name": (
        {"regions": {"eu": {"a/b": {"r": 1}, "b": {"r": 1}, "c": {"r": 1}}}},
        "Scriba refuses '/' and empty names"),
    "duplicate_zone": (
        {"regions": {"eu": {"a": {"r": 1}, "b": {"r": 1}, "c": {"r": 1}}, "us": {"a": {"r": 1}}}},
        "zone names must be unique across regions"),
}


@pytest.mark.parametrize("case", sorted(TOPOLOGY_REFUSALS))
def test_topology_refusal_messages(tmp_path: Path, case: str) -> None:
    variables, message = TOPOLOGY_REFUSALS[case]
    tree = TerraformTree(tmp_path)
    tree.init("modules/topology")
    tree.path("modules/topology/t.auto.tfvars.json").write_text(json.dumps(variables))
    result = tree.run("modules/topology", "plan", "-no-color", check=False)
    assert result.returncode != 0
    assert message in " ".join(result.output.split()), result.output


def test_aws_cluster_refuses_too_few_zones_for_zone_aware_placement(tmp_path: Path) -> None:
    """The check lives in modules/topology; a user of the AWS module gets its message."""
    requires_aws_mirror()
    tree = TerraformTree(tmp_path)
    tree.init("modules/aws-cluster")
    for old in tree.path("modules/aws-cluster/tests").glob("*.tftest.hcl"):
        old.unlink()
    tree.path("modules/aws-cluster/tests/refusal.tftest.hcl").write_text("""
mock_provider "aws" {
  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }
}
run "four_copies_over_three_zones" {
  command = plan
  variables {
    cluster_name      = "demo"
    region_name       = "eu-west-1"
    zones             = { "eu-west-1a" = { r = 2 }, "eu-west-1b" = { r = 2 }, "eu-west-1c" = { r = 2 } }
    placement         = { ensemble_size = 4, write_quorum_size = 4 }
  }
}
""")
    result = tree.run("modules/aws-cluster", "test", "-no-color", check=False)
    assert result.returncode != 0
    assert "zone-aware placement needs at least write_quorum_size zones" in " ".join(result.output.split())


def test_local_environment_refuses_overlapping_ports(tmp_path: Path) -> None:
    tree = TerraformTree(tmp_path)
    tree.init("environments/local")
    tree.path("environments/local/t.auto.tfvars.json").write_text(json.dumps({
        "data_dir": str(tmp_path / "data"), "metadata_port_base": 30000, "bookie_port_base": 30001,
        "http_port_base": 31000,
    }))
    result = tree.run("environments/local", "plan", "-no-color", check=False)
    assert result.returncode != 0
    assert "Port ranges overlap (metadata and bookie)" in " ".join(result.output.split()), result.output
    assert not (tmp_path / "data").exists()  # a refused plan starts nothing


# --- the AWS first-boot scripts are valid shell ----------------------------------------

_RENDER = """
locals {
  t = "%(templates)s"
  prelude = { role = "bookie", cluster_name = "c", packages = "python3-venv", tls_enabled = false,
              key_parameter = null, ca_cert_b64 = "", cert_b64 = "", key_b64 = "" }
  tls_ssm = merge(local.prelude, { tls_enabled = true, key_parameter = "/c/key", ca_cert_b64 = "Q0E=", cert_b64 = "Q0U=" })
  tls_pem = merge(local.prelude, { tls_enabled = true, ca_cert_b64 = "Q0E=", cert_b64 = "Q0U=", key_b64 = "S0VZ" })
  member = { name = "etcd-1", ip = "10.0.0.10", region = "r", zone = "z", cluster_name = "c", volume_id = "vol-3",
             client_port = 2379, peer_port = 2380, peer_scheme = "https", client_scheme = "https",
             initial_cluster = "etcd-1=https://10.0.0.10:2380", tls_args = " --client-cert-auth" }
}
output "scripts" {
  value = {
    bookie = join("\\n", [templatefile("${local.t}/prelude.sh.tftpl", local.tls_ssm),
      templatefile("${local.t}/bookie.sh.tftpl", { bookie_id = "z.r.1", region = "r", zone = "z", rack = "r",
        journal_volume_id = "vol-1", ledger_volume_id = "vol-2",
        metadata_uri = "etcd+tls://10.0.0.10:2379/s?ca=/etc/scriba/tls/ca.pem&cert=/etc/scriba/tls/cert.pem&key=/k",
        bookie_port = 3181, binary_port = 3182, http_port = 8000, scriba_package = "scriba", pip_index_args = "",
        topology_b64 = "e30=", extra_args = " --tls-require-client-cert --tls-allow client=*" })])
    etcd = join("\\n", [templatefile("${local.t}/prelude.sh.tftpl", local.tls_pem),
      templatefile("${local.t}/etcd.sh.tftpl", local.member)])
    zookeeper = join("\\n", [templatefile("${local.t}/prelude.sh.tftpl", local.prelude),
      templatefile("${local.t}/zookeeper.sh.tftpl", merge(local.member, { myid = 1, servers = "server.1=10.0.0.10:2888:3888" }))])
  }
}
"""


def test_aws_first_boot_scripts_are_valid_shell(tmp_path: Path) -> None:
    tree = TerraformTree(tmp_path)
    render = tree.path("render")
    render.mkdir()
    (render / "main.tf").write_text(_RENDER % {"templates": tree.path("modules/aws-cluster/templates")})
    tree.init("render")
    tree.run("render", "apply", "-auto-approve", "-no-color")
    scripts = json.loads(tree.run("render", "output", "-json").stdout)["scripts"]["value"]
    assert sorted(scripts) == ["bookie", "etcd", "zookeeper"]
    for role, text in scripts.items():
        script = tmp_path / f"{role}.sh"
        script.write_text(text)
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, f"{role}: {check.stderr}"
        assert text.startswith("#!/bin/bash\n") and "set -euo pipefail" in text
    assert "--advertise $ip --id z.r.1 --region r --zone z --rack r" in scripts["bookie"]
    # the TLS URI's '&' and the allow-list's '*' reach the unit file as written (a heredoc body is not globbed or split)
    assert "--metadata etcd+tls://10.0.0.10:2379/s?ca=/etc/scriba/tls/ca.pem&cert=" in scripts["bookie"]
    assert "--tls-require-client-cert --tls-allow client=*\n" in scripts["bookie"]
    assert "--listen-client-urls https://0.0.0.0:2379" in scripts["etcd"]
    assert "aws ssm get-parameter" in scripts["bookie"] and "S0VZ" not in scripts["bookie"]
    assert "echo 'S0VZ' | base64 -d > /etc/scriba/tls/key.pem" in scripts["etcd"]
    assert "/etc/scriba/tls" not in scripts["zookeeper"]
    # negative control: bash -n does catch a broken script
    broken = tmp_path / "broken.sh"
    broken.write_text(scripts["bookie"].replace("done\n", "\n", 1))
    assert subprocess.run(["bash", "-n", str(broken)], capture_output=True).returncode != 0
