#!/usr/bin/env python3
"""Checks the Helm chart in helm/kube-ovn-ipsec without a helm binary or a
cluster (TESTBED.md): helm-python-sdk renders and lints it offline,
kubernetes-validate validates every object strictly against the Kubernetes
1.32 schemas, and each render is held to SPEC §8-§9 — capabilities, the
init container's shape, the update strategy, probes, mounts, RBAC. Bad
values must fail with a message naming what to change. The renders the
tests and the lab run from (RENDERS: the defaults, which render the cleanup
shape, and "v2 on") must equal helm/rendered/ (--update rewrites them), and
image/Dockerfile must put the binaries where the chart runs them.

Run with the chart tools' Python (scripts/lib/chart-tools.sh).
"""

import argparse
import pathlib
import re
import sys

import helm_python
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "kube-ovn-ipsec"
VALUES = ROOT / "helm" / "values"
# The committed renders: the embedded cluster's RBAC and Pod templates,
# and the lab's agent and cleanup processes, come from these
# (apiserver::chart), so the chart and the tested behaviour cannot drift.
RENDERS = {
    "defaults": ROOT / "helm" / "rendered" / "kube-ovn-ipsec.yaml",
    "v2 on": ROOT / "helm" / "rendered" / "kube-ovn-ipsec-enabled.yaml",
}
DOCKERFILE = ROOT / "image" / "Dockerfile"
KUBE = "1.32.0"
NAMESPACE = "kube-system"
RELEASE = "kube-ovn-ipsec"

AGENT = "/kube-ovn/kube-ovn-ipsec"
CONTROLLER = "/kube-ovn/kube-ovn-ipsec-controller"
MONITOR = "/usr/share/openvswitch/scripts/ovs-monitor-ipsec"

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_values(*files):
    values = {}
    for f in files:
        values = merge(values, yaml.safe_load((VALUES / f).read_text()) or {})
    return values


def render(chart, values):
    """The chart's objects for `values`, in template order, and the text."""
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    text = "".join(f"---\n# Source: {k}\n{v.strip()}\n" for k, v in sorted(out.items()) if v.strip())
    objs = [o for o in yaml.safe_load_all(text) if o]
    return objs, text


def find(objs, kind, name=None):
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def caps(container):
    c = container.get("securityContext", {}).get("capabilities", {})
    return set(c.get("add", [])), set(c.get("drop", []))


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


NODE_ENV = {
    "NODE_NAME": "spec.nodeName",
    "POD_NAME": "metadata.name",
    "POD_NAMESPACE": "metadata.namespace",
    "POD_UID": "metadata.uid",
    "POD_TEMPLATE_HASH": "metadata.labels['controller-revision-hash']",
}


def check_node_env(case, c, key_dir):
    env = env_of(c)
    for name, path in NODE_ENV.items():
        got = env.get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        check(got == path, f"{case}: {c['name']} env {name} from {got!r}, want {path}")
    check(env.get("OVN_IPSEC_KEY_DIR", {}).get("value") == key_dir,
          f"{case}: {c['name']} OVN_IPSEC_KEY_DIR != {key_dir}")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    check(mounts.get(key_dir) == "ovs-ipsec-keys", f"{case}: {c['name']} does not mount the key directory at {key_dir}")
    check(mounts.get("/run/openvswitch") == "host-run-ovs", f"{case}: {c['name']} lacks /run/openvswitch")


def check_case(case, objs, *, ipsec, cleanup, cert_manager, key_dir, ssl=False):
    ds = find(objs, "DaemonSet", "kube-ovn-cni")
    if not check(len(ds) == 1, f"{case}: one kube-ovn-cni DaemonSet"):
        return
    ds = ds[0]
    ru = ds["spec"]["updateStrategy"]
    check(ru["type"] == "RollingUpdate" and ru["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1},
          f"{case}: update strategy {ru}, want maxSurge 0 / maxUnavailable 1")
    pod = ds["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    inits = {c["name"]: c for c in pod.get("initContainers", [])}
    cni = containers["cni-server"]
    add, drop = caps(cni)
    check("SYS_NICE" in drop and "SYS_NICE" not in add, f"{case}: cni-server must drop SYS_NICE ({add}, {drop})")
    volumes = {v["name"]: v for v in pod["volumes"]}

    if check(("ipsec" in containers) == ipsec, f"{case}: ipsec container present={'ipsec' in containers}, want {ipsec}") and ipsec:
        c = containers["ipsec"]
        check(c["command"] == [AGENT] and c["args"][0] == "run", f"{case}: ipsec runs {c['command']} {c['args'][:1]}")
        add, drop = caps(c)
        check(add == {"NET_ADMIN", "NET_BIND_SERVICE", "SYS_NICE"} and drop == {"ALL"},
              f"{case}: ipsec capabilities add={add} drop={drop}")
        check(c["securityContext"].get("privileged") is False, f"{case}: ipsec must not be privileged")
        probe = c.get("readinessProbe", {}).get("httpGet", {})
        check(probe.get("path") == "/readyz", f"{case}: ipsec readiness probe {probe}")
        check("livenessProbe" not in c and "startupProbe" not in c, f"{case}: ipsec must have no liveness coupling")
        check_node_env(case, c, key_dir)
    if check(("ipsec-cleanup" in inits) == cleanup,
             f"{case}: ipsec-cleanup present={'ipsec-cleanup' in inits}, want {cleanup}") and cleanup:
        c = inits["ipsec-cleanup"]
        check(c["command"] == [AGENT] and c["args"] == ["cleanup"], f"{case}: cleanup runs {c['command']} {c['args']}")
        add, drop = caps(c)
        check(add == {"NET_ADMIN", "NET_BIND_SERVICE"} and drop == {"ALL"},
              f"{case}: cleanup capabilities add={add} drop={drop}")
        check(c["securityContext"].get("runAsUser") == 0, f"{case}: cleanup must run as root")
        for no in ("restartPolicy", "readinessProbe", "livenessProbe", "startupProbe"):
            check(no not in c, f"{case}: cleanup must not have {no}")
        check(c.get("terminationMessagePolicy") == "FallbackToLogsOnError",
              f"{case}: cleanup's refusal reason must reach the Pod status")
        check_node_env(case, c, key_dir)
    if ipsec or cleanup:
        hp = volumes.get("ovs-ipsec-keys", {}).get("hostPath", {})
        check(hp.get("path") == key_dir, f"{case}: key directory hostPath {hp}, want {key_dir}")
    else:
        check("ovs-ipsec-keys" not in volumes, f"{case}: no key directory without IPsec")

    dep = find(objs, "Deployment", "kube-ovn-ipsec-controller")
    if check(len(dep) == 1, f"{case}: one controller Deployment"):
        c = dep[0]["spec"]["template"]["spec"]["containers"][0]
        check(c["command"] == [CONTROLLER], f"{case}: controller runs {c['command']}")
        args = c["args"]
        check(f"--enable-ipsec={'true' if ipsec else 'false'}" in args, f"{case}: controller args {args}")
        check(f"--cert-manager-ipsec-cert={'true' if cert_manager else 'false'}" in args, f"{case}: controller args {args}")
        env = env_of(c)
        scheme = "ssl:" if ssl else "tcp:"
        for var in ("OVN_NB_ADDR", "OVN_SB_ADDR"):
            value = env.get(var, {}).get("value", "")
            check(value.startswith(scheme), f"{case}: controller {var}={value!r}, want {scheme}")
        pod = dep[0]["spec"]["template"]["spec"]
        tls = {v["name"]: v for v in pod.get("volumes", [])}.get("ovn-tls")
        mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
        if ssl:
            check(tls is not None and tls.get("secret", {}).get("secretName") == "kube-ovn-tls",
                  f"{case}: the controller mounts Kube-OVN's TLS secret ({tls})")
            m = mounts.get("ovn-tls", {})
            check(m.get("mountPath") == "/var/run/tls" and m.get("readOnly") is True,
                  f"{case}: TLS files at /var/run/tls, read-only ({m})")
            check(pod.get("securityContext", {}).get("fsGroup") == 65534,
                  f"{case}: the secret's files readable by the controller's group")
        else:
            check(tls is None and "ovn-tls" not in mounts, f"{case}: no TLS secret without SSL")
    check_rbac(case, objs)


def rules_of(objs, kind, name):
    found = find(objs, kind, name)
    return found[0]["rules"] if found else []


def allows(rules, group, resource, verb):
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", [])
               and verb in r.get("verbs", []) for r in rules)


def check_rbac(case, objs):
    cni = rules_of(objs, "ClusterRole", "kube-ovn-cni-ipsec") + rules_of(objs, "Role", "kube-ovn-cni-ipsec")
    check(allows(cni, "certificates.k8s.io", "certificatesigningrequests", "create"), f"{case}: CNI must create CSRs")
    check(allows(cni, "", "nodes", "patch"), f"{case}: CNI must patch Nodes (receipts)")
    check(not any("cert-manager.io" in r.get("apiGroups", []) for r in cni), f"{case}: CNI must have nothing of cert-manager")
    cluster = rules_of(objs, "ClusterRole", "kube-ovn-ipsec-controller")
    for r in cluster:
        check(not ({"secrets", "certificaterequests"} & set(r.get("resources", []))),
              f"{case}: controller's Secret/CertificateRequest rights must be namespaced, not in its ClusterRole")
        if "signers" in r.get("resources", []):
            check(r.get("resourceNames") == ["kubeovn.io/signer"], f"{case}: signer rights must name kubeovn.io/signer")
    ns = rules_of(objs, "Role", "kube-ovn-ipsec-controller")
    check(allows(ns, "", "secrets", "get") and allows(ns, "cert-manager.io", "certificaterequests", "create")
          and allows(ns, "coordination.k8s.io", "leases", "update"), f"{case}: controller's namespaced Role")
    for binding in find(objs, "ClusterRoleBinding") + find(objs, "RoleBinding"):
        for s in binding["subjects"]:
            check(s.get("namespace") == NAMESPACE, f"{case}: {binding['metadata']['name']} binds outside {NAMESPACE}")


def lint_and_validate(case, values, objs):
    report = helm_python.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version="v" + KUBE)
    bad = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2] + report.get("errors", [])
    check(not bad, f"{case}: lint: {bad}")
    for o in objs:
        try:
            kubernetes_validate.validate(o, KUBE, strict=True)
        except kubernetes_validate.ValidationError as e:
            failures.append(f"{case}: {o['kind']}/{o['metadata']['name']}: {e.message} at {list(e.path)}")


CASES = [
    # name, value files, expected shape
    ("v1 on", ["v1-on.yaml"], dict(ipsec=True, cleanup=False, cert_manager=False)),
    ("v1 off", ["v1-off.yaml"], dict(ipsec=False, cleanup=True, cert_manager=False)),
    ("v1 on + cert-manager", ["v1-cert-manager.yaml"], dict(ipsec=True, cleanup=False, cert_manager=True)),
    ("v2 on", ["v2-on.yaml"], dict(ipsec=True, cleanup=False, cert_manager=False)),
    ("v2 off, previous state", ["v2-off-previous.yaml"], dict(ipsec=False, cleanup=True, cert_manager=False)),
    ("v2 off, no previous state", ["v2-off-fresh.yaml"], dict(ipsec=False, cleanup=False, cert_manager=False)),
    ("v2 on + cert-manager", ["v2-cert-manager.yaml"], dict(ipsec=True, cleanup=False, cert_manager=True)),
    ("v2 on + Talos", ["v2-on.yaml", "talos.yaml"], dict(ipsec=True, cleanup=False, cert_manager=False,
                                                        key_dir="/var/lib/ovs_ipsec_keys")),
    ("v2 off + Talos", ["v2-off-previous.yaml", "talos.yaml"], dict(ipsec=False, cleanup=True, cert_manager=False,
                                                                   key_dir="/var/lib/ovs_ipsec_keys")),
    ("v1 on + SSL", ["v1-ssl.yaml"], dict(ipsec=True, cleanup=False, cert_manager=False, ssl=True)),
    ("v2 on + SSL", ["v2-ssl.yaml"], dict(ipsec=True, cleanup=False, cert_manager=False, ssl=True)),
    ("defaults", [], dict(ipsec=False, cleanup=True, cert_manager=False)),
]

# Values that must not render, and a fragment of the message they must give.
BAD = [
    ({"bogus": 1}, "additional properties 'bogus' not allowed"),
    ({"ipsec": {"certManager": {"enable": True}}}, "additional properties 'enable' not allowed"),
    ({"features": {"enableOvnIpsec": "yes"}}, "/features/enableOvnIpsec"),
    ({"ipsec": {"certificateDuration": -3600}}, "/ipsec/certificateDuration"),
    ({"ipsec": {"requestTimeout": "5m"}}, "/ipsec/requestTimeout"),
    ({"ipsec": {"keyDirectory": "var/lib/ovs_ipsec_keys"}}, "/ipsec/keyDirectory"),
    ({"OVN_IPSEC_KEY_DIR": "ovs_ipsec_keys"}, "/OVN_IPSEC_KEY_DIR"),
    ({"ipsec": {"reservedMarkBits": "49152"}}, "/ipsec/reservedMarkBits"),
    ({"func": {"ENABLE_OVN_IPSEC": False}, "features": {"enableOvnIpsec": True}}, "set twice with different values"),
    ({"OVN_IPSEC_KEY_DIR": "/var/lib/a", "ipsec": {"keyDirectory": "/var/lib/b"}}, "set twice with different values"),
    ({"features": {"enableOvnIpsec": True}, "networking": {"tunnelType": "stt"}}, "geneve and vxlan tunnels only"),
    ({"cni": {"capabilities": ["NET_ADMIN", "SYS_NICE"]}}, "always drops it"),
    ({"controller": {"ovnNb": "udp:10.0.0.1:6641"}}, "use tcp:HOST:PORT or ssl:HOST:PORT"),
    ({"networking": {"ENABLE_SSL": True, "enableSsl": False}}, "set twice with different values"),
    ({"features": {"enableOvnIpsec": True}, "ipsec": {"childLifetime": 600, "rekeyMargin": 300}},
     "starts rekeying before a 600 s lifetime has begun"),
    ({"ipsec": {"rekeyFuzz": -5}}, "/ipsec/rekeyFuzz"),
]


def check_bad(chart):
    for values, want in BAD:
        try:
            chart.render(values, name=RELEASE, namespace=NAMESPACE)
            failures.append(f"bad values rendered: {values}")
        except helm_python.HelmError as e:
            check(want in str(e), f"bad values {values}: message {str(e)!r} lacks {want!r}")


def check_image(*renders):
    """The Dockerfile puts the binaries and the patched monitor where the
    chart and the agent's defaults expect them, on a base with
    ovn-controller (the agent's capability gate probes it)."""
    text = DOCKERFILE.read_text()
    dests = set(re.findall(r"^COPY\s+(?:--\S+\s+)*\S+\s+(\S+)\s*$", text, re.M))
    for path in (AGENT, CONTROLLER):
        check(path in dests, f"image/Dockerfile does not COPY a binary to {path}")
    check(MONITOR in text, f"image/Dockerfile does not patch {MONITOR}")
    check(re.search(r"ovn-controller --version", text) is not None,
          "image/Dockerfile must check that its base carries ovn-controller")
    check("docker build" in text.split("FROM")[0] and "cannot be built" in text.split("FROM")[0].lower(),
          "image/Dockerfile's header must say how it is built and that the project's CI cannot build it")
    commands = set()
    for o in (o for objs in renders for o in objs):
        spec = (o.get("spec", {}).get("template", {}) or {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if c["image"].startswith("docker.io/kubeovn/kube-ovn-ipsec:"):
                commands.add(c["command"][0])
    check(commands == {AGENT, CONTROLLER}, f"chart commands {commands}")


def check_install_script():
    """scripts/install.sh --dry-run maps Kube-OVN's install variables to
    the chart's values and renders them."""
    import os
    import subprocess
    cases = [
        ({"ENABLE_OVN_IPSEC": "true"}, ["name: ipsec\n", "--enable-ipsec=true"], ["ipsec-cleanup"]),
        ({"ENABLE_OVN_IPSEC": "true", "CERT_MANAGER_IPSEC_CERT": "true", "CERT_MANAGER_ISSUER_NAME": "koi"},
         ["--cert-manager-ipsec-cert=true", "--cert-manager-issuer-name=koi"], []),
        ({"ENABLE_OVN_IPSEC": "false", "IPSEC_PREVIOUS_STATE": "true"}, ["name: ipsec-cleanup", "--enable-ipsec=false"],
         ["name: ipsec\n"]),
        ({"ENABLE_OVN_IPSEC": "false", "IPSEC_PREVIOUS_STATE": "false"}, ["--enable-ipsec=false"],
         ["ipsec-cleanup", "name: ipsec\n"]),
        ({"ENABLE_OVN_IPSEC": "true", "OVN_IPSEC_KEY_DIR": "/var/lib/ovs_ipsec_keys", "IPSEC_CERT_DURATION": "63072000"},
         ["path: /var/lib/ovs_ipsec_keys", "--max-cert-lifetime=63072000"], []),
    ]
    for extra, want, unwanted in cases:
        env = dict(os.environ, **extra)
        r = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--dry-run"], env=env,
                           capture_output=True, text=True)
        what = f"install.sh --dry-run {extra}"
        if not check(r.returncode == 0, f"{what}: exit {r.returncode}: {r.stderr.strip()}"):
            continue
        for w in want:
            check(w in r.stdout, f"{what}: output lacks {w!r}")
        for u in unwanted:
            check(u not in r.stdout, f"{what}: output has {u!r}")
    for extra, msg in [({"ENABLE_OVN_IPSEC": "yes"}, "expected true or false"),
                       ({"IPSEC_CERT_DURATION": "2y"}, "expected whole seconds"),
                       ({"IPSEC_CERT_DURATION": "60", "ENABLE_OVN_IPSEC": "true"}, "certificateDuration")]:
        r = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--dry-run"],
                           env=dict(os.environ, **extra), capture_output=True, text=True)
        check(r.returncode != 0 and msg in r.stderr, f"install.sh {extra}: exit {r.returncode}, stderr {r.stderr!r}")
    print(f"install.sh --dry-run: {len(cases) + 3} cases")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true", help="rewrite helm/rendered/ from fresh renders")
    args = ap.parse_args()
    with helm_python.Chart.load(str(CHART)) as chart:
        texts = {}
        for case, files, want in CASES:
            values = load_values(*files)
            before = len(failures)
            try:
                objs, text = render(chart, values)
            except helm_python.HelmError as e:
                failures.append(f"{case}: does not render: {e}")
                print(f"FAIL {case}")
                continue
            want = dict(want)
            key_dir = want.pop("key_dir", "/etc/origin/ovs_ipsec_keys")
            check_case(case, objs, key_dir=key_dir, **want)
            lint_and_validate(case, values, objs)
            if case in RENDERS:
                texts[case] = text
            if case == "defaults":
                default_objs = objs
            if case == "v2 on":
                on_objs = objs
            print(f"{'ok  ' if len(failures) == before else 'FAIL'} {case}: {len(objs)} objects")
        check_bad(chart)
        print(f"bad values refused: {len(BAD)} cases")
    check_image(default_objs, on_objs)
    check_install_script()
    for case, path in RENDERS.items():
        values = "its default values" if case == "defaults" else f"the values of case \"{case}\""
        header = (f"# Rendered from helm/kube-ovn-ipsec with {values} by\n"
                  "# scripts/chart-test.py --update; CI fails when it drifts.\n")
        want = header + texts.get(case, "")
        rel = path.relative_to(ROOT)
        if args.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(want)
            print(f"wrote {rel}")
        elif not path.exists() or path.read_text() != want:
            failures.append(f"{rel} drifted from a fresh render: run scripts/chart-test.sh --update")
    for f in failures:
        print("FAIL:", f)
    print("chart: all checks passed" if not failures else f"chart: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
