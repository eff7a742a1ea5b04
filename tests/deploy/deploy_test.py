#!/usr/bin/env python3
"""Deployment checks: the Dockerfile, deploy/k8s (base + cpu/gpu/tls overlays), deploy/kserve,
deploy/prometheus and deploy/grafana against the daemon they deploy.

usage: deploy_test.py BUILD_DIR

No Docker engine and no cluster: manifests are parsed and rendered (kustomize through `kubectl
kustomize` when it exists, else a small renderer below that covers what deploy/k8s uses), and
checked against the server itself: its default ports (config/server.yaml), its health service names
(server/grpc sources, then a real grpc.health.v1 Check), the ConfigMap's server.yaml through the
daemon's own parser (--print-config), and every metric name used by the rules, the adapter and the
dashboard against the /metrics output of a daemon started on loopback with the example repository.
The tls overlay and the KServe TLS runtime: the certificate Secret's files are mounted exactly where
server.tls points, the exec probes use them, value_env variables come from Secrets; and the overlay's
server.yaml runs with a test CA (openssl): its probe commands pass, headers are enforced.
Prints one line per check and ends with `N passed, N failed` (`, N skipped` when some were).
"""
import copy
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
OVERLAYS = ["base", "overlays/cpu", "overlays/gpu", "overlays/tls"]
REQUIRED_ALERTS = {  # what operations must page on: kernel fallback events, readiness flapping, p99 latency, queue saturation
    "LibreyoloKernelFallback", "LibreyoloReadinessFlapping", "LibreyoloP99LatencyHigh",
    "LibreyoloQueueSaturated"}
# Metrics used by the rules that the daemon does not export, with where they come from.
EXTERNAL_METRICS = {
    "kube_pod_status_ready": "kube-state-metrics",
    "kube_horizontalpodautoscaler_status_current_replicas": "kube-state-metrics",
    "kube_horizontalpodautoscaler_spec_max_replicas": "kube-state-metrics",
}

results = {"passed": 0, "failed": 0, "skipped": 0}


def report(status, name, detail=""):
    results[status] += 1
    print(f"{ {'passed': 'PASS', 'failed': 'FAIL', 'skipped': 'SKIP'}[status]} {name}" +
          (f": {detail}" if detail else ""), flush=True)


def outcome(fn):
    """Runs fn(): it returns a detail string (pass), raises AssertionError (fail) or Skip."""
    try:
        return "passed", fn() or ""
    except Skip as e:
        return "skipped", str(e)
    except Exception as e:  # every other error is a failure of that check, not of the script
        return "failed", f"{type(e).__name__}: {e}"


def check(name, fn):
    status, detail = outcome(fn)
    report(status, name, detail)


def check_concurrently(pairs):
    """Runs independent checks that wait on subprocesses at once; reports them in order."""
    with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
        futures = [pool.submit(outcome, fn) for _, fn in pairs]
        for (name, _), f in zip(pairs, futures):
            status, detail = f.result()
            report(status, name, detail)


class Skip(Exception):
    pass


def read(path):
    with open(path) as f:
        return f.read()


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


# ---------------------------------------------------------------------------------------------
# kustomize

def _merge(base, patch):
    """Strategic merge as deploy/k8s uses it: maps merge (a null value removes the key), lists of
    named maps merge by name (new items first, as kustomize writes them), other lists are
    replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = _merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (isinstance(base, list) and isinstance(patch, list) and patch and
            all(isinstance(x, dict) and "name" in x for x in base + patch)):
        names = {x["name"] for x in base}
        by_name = {x["name"]: x for x in patch}
        new = [copy.deepcopy(x) for x in patch if x["name"] not in names]
        return new + [_merge(x, by_name[x["name"]]) if x["name"] in by_name else x for x in base]
    return copy.deepcopy(patch)


def _containers(doc):
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("initContainers", []) + spec.get("containers", [])


def render_mini(directory):
    """Renders a kustomization with the features deploy/k8s uses (resources, configMapGenerator
    without the hash suffix, also `behavior: replace` of a generated one, labels, images, patches,
    `$patch: delete`)."""
    k = yaml.safe_load(read(os.path.join(directory, "kustomization.yaml")))
    known = {"apiVersion", "kind", "resources", "configMapGenerator", "labels", "images", "patches"}
    unknown = set(k) - known
    assert not unknown, f"{directory}: kustomization fields the test renderer does not know: {unknown}"
    docs = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(directory, r))
        docs += render_mini(p) if os.path.isdir(p) else load_all(p)
    for g in k.get("configMapGenerator", []):
        data = {os.path.basename(f): read(os.path.join(directory, f)) for f in g.get("files", [])}
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]}, "data": data}
        if g.get("behavior", "create") == "replace":
            hits = [i for i, d in enumerate(docs) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == g["name"]]
            assert len(hits) == 1, f"{directory}: configMapGenerator {g['name']}: nothing to replace"
            cm["metadata"] = docs[hits[0]]["metadata"]
            docs[hits[0]] = cm
        else:
            assert g.get("behavior", "create") == "create", f"{directory}: behavior {g['behavior']}"
            docs.append(cm)
    for lab in k.get("labels", []):
        assert not lab.get("includeSelectors") and not lab.get("includeTemplates"), "labels: only metadata labels"
        for d in docs:
            d.setdefault("metadata", {}).setdefault("labels", {}).update(lab["pairs"])
    for p in k.get("patches", []):
        patch = yaml.safe_load(read(os.path.join(directory, p["path"])))
        hits = [i for i, d in enumerate(docs) if d["kind"] == patch["kind"] and
                d["metadata"]["name"] == patch["metadata"]["name"]]
        assert len(hits) == 1, f"{p['path']}: patch target {patch['kind']}/{patch['metadata']['name']} not found"
        if patch.get("$patch") == "delete":
            del docs[hits[0]]
        else:
            docs[hits[0]] = _merge(docs[hits[0]], patch)
    for img in k.get("images", []):
        for d in docs:
            for c in _containers(d):
                name, _, tag = c["image"].partition(":")
                if name == img["name"]:
                    c["image"] = f"{img.get('newName', name)}:{img.get('newTag', tag)}"
    return docs


def normalize(docs):
    return sorted(docs, key=lambda d: (d["kind"], d["metadata"]["name"]))


def render_kubectl(directory):
    tool = shutil.which("kubectl")
    cmd = [tool, "kustomize", directory] if tool else None
    if not tool and shutil.which("kustomize"):
        cmd = [shutil.which("kustomize"), "build", directory]
    if not cmd:
        return None
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{' '.join(cmd)}: {out.stderr.strip()}"
    # Generated ConfigMap names carry a content hash: compare without it.
    text = re.sub(r"(libreyolo-server-config)-[a-z0-9]{10}\b", r"\1", out.stdout)
    return [d for d in yaml.safe_load_all(text) if d is not None]


# ---------------------------------------------------------------------------------------------
# The server's side

def server_defaults():
    """Defaults from config/server.yaml (the commented default configuration)."""
    cfg = yaml.safe_load(read(os.path.join(ROOT, "config", "server.yaml")))
    grpc_port = int(cfg["server"]["grpc_address"].rsplit(":", 1)[1])
    http_port = int(cfg["server"]["http_address"].rsplit(":", 1)[1])
    return grpc_port, http_port


def health_services_in_sources():
    names = set()
    for folder in ("server/grpc", "server/core"):
        d = os.path.join(ROOT, folder)
        for f in os.listdir(d):
            if f.endswith(".cpp"):
                # server/grpc/grpc_server.cpp: HealthService::set("<service>", serving) is the
                # only place a status is set (gRPC's default health service is replaced).
                names |= set(re.findall(r'health->set\("([^"]*)"', read(os.path.join(d, f))))
    return names


def longest_request_seconds():
    """In-flight requests get this long after the drain (server/main.cpp: daemon.stop(S))."""
    m = re.search(r"daemon\.stop\(([0-9.]+)\)", read(os.path.join(ROOT, "server", "main.cpp")))
    assert m, "server/main.cpp: daemon.stop(<seconds>) not found"
    return float(m.group(1))


def served_model_types():
    """The config.json model_types of every registered family: each family's .cpp registers
    Family{"<name>", {"<model_type>", ...}, ...} (models/registry/family.h)."""
    types = set()
    models_dir = os.path.join(ROOT, "models")
    for family in sorted(os.listdir(models_dir)):
        d = os.path.join(models_dir, family)
        if not os.path.isdir(d):
            continue
        for f in os.listdir(d):
            if f.endswith(".cpp"):
                for listed in re.findall(r'Family\{"[a-z0-9_]+",\s*\{([^}]*)\}', read(os.path.join(d, f))):
                    # model_types may hold hyphens (DabDetrConfig's "dab-detr").
                    types |= set(re.findall(r'"([a-z0-9_-]+)"', listed))
    assert types, "no Family{...} registration found under models/"
    return types


def probe_args(command):
    """--flag value pairs of a libreyolo-client command line."""
    return {command[i]: command[i + 1] for i in range(2, len(command) - 1, 2)}


def projected_files(volume, mount_path):
    """{(source name, key): absolute path} of a projected volume's configMap/secret items."""
    out = {}
    for src in volume["projected"]["sources"]:
        (kind, ref), = [(k, v) for k, v in src.items() if k in ("configMap", "secret")]
        for item in ref.get("items", []):
            out[(kind, ref["name"], item["key"])] = os.path.join(mount_path, item["path"])
    return out


def value_envs(cfg):
    """The environment variables a server.yaml's restricted_apis read (value_env)."""
    rules = (cfg.get("server") or {}).get("restricted_apis") or {}
    return sorted(r["value_env"] for r in rules.values() if isinstance(r, dict) and "value_env" in r)


def check_tls_layout(cfg, server, volumes, grpc_port, env_containers):
    """A container serving with server.tls: the certificate Secret is an item list of the read-only
    config volume and its files are exactly server.tls' paths (relative to --config's folder); the
    exec probes use the same files against localhost; every value_env is a secretKeyRef in each
    container that parses the file. Returns (tls Secret, {server.tls key: path})."""
    config = server["args"][server["args"].index("--config") + 1]
    config_dir = os.path.dirname(config)
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    assert config_dir in mounts and mounts[config_dir].get("readOnly") is True, \
        f"{config_dir} is not a read-only mount: {mounts.get(config_dir)}"
    files = projected_files(volumes[mounts[config_dir]["name"]], config_dir)
    assert files.get(("configMap", next(n for k, n, key in files if key == "server.yaml"), "server.yaml")) == config, \
        f"no configMap item server.yaml at {config}"
    secrets = {(n, key): path for (k, n, key), path in files.items() if k == "secret"}
    names = {n for n, _ in secrets}
    assert len(names) == 1, f"certificate Secrets in the config volume: {names}"
    (secret,) = names
    assert {key for _, key in secrets} == {"tls.crt", "tls.key", "ca.crt"}, f"{secret} items {sorted(secrets)}"
    want = {"cert_file": secrets[(secret, "tls.crt")], "key_file": secrets[(secret, "tls.key")],
            "client_ca_file": secrets[(secret, "ca.crt")]}
    tls = cfg["server"]["tls"]
    got = {k: os.path.normpath(os.path.join(config_dir, v)) for k, v in tls.items()}
    assert got == want, f"server.tls paths {got} != mounted files {want}"
    for k in ("startupProbe", "readinessProbe", "livenessProbe"):
        args = probe_args(server[k]["exec"]["command"])
        assert args["--server"] == f"localhost:{grpc_port}", f"{k}: --server {args['--server']}"
        probe = {"client_ca_file": args["--tls-ca"], "cert_file": args["--tls-cert"], "key_file": args["--tls-key"]}
        assert probe == want, f"{k}: probe files {probe} != mounted files {want}"
    for c in env_containers:
        env = {e["name"]: e for e in c.get("env", [])}
        for v in value_envs(cfg):
            assert v.startswith("LIBREYOLO_"), f"value_env {v}"
            ref = env.get(v, {}).get("valueFrom", {}).get("secretKeyRef")
            assert ref and ref.get("name") and ref.get("key"), f"{c['name']}: {v} is not set from a Secret: {env.get(v)}"
    return secret, want


def make_test_certificates(d):
    """CA, and a certificate for localhost allowed as server and client (as certificate.yaml)."""
    os.makedirs(d, exist_ok=True)

    def run(*a):
        r = subprocess.run(["openssl", *a], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"openssl {a[0]}: {r.stderr}"
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
        "-subj", "/CN=deploy test CA", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=libreyolo-server",
        "-keyout", f"{d}/tls.key", "-out", f"{d}/tls.csr")
    with open(f"{d}/ext", "w") as f:
        f.write("subjectAltName=DNS:libreyolo-server,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
    run("x509", "-req", "-in", f"{d}/tls.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key", "-CAcreateserial",
        "-days", "1", "-extfile", f"{d}/ext", "-out", f"{d}/tls.crt")


def kserve_tls_docs():
    docs = load_all(os.path.join(DEPLOY, "kserve", "clusterservingruntime-tls.yaml"))
    return {d["kind"]: d for d in docs}


def kserve_tls_config():
    return kserve_tls_docs()["ConfigMap"]["data"]["server.yaml"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parallel(cmds, envs=None, timeout=60):
    """Runs the commands at once (each one loads LibTorch: seconds) and returns their results."""
    envs = envs or [None] * len(cmds)
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c, e in zip(cmds, envs)]
    out = []
    for p, c in zip(procs, cmds):
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        out.append(subprocess.CompletedProcess(c, p.returncode, so, se))
    return out


def promql_metric_names(expr):
    """Metric names in a PromQL expression: identifiers not followed by '(' that are not
    keywords, label names inside {...}, strings or template variables."""
    expr = re.sub(r'"(\\.|[^"\\])*"', '""', expr)           # strings
    expr = re.sub(r"\{[^}]*\}", "{}", expr)                   # label matchers
    expr = re.sub(r"\[[^\]]*\]", "[]", expr)                  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    keywords = {"sum", "avg", "max", "min", "count", "rate", "increase", "changes", "histogram_quantile",
                "clamp_min", "clamp_max", "and", "or", "unless", "bool", "offset", "le", "abs", "irate",
                "delta", "topk", "bottomk", "absent", "time", "vector", "scalar", "e", "inf", "nan"}
    names = set()
    for m in re.finditer(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)", expr):
        n = m.group(1)
        if expr[m.end():].lstrip().startswith("("):  # a function call
            continue
        if n.lower() in keywords:
            continue
        names.add(n)
    return names


def exported_names(metrics_text):
    """Sample names and family names of a Prometheus text exposition."""
    names = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            names.add(name)
            if kind == "histogram":
                names |= {name + "_bucket", name + "_sum", name + "_count"}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, 1)[0])
    return names


# ---------------------------------------------------------------------------------------------

def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    build = os.path.abspath(sys.argv[1])
    server_bin = os.path.join(build, "bin", "libreyolo-server")
    hub_bin = os.path.join(build, "bin", "libreyolo-kernels-hub")
    client_bin = os.path.join(build, "bin", "libreyolo-client")
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="deploy-test-")
    state = {}

    # --- 1. every file parses -------------------------------------------------------------
    def parse_all():
        n = 0
        for dirpath, _, files in os.walk(DEPLOY):
            for f in sorted(files):
                p = os.path.join(dirpath, f)
                if f.endswith((".yaml", ".yml")):
                    docs = load_all(p)
                    assert docs, f"{p}: empty"
                    n += len(docs)
                elif f.endswith(".json"):
                    json.loads(read(p))
                    n += 1
        assert n >= 15, f"only {n} documents under deploy/"
        return f"{n} YAML/JSON documents under deploy/"
    check("manifests parse", parse_all)

    # --- 2. kustomize renders ----------------------------------------------------------------
    rendered = {}
    for o in OVERLAYS:
        def render(o=o):
            docs = normalize(render_mini(os.path.join(K8S, o)))
            rendered[o] = {(d["kind"], d["metadata"]["name"]): d for d in docs}
            ref = render_kubectl(os.path.join(K8S, o))
            if ref is None:
                return f"{len(docs)} objects (test renderer; no kubectl/kustomize to compare with)"
            ref = normalize(ref)
            assert [(d["kind"], d["metadata"]["name"]) for d in ref] == \
                   [(d["kind"], d["metadata"]["name"]) for d in docs], "objects differ from kubectl kustomize"
            for a, b in zip(ref, docs):
                assert a == b, f"{a['kind']}/{a['metadata']['name']} differs from kubectl kustomize"
            return f"{len(docs)} objects, identical to kubectl kustomize"
        check(f"kustomize {o}", render)

    grpc_port, http_port = server_defaults()

    def obj(o, kind, name="libreyolo-server"):
        assert o in rendered, f"{o} did not render"
        assert (kind, name) in rendered[o], f"{o}: no {kind}/{name}"
        return rendered[o][(kind, name)]

    def server_yaml(o):
        cm = obj(o, "ConfigMap", "libreyolo-server-config")
        assert "server.yaml" in cm["data"], "ConfigMap has no server.yaml"
        return cm["data"]["server.yaml"]

    # --- 3. the Deployment against the server -----------------------------------------------
    for o in OVERLAYS:
        def deployment(o=o):
            d = obj(o, "Deployment")
            spec = d["spec"]["template"]["spec"]
            cfg = yaml.safe_load(server_yaml(o))
            cfg_grpc = int(cfg["server"]["grpc_address"].rsplit(":", 1)[1])
            cfg_http = int(cfg["server"]["http_address"].rsplit(":", 1)[1])
            assert (cfg_grpc, cfg_http) == (grpc_port, http_port), \
                f"ConfigMap ports {cfg_grpc}/{cfg_http} != server defaults {grpc_port}/{http_port}"
            assert cfg["server"]["grpc_address"].startswith("0.0.0.0:"), "gRPC must listen on the pod IP"
            assert "hub_kernels" in cfg.get("kernels", {}), "ConfigMap server.yaml lacks kernels.hub_kernels"
            (server,) = [c for c in spec["containers"] if c["name"] == "server"]
            ports = {p["name"]: p["containerPort"] for p in server["ports"]}
            assert ports == {"grpc": grpc_port, "http": http_port}, f"containerPorts {ports}"
            services = health_services_in_sources()
            assert {"liveness", "readiness"} <= services, f"server registers {services}"
            probes = {k: server[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
            want = {"startupProbe": "readiness", "readinessProbe": "readiness", "livenessProbe": "liveness"}
            tls = cfg["server"].get("tls")
            for k, p in probes.items():
                if tls:  # a kubelet grpc probe cannot do TLS: exec libreyolo-client (tls_overlay checks it)
                    assert "grpc" not in p and p["exec"]["command"][:2] == ["libreyolo-client", "health"], \
                        f"{k}: with server.tls, not an exec of libreyolo-client health: {p}"
                    args = probe_args(p["exec"]["command"])
                    assert args["--server"] == f"localhost:{grpc_port}", f"{k} --server {args['--server']}"
                    assert args["--service"] == want[k], f"{k} --service {args['--service']}"
                    continue
                assert "grpc" in p, f"{k} is not a native gRPC probe"
                assert p["grpc"]["port"] == grpc_port, f"{k} port {p['grpc']['port']}"
                assert p["grpc"]["service"] == want[k], f"{k} service {p['grpc'].get('service')}"
            sp = probes["startupProbe"]
            budget = sp["periodSeconds"] * sp["failureThreshold"]
            assert budget >= 300, f"startupProbe allows only {budget} s for model load"
            drain = cfg["server"]["drain_seconds"]
            longest = longest_request_seconds()
            grace = spec["terminationGracePeriodSeconds"]
            assert grace >= drain + longest, f"terminationGracePeriodSeconds {grace} < drain {drain} + {longest}"
            # Security: pod and every container.
            psc = spec["securityContext"]
            assert psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0, "pod securityContext"
            for c in spec["initContainers"] + spec["containers"]:
                sc = c["securityContext"]
                assert sc.get("readOnlyRootFilesystem") is True, f"{c['name']}: root filesystem writable"
                assert sc.get("allowPrivilegeEscalation") is False, f"{c['name']}: privilege escalation"
                assert "ALL" in sc.get("capabilities", {}).get("drop", []), f"{c['name']}: capabilities"
                r = c["resources"]
                assert "cpu" in r["requests"] and "memory" in r["requests"] and "memory" in r["limits"], \
                    f"{c['name']}: resources {r}"
                assert not c["image"].endswith(":latest") and ":" in c["image"], f"{c['name']}: image {c['image']}"
            # Configuration, model repository, kernel cache.
            mounts = {m["name"]: m for m in server["volumeMounts"]}
            vols = {v["name"]: v for v in spec["volumes"]}
            assert server["args"] == ["--config", mounts["config"]["mountPath"] + "/server.yaml"], server["args"]
            srcs = vols["config"]["projected"]["sources"]
            assert srcs[0]["configMap"]["name"] == "libreyolo-server-config", srcs
            assert mounts["models"]["mountPath"] == cfg["model_repository"], "model repository path"
            assert "persistentVolumeClaim" in vols["models"], "model repository is not a PVC"
            assert obj(o, "PersistentVolumeClaim", vols["models"]["persistentVolumeClaim"]["claimName"])
            cache = cfg["kernels"]["hub"]["cache_dir"]
            (init,) = [c for c in spec["initContainers"] if c["name"] == "kernels-download"]
            script = " ".join(init.get("command", []) + init.get("args", []))
            assert "libreyolo-kernels-hub download" in script or "libreyolo-server kernels download" in script, \
                "init container does not prefetch hub kernels"
            for c in (init, server):
                m = {x["name"]: x["mountPath"] for x in c["volumeMounts"]}
                assert m.get("kernel-cache") == cache, f"{c['name']}: kernel cache not at {cache}"
            env = {e["name"]: e.get("value") for e in server.get("env", [])}
            assert env.get("HF_HUB_OFFLINE") == "1", "server is not offline (HF_HUB_OFFLINE=1)"
            gpu = server["resources"].get("limits", {}).get("nvidia.com/gpu")
            if o.endswith("gpu"):
                assert gpu and int(gpu) >= 1, "gpu overlay requests no GPU"
            else:
                assert gpu is None, f"{o} requests a GPU"
            return (f"ports grpc {grpc_port}/http {http_port}, probes liveness/readiness{' (exec, TLS)' if tls else ''}, startup {budget} s, "
                    f"grace {grace} >= {drain}+{longest:g} s, non-root read-only, GPU {gpu or 0}")
        check(f"deployment {o}", deployment)

    def service_monitor_hpa():
        o = "base"
        d = obj(o, "Deployment")
        labels = d["spec"]["template"]["metadata"]["labels"]
        svc = obj(o, "Service")
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), "Service selector"
        sp = {p["name"]: p for p in svc["spec"]["ports"]}
        assert set(sp) == {"grpc", "http"}, f"Service ports {set(sp)}"
        assert sp["grpc"]["port"] == grpc_port and sp["grpc"]["targetPort"] == "grpc", sp["grpc"]
        assert sp["http"]["port"] == http_port and sp["http"]["targetPort"] == "http", sp["http"]
        pm = obj(o, "PodMonitor")
        assert all(labels.get(k) == v for k, v in pm["spec"]["selector"]["matchLabels"].items()), "PodMonitor selector"
        ep = pm["spec"]["podMetricsEndpoints"][0]
        assert ep["port"] == "http" and ep["path"] == "/metrics", ep
        for ov in OVERLAYS:
            hpa = obj(ov, "HorizontalPodAutoscaler")
            assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                    "name": d["metadata"]["name"]}, hpa["spec"]["scaleTargetRef"]
            names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
            adapter = yaml.safe_load(read(os.path.join(DEPLOY, "prometheus", "adapter-rules.yaml")))
            served = {r["name"]["as"] for r in adapter["rules"]["custom"]}
            assert names and set(names) <= served, f"{ov}: HPA metric {names} not served by the adapter ({served})"
        return f"Service grpc/http, PodMonitor http/metrics, HPA on {names[0]} (prometheus-adapter rule)"
    check("service, podmonitor, hpa", service_monitor_hpa)

    def tls_overlay():
        o = "overlays/tls"
        d = obj(o, "Deployment")
        spec = d["spec"]["template"]["spec"]
        cfg = yaml.safe_load(server_yaml(o))
        base = yaml.safe_load(server_yaml("overlays/cpu"))
        rest = copy.deepcopy(cfg)
        for k in ("tls", "restricted_apis"):
            rest["server"].pop(k, None)
        assert rest == base, "tls overlay server.yaml differs from the base's beyond server.tls/restricted_apis"
        assert set(cfg["server"]["tls"]) == {"cert_file", "key_file", "client_ca_file"}, cfg["server"]["tls"]
        rules = cfg["server"]["restricted_apis"]
        for g in ("model-repository", "admin"):
            assert set(rules[g]) == {"header", "value_env"}, f"restricted_apis.{g}: {rules[g]}"
        (server,) = [c for c in spec["containers"] if c["name"] == "server"]
        (init,) = [c for c in spec["initContainers"] if c["name"] == "kernels-download"]
        vols = {v["name"]: v for v in spec["volumes"]}
        secret, files = check_tls_layout(cfg, server, vols, grpc_port, [server, init])
        assert ("PodMonitor", "libreyolo-server") not in rendered[o], "a PodMonitor cannot send the admin header"
        keys = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in server["env"] if "valueFrom" in e}
        admin_ref = keys[rules["admin"]["value_env"]]
        # cert-manager example: the Secret mounted, a name for the probes' host, client auth.
        (cert,) = load_all(os.path.join(K8S, o, "certificate.yaml"))
        assert cert["spec"]["secretName"] == secret, f"Certificate writes {cert['spec']['secretName']}, pods mount {secret}"
        assert "localhost" in cert["spec"]["dnsNames"], "the exec probes connect to localhost"
        assert {"server auth", "client auth"} <= set(cert["spec"]["usages"]), cert["spec"]["usages"]
        # Prometheus: the admin header from the same Secret key, mutual TLS with the same Secret.
        (job,) = load_all(os.path.join(K8S, o, "prometheus-scrape-config.yaml"))[0]
        hdr = job["http_headers"]
        assert list(hdr) == [rules["admin"]["header"]], f"scrape header {list(hdr)} != {rules['admin']['header']}"
        assert hdr[rules["admin"]["header"]]["files"] == [f"/etc/prometheus/secrets/{admin_ref['name']}/{admin_ref['key']}"], hdr
        assert job["scheme"] == "https" and job["metrics_path"] == "/metrics", job
        t = job["tls_config"]
        assert [t["ca_file"], t["cert_file"], t["key_file"]] == \
            [f"/etc/prometheus/secrets/{secret}/{k}" for k in ("ca.crt", "tls.crt", "tls.key")], t
        assert t["server_name"] in cert["spec"]["dnsNames"], t["server_name"]
        # KServe: the TLS runtime mounts the Secret the same way.
        kd = kserve_tls_docs()
        rt = kd["ClusterServingRuntime"]
        (c,) = rt["spec"]["containers"]
        kcfg = yaml.safe_load(kserve_tls_config())
        kvols = {v["name"]: v for v in rt["spec"]["volumes"]}
        ksecret, kfiles = check_tls_layout(kcfg, c, kvols, grpc_port, [c])
        assert ksecret == secret, f"KServe runtime mounts {ksecret}, the overlay {secret}"
        assert kcfg["server"]["restricted_apis"] == rules, "KServe runtime and overlay restrict differently"
        srcs = [s_["configMap"]["name"] for s_ in kvols["config"]["projected"]["sources"] if "configMap" in s_]
        assert srcs == [kd["ConfigMap"]["metadata"]["name"]], srcs
        (plain,) = load_all(os.path.join(DEPLOY, "kserve", "clusterservingruntime.yaml"))
        assert [f["name"] for f in rt["spec"]["supportedModelFormats"]] == \
            [f["name"] for f in plain["spec"]["supportedModelFormats"]], "TLS runtime formats differ"
        (isvc,) = load_all(os.path.join(DEPLOY, "kserve", "inferenceservice-tls.yaml"))
        assert isvc["spec"]["predictor"]["model"]["runtime"] == rt["metadata"]["name"], isvc["spec"]["predictor"]["model"]
        state["tls"] = (cfg, server)
        return (f"Secret {secret} at {', '.join(sorted(files.values()))} = server.tls (overlay and KServe), "
                f"probes exec with them, value_env {', '.join(value_envs(cfg))} from Secrets, scrape job sends "
                f"{rules['admin']['header']}")
    check("tls overlay: mounted files = server.tls, probes, Secrets", tls_overlay)

    # --- 4. the ConfigMap through the daemon's own parser ------------------------------------
    have_server = os.access(server_bin, os.X_OK)

    def config_valid():
        if not have_server:
            raise Skip(f"{server_bin} is not built: the ConfigMap's server.yaml was not run through --print-config")
        # One run per distinct server.yaml (the overlays share the base's), plus a misspelt copy
        # that must be refused: the check can fail. Concurrently: each run loads LibTorch.
        files = {}
        for o in OVERLAYS:
            files.setdefault(server_yaml(o), []).append(o)
        files.setdefault(kserve_tls_config(), []).append("kserve tls runtime")
        jobs = []
        for i, (text, owners) in enumerate(files.items()):
            p = os.path.join(work, f"server-{i}.yaml")
            with open(p, "w") as f:
                f.write(text)
            jobs.append((", ".join(owners), p))
        bad = os.path.join(work, "bad.yaml")
        with open(bad, "w") as f:
            f.write(server_yaml("base").replace("drain_seconds:", "drain_second:"))
        # value_env variables (restricted_apis) must be set, or the file is refused.
        envs = [{**os.environ, **{v: "x" for v in value_envs(yaml.safe_load(read(p)))}} for _, p in jobs]
        runs = parallel([[server_bin, "--config", p, "--print-config"] for _, p in jobs] +
                        [[server_bin, "--config", bad, "--print-config"]], envs + [None])
        details = []
        for (owners, _), r in zip(jobs, runs):
            assert r.returncode == 0, f"{owners}: --print-config exit {r.returncode}: {r.stderr.strip()}"
            assert re.search(r"^  hub_kernels: (true|false)  # ", r.stdout, re.M), r.stdout
            details.append(owners)
        r = runs[-1]
        assert r.returncode != 0 and "drain_second" in r.stderr, f"misspelt key accepted (exit {r.returncode})"
        return f"--print-config exit 0 for {'; '.join(details)}; a misspelt key exits {r.returncode}"

    # --- 5. the init container's script with the real tools ----------------------------------
    def init_script():
        if not (have_server and os.access(hub_bin, os.X_OK)):
            raise Skip("libreyolo-server or libreyolo-kernels-hub is not built")
        spec = obj("base", "Deployment")["spec"]["template"]["spec"]
        (init,) = [c for c in spec["initContainers"] if c["name"] == "kernels-download"]
        assert init["command"] == ["/bin/sh", "-c"], init["command"]
        script = init["args"][0]
        cache = os.path.join(work, "cache")
        text = server_yaml("base").replace("/var/cache/libreyolo/kernels", cache)
        lock = [{"repo_id": "kernels-community/deformable-detr", "revision": "v1", "sha": "0" * 40,
                 "slot": "ms_deform_attn",
                 "variants": {"torch211-cxx11-cpu-x86_64-linux": {"files": {"metadata.json": "0" * 64}}}}]
        cfgs = {}
        for name in ("nolock", "lock"):
            etc = os.path.join(work, "etc-" + name)
            os.makedirs(etc, exist_ok=True)
            cfgs[name] = os.path.join(etc, "server.yaml")
            with open(cfgs[name], "w") as f:
                f.write(text)
            if name == "lock":  # next to the configuration, where the daemon looks (HUB_KERNELS.md)
                with open(os.path.join(etc, "kernels.lock"), "w") as f:
                    json.dump(lock, f)
        base_env = {"PATH": os.path.dirname(server_bin) + ":/usr/bin:/bin", "HOME": work,
                    "HF_HUB_OFFLINE": "1", "LIBREYOLO_LOG_LEVEL": "error"}
        cases = [("nolock", {}), ("lock", {"LIBREYOLO_HUB_KERNELS": "0"}), ("lock", {}),
                 ("lock", {"LIBREYOLO_PREFETCH_REQUIRED": "1"})]
        runs = parallel([["/bin/sh", "-c", script] for _ in cases],
                        [{**base_env, "LIBREYOLO_CONFIG": cfgs[c], **extra} for c, extra in cases])
        (rc, out), (rc1, out1), (rc2, out2), (rc3, out3) = [(r.returncode, r.stdout + r.stderr) for r in runs]
        want_lock = os.path.join(os.path.dirname(cfgs["nolock"]), "kernels.lock")
        assert rc == 0 and f"no {want_lock}:" in out and "nothing to prefetch" in out, \
            f"no lock file: exit {rc}: {out}"
        assert rc1 == 0 and "hub kernels are off" in out1, f"hub off: exit {rc1}: {out1}"
        # Hub on, offline, empty cache: the real download fails; tolerated unless required.
        assert rc2 == 0 and "prefetch failed" in out2 and "kernels-community/deformable-detr" in out2, \
            f"failed download, tolerated: exit {rc2}: {out2}"
        assert rc3 == 1 and "prefetch failed" in out3, f"failed download, required: exit {rc3}: {out3}"
        return "no lock -> exit 0; hub off -> exit 0; download failure -> exit 0 (1 when required)"

    # --- 6. a live daemon: health services and /metrics --------------------------------------
    metrics_text = None

    def live_daemon():
        nonlocal metrics_text
        if not have_server:
            raise Skip(f"{server_bin} is not built: metric names compared with the sources instead")
        gp, hp = free_port(), free_port()
        cfg = os.path.join(work, "live.yaml")
        with open(cfg, "w") as f:
            f.write(yaml.safe_dump({
                "server": {"grpc_address": f"127.0.0.1:{gp}", "http_address": f"127.0.0.1:{hp}",
                           "drain_seconds": 0, "log_level": "warn"},
                "model_repository": os.path.join(ROOT, "examples", "model_repository"),
                "device": "cpu", "kernels": {"hub_kernels": False}}))
        log = open(os.path.join(work, "server.log"), "w")
        proc = subprocess.Popen([server_bin, "--config", cfg], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "LIBREYOLO_HUB_KERNELS": "0"})
        try:
            ready = False
            deadline = time.time() + 40
            while time.time() < deadline and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{hp}/v2/health/ready", timeout=2) as r:
                        ready = r.status == 200
                except Exception:
                    pass
                if ready:
                    break
                time.sleep(0.25)
            if not ready:
                log.flush()
                tail = read(os.path.join(work, "server.log"))[-1500:]
                raise AssertionError(f"daemon not ready on 127.0.0.1:{hp} within 40 s (exit {proc.poll()}): {tail}")
            detail = []
            if os.access(client_bin, os.X_OK):
                for service in ("liveness", "readiness"):
                    r = subprocess.run([client_bin, "health", "--server", f"127.0.0.1:{gp}", "--service", service],
                                       capture_output=True, text=True, timeout=20)
                    assert r.returncode == 0 and "SERVING" in r.stdout.upper() + r.stderr.upper() and \
                        "NOT_SERVING" not in r.stdout.upper(), f"health {service}: exit {r.returncode} {r.stdout}{r.stderr}"
                r = subprocess.run([client_bin, "health", "--server", f"127.0.0.1:{gp}", "--service", "no-such"],
                                   capture_output=True, text=True, timeout=20)
                assert r.returncode != 0, "an unknown health service answered"
                detail.append("grpc.health.v1 liveness+readiness SERVING")
                img = os.path.join(ROOT, "tests", "fixtures", "images", "astronaut.jpg")
                if os.path.exists(img):
                    r = subprocess.run([client_bin, "detect", "--image", img, "--server", f"127.0.0.1:{gp}",
                                        "--model", "rtdetr_tiny"], capture_output=True, text=True, timeout=60)
                    assert r.returncode == 0, f"detect: {r.stderr}"
                    detail.append("1 inference")
                    # The wrong command for the model's kind says which one fits.
                    for cmd, model, hint in (("classify", "rtdetr_tiny", "is an object detector: use `libreyolo-client detect`"),
                                             ("detect", "vit_tiny", "is an image classifier: use `libreyolo-client classify`")):
                        r = subprocess.run([client_bin, cmd, "--image", img, "--server", f"127.0.0.1:{gp}",
                                            "--model", model], capture_output=True, text=True, timeout=60)
                        assert r.returncode != 0 and f"{model} {hint}" in r.stderr, \
                            f"{cmd} --model {model}: exit {r.returncode}: {r.stderr}"
                    detail.append("wrong command -> hint")
            else:
                detail.append("no libreyolo-client: health services checked in the sources only")
            with urllib.request.urlopen(f"http://127.0.0.1:{hp}/metrics", timeout=5) as r:
                metrics_text = r.read().decode()
            with urllib.request.urlopen(f"http://127.0.0.1:{hp}/active", timeout=5) as r:
                json.loads(r.read().decode())
            n = len([l for l in metrics_text.splitlines() if l.startswith("# TYPE")])
            detail.append(f"/metrics {n} families, /active is JSON")
            return ", ".join(detail)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()

    def runtime_libs():
        if not (have_server and os.access(hub_bin, os.X_OK)):
            raise Skip("libreyolo-server or libreyolo-kernels-hub is not built")
        prefix = os.path.join(work, "image")
        r = subprocess.run(["bash", os.path.join(DEPLOY, "docker", "collect-runtime.sh"), build, prefix, "--link"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"collect-runtime.sh exit {r.returncode}: {r.stderr.strip()[-800:]}"
        env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": os.path.join(prefix, "lib")}
        r = subprocess.run(["ldd", os.path.join(prefix, "bin", "libreyolo-server")], capture_output=True,
                           text=True, env=env, timeout=30)
        assert "not found" not in r.stdout, r.stdout
        outside = [l for l in r.stdout.splitlines() if "=>" in l and prefix not in l and
                   not re.search(r"\b(libc|libm|libdl|libpthread|librt|libutil|libresolv|libanl|ld-linux[^ ]*)\.so", l)]
        assert not outside, f"resolved outside the collected prefix: {outside[:3]}"
        r = subprocess.run([os.path.join(prefix, "bin", "libreyolo-server"), "--config",
                            os.path.join(K8S, "base", "server.yaml"), "--print-config"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        n = len(os.listdir(os.path.join(prefix, "lib")))
        return f"{n} libraries collected; every one resolved inside the prefix; the collected binary runs"
    def tls_daemon():
        if not (have_server and os.access(client_bin, os.X_OK)):
            raise Skip("libreyolo-server or libreyolo-client is not built")
        if "tls" not in state:
            raise Skip("the tls overlay did not pass its static check")
        cfg, server = state["tls"]
        config = server["args"][server["args"].index("--config") + 1]
        etc = os.path.join(work, "etc-tls")
        make_test_certificates(os.path.join(etc, "tls"))  # tls.crt, tls.key, ca.crt as the Secret's items
        gp, hp = free_port(), free_port()
        live = copy.deepcopy(cfg)  # server.tls and restricted_apis unchanged (paths relative to the file)
        live["server"].update({"grpc_address": f"127.0.0.1:{gp}", "http_address": f"127.0.0.1:{hp}",
                               "drain_seconds": 0, "log_level": "warn"})
        live["model_repository"] = os.path.join(ROOT, "examples", "model_repository")
        live["device"] = "cpu"
        live["kernels"] = {"hub_kernels": False}
        with open(os.path.join(etc, "server.yaml"), "w") as f:
            yaml.safe_dump(live, f)
        keys = {v: f"secret-of-{v.lower()}" for v in value_envs(cfg)}
        env = {**os.environ, **keys, "LIBREYOLO_HUB_KERNELS": "0"}

        def probe(name):  # the pod's probe command, its files and port moved to this test's
            cmd = [x.replace(os.path.dirname(config), etc).replace(f"localhost:{grpc_port}", f"localhost:{gp}")
                   for x in server[name]["exec"]["command"]]
            cmd[0] = client_bin
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        log = open(os.path.join(work, "server-tls.log"), "w")
        proc = subprocess.Popen([server_bin, "--config", os.path.join(etc, "server.yaml")], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.time() + 60
            while True:
                r = probe("readinessProbe")
                if r.returncode == 0 or proc.poll() is not None or time.time() > deadline:
                    break
                time.sleep(0.5)
            assert r.returncode == 0, f"readiness probe: exit {r.returncode} {r.stdout}{r.stderr} " \
                                      f"(daemon exit {proc.poll()}: {read(os.path.join(work, 'server-tls.log'))[-800:]})"
            for name in ("startupProbe", "livenessProbe"):
                r = probe(name)
                assert r.returncode == 0, f"{name}: exit {r.returncode} {r.stdout}{r.stderr}"
            plain = subprocess.run([client_bin, "health", "--server", f"localhost:{gp}", "--service", "liveness"],
                                   capture_output=True, text=True, timeout=20)
            assert plain.returncode != 0, "a plain-text health check passed against the TLS port"
            nocert = subprocess.run([client_bin, "health", "--server", f"localhost:{gp}", "--service", "liveness",
                                     "--tls-ca", os.path.join(etc, "tls", "ca.crt")], capture_output=True, text=True, timeout=20)
            assert nocert.returncode != 0, "a client without a certificate passed mutual TLS"
            rules = cfg["server"]["restricted_apis"]
            ctx = ssl.create_default_context(cafile=os.path.join(etc, "tls", "ca.crt"))
            ctx.load_cert_chain(os.path.join(etc, "tls", "tls.crt"), os.path.join(etc, "tls", "tls.key"))
            url = f"https://localhost:{hp}/metrics"
            try:
                urllib.request.urlopen(url, context=ctx, timeout=10)
                raise AssertionError("/metrics answered without the admin header")
            except urllib.error.HTTPError as e:
                body = e.read().decode()
                assert e.code == 403 and json.loads(body) == \
                    {"error": f"This API is restricted, expecting header '{rules['admin']['header']}'"}, (e.code, body)
            req = urllib.request.Request(url, headers={rules["admin"]["header"]: keys[rules["admin"]["value_env"]]})
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                assert resp.status == 200 and b"libreyolo_api_denied_total" in resp.read()
            tls_args = ["--tls-ca", os.path.join(etc, "tls", "ca.crt"), "--tls-cert", os.path.join(etc, "tls", "tls.crt"),
                        "--tls-key", os.path.join(etc, "tls", "tls.key")]
            repo = rules["model-repository"]
            denied = subprocess.run([client_bin, "call", "RepositoryIndex", "--server", f"localhost:{gp}", *tls_args],
                                    capture_output=True, text=True, timeout=20)
            assert denied.returncode != 0 and "PERMISSION_DENIED" in denied.stdout + denied.stderr, \
                f"RepositoryIndex without the header: exit {denied.returncode} {denied.stdout}{denied.stderr}"
            ok = subprocess.run([client_bin, "call", "RepositoryIndex", "--server", f"localhost:{gp}", *tls_args,
                                 "--header", f"{repo['header']}={keys[repo['value_env']]}"],
                                capture_output=True, text=True, timeout=20)
            assert ok.returncode == 0, f"RepositoryIndex with the header: exit {ok.returncode} {ok.stdout}{ok.stderr}"
            return ("the overlay's server.yaml with a test CA: its exec probes pass (startup, readiness, liveness); "
                    "plain text and a client without a certificate fail; /metrics 403 without the admin header, "
                    "200 with it; RepositoryIndex PERMISSION_DENIED without its header, OK with it")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()

    check_concurrently([
        ("configmap server.yaml valid for the daemon", config_valid),
        ("tls overlay's server.yaml on a live daemon", tls_daemon),
        ("init container prefetch script", init_script),
        ("daemon on loopback", live_daemon),
        ("runtime libraries (collect-runtime.sh)", runtime_libs),
    ])

    # --- 7. every metric name used exists -----------------------------------------------------
    def metric_names():
        rule = obj("base", "PrometheusRule")
        groups = rule["spec"]["groups"]
        recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
        used = {}  # name -> where

        def add(expr, where):
            for n in promql_metric_names(expr):
                used.setdefault(n, set()).add(where)
        for g in groups:
            for r in g["rules"]:
                add(r["expr"], "PrometheusRule")
        adapter = yaml.safe_load(read(os.path.join(DEPLOY, "prometheus", "adapter-rules.yaml")))
        for r in adapter["rules"]["custom"]:
            add(r["seriesQuery"], "adapter")
            add(r["metricsQuery"].replace("<<.GroupBy>>", "pod").replace("<<.LabelMatchers>>", ""), "adapter")
        dash = json.loads(read(os.path.join(DEPLOY, "grafana", "libreyolo-server.json")))
        for p in dash["panels"]:
            for t in p.get("targets", []):
                add(t["expr"], "dashboard")
        for v in dash["templating"]["list"]:
            if v["type"] == "query":
                add(re.sub(r"label_values\((.*),\s*\w+\)$", r"\1", v["query"]["query"]), "dashboard")
        ks = yaml.safe_load(read(os.path.join(DEPLOY, "kserve", "inferenceservice.yaml")))
        for m in ks["spec"]["predictor"].get("autoScaling", {}).get("metrics", []):
            add(m["external"]["metric"]["query"], "kserve")
        if metrics_text is not None:
            exported = exported_names(metrics_text)
            source = "the daemon's /metrics"
        else:
            src = read(os.path.join(ROOT, "server", "core", "metrics.cpp"))
            fams = re.findall(r'"(libreyolo_[a-z0-9_]+)"', src)
            hist = re.findall(r'BuildHistogram\(\)\s*\.Name\("(libreyolo_[a-z0-9_]+)"\)', src)
            exported = set(fams) | {h + s for h in hist for s in ("_bucket", "_sum", "_count")}
            source = "server/metrics/metrics.cpp (daemon not run)"
        missing = []
        for n, where in sorted(used.items()):
            if n in recorded or n in EXTERNAL_METRICS:
                continue
            if n not in exported:
                missing.append(f"{n} ({', '.join(sorted(where))})")
        assert not missing, f"not in {source}: {missing}"
        ours = sorted(n for n in used if n.startswith("libreyolo_"))
        assert len(ours) >= 10, f"only {len(ours)} daemon metrics used: {ours}"
        return (f"{len(ours)} daemon metrics found in {source}; {len(recorded)} recording rules; "
                f"external: {', '.join(sorted(set(used) & set(EXTERNAL_METRICS)))}")
    check("metric names exist", metric_names)

    # --- 8. promtool ---------------------------------------------------------------------------
    def promtool():
        tool = shutil.which("promtool")
        assert tool, "promtool not found: install the Debian package `prometheus` (scripts/setup.sh)"
        rule = obj("base", "PrometheusRule")
        alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
        assert REQUIRED_ALERTS <= alerts, f"missing alerts {REQUIRED_ALERTS - alerts}"
        p = os.path.join(work, "rules.yaml")
        with open(p, "w") as f:
            yaml.safe_dump({"groups": rule["spec"]["groups"]}, f)
        r = subprocess.run([tool, "check", "rules", p], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        # It can fail: a broken expression is refused.
        broken = copy.deepcopy(rule["spec"]["groups"])
        broken[1]["rules"][0]["expr"] = "sum by (pod (libreyolo_kernel_fallback_total"
        with open(p, "w") as f:
            yaml.safe_dump({"groups": broken}, f)
        r2 = subprocess.run([tool, "check", "rules", p], capture_output=True, text=True, timeout=30)
        assert r2.returncode != 0, "promtool accepted a broken expression"
        m = re.search(r"SUCCESS: (\d+) rules found", r.stdout)
        return f"{m.group(1) if m else '?'} rules, alerts {sorted(alerts)}"
    check("promtool check rules", promtool)

    # --- 9. Dockerfile (hadolint-style rules without an engine) --------------------------------
    def dockerfile():
        lines = []
        for raw in read(os.path.join(ROOT, "Dockerfile")).replace("\\\n", " ").splitlines():
            s = raw.strip()
            if s and not s.startswith("#"):
                lines.append(s)
        args, stages, cur = {}, [], None
        for s in lines:
            ins, _, rest = s.partition(" ")
            ins = ins.upper()
            if ins == "ARG" and cur is None:
                k, _, v = rest.partition("=")
                args[k.strip()] = v.strip().strip('"')
            elif ins == "FROM":
                parts = rest.split()
                name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
                cur = {"from": parts[0], "name": name, "ins": []}
                stages.append(cur)
            elif cur is not None:
                cur["ins"].append((ins, rest))
        names = {st["name"] for st in stages}

        def subst(text):
            return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)
        # Flavors are targets (podman 4.3 cannot follow `FROM builder-${FLAVOR}`): the CPU
        # runtime is the last stage (the default target), the CUDA one `--target cuda`.
        assert "FLAVOR" not in args, "FLAVOR build argument: flavors are targets (cpu, cuda)"
        for n in ("builder-cpu", "builder-cuda", "build-cpu", "build-cuda", "cuda", "cpu"):
            assert n in names, f"no stage {n}: {sorted(n for n in names if n)}"
        bases = set()
        for st in stages:
            img = subst(st["from"])
            if img in names:
                continue
            assert "$" not in img, f"unresolved base {img}"
            repo, _, tag = img.rpartition(":") if ":" in img.split("/")[-1] else (img, "", "")
            assert tag and tag != "latest" and "latest" not in tag, f"base image {img} is not pinned"
            assert re.search(r"\d", tag), f"base image {img}: tag without a version"
            bases.add(img)
        assert any(b.startswith("debian:12") for b in bases), f"no debian:12 base: {bases}"
        assert any(b.startswith("nvidia/cuda:") for b in bases), f"no NVIDIA CUDA base: {bases}"
        assert "latest" not in " ".join(lines).replace("LATEST", ""), "`latest` in the Dockerfile"
        by = {st["name"]: st for st in stages}
        assert stages[-1]["name"] == "cpu", f"last stage (the default target) is {stages[-1]['name']}, not cpu"
        assert by["build-cpu"]["from"] == "builder-cpu" and by["build-cuda"]["from"] == "builder-cuda"
        runs = {st["name"]: " ".join(r for i, r in st["ins"] if i == "RUN") for st in stages}
        for b in ("builder-cpu", "builder-cuda"):
            assert "scripts/setup.sh" in runs.get(b, ""), f"{b} does not run scripts/setup.sh"
        for b in ("build-cpu", "build-cuda"):
            assert "deploy/docker/build-in-image.sh" in runs[b], f"{b} does not run deploy/docker/build-in-image.sh"
            assert "--mount=type=cache" in runs[b] and "target=/ccache" in runs[b], f"{b}: no ccache mount"
        step = read(os.path.join(DEPLOY, "docker", "build-in-image.sh"))
        assert "scripts/build.sh" in step and "collect-runtime.sh" in step, "build-in-image.sh: build.sh + collect-runtime.sh"
        envs = {st["name"]: " ".join(r for i, r in st["ins"] if i == "ENV") for st in stages}
        assert "Torch_DIR=" in envs["builder-cuda"], "CUDA builder does not point CMake at LibTorch (Torch_DIR)"
        # The CPU builder: Debian and PyPI only unless TORCH_INDEX_URL names another index.
        assert "download.pytorch.org" not in envs["builder-cpu"] + runs["builder-cpu"], "CPU builder: an index other than PyPI by default"
        cpu_args = [r for i, r in by["builder-cpu"]["ins"] if i == "ARG"]
        assert "TORCH_INDEX_URL=" in cpu_args, f"builder-cpu: TORCH_INDEX_URL must default to empty: {cpu_args}"
        assert "-DLIBREYOLO_TORCH_CUDA=OFF" in envs["builder-cpu"], "CPU builder must link LibTorch's CPU side only"
        for st in stages:
            if st["name"] in ("cpu", "cuda"):
                assert not re.search(r"\b(apt-get|apt|dpkg|pip|apk)\b", runs[st["name"]]), \
                    f"{st['name']}: a package manager runs in the runtime image"
        # The two runtime stages: the same instructions but FROM, the build stage copied from and
        # the flavor label (a fix in one and not the other would drift).
        def norm(st):
            return [(i, r.replace(f'"{st["name"]}"', '"FLAVOR"').replace(f"build-{st['name']}", "build-FLAVOR"))
                    for i, r in st["ins"]]
        assert norm(by["cpu"]) == norm(by["cuda"]), "runtime stages cpu and cuda differ beyond FROM/COPY --from/flavor"
        assert f'io.libreyolo.flavor="cpu"' in " ".join(r for i, r in by["cpu"]["ins"] if i == "LABEL")
        final = by["cpu"]
        users = [r for i, r in final["ins"] if i == "USER"]
        assert users, "final stage has no USER"
        uid = users[-1].split(":")[0]
        assert uid not in ("0", "root") and uid.isdigit(), f"USER {users[-1]}: must be a numeric non-root uid"
        expose = " ".join(r for i, r in final["ins"] if i == "EXPOSE").split()
        assert sorted(int(p) for p in expose) == sorted([http_port, grpc_port]), f"EXPOSE {expose}"
        vols = " ".join(r for i, r in final["ins"] if i == "VOLUME")
        cfg = yaml.safe_load(server_yaml("base"))
        for v in (cfg["model_repository"], cfg["kernels"]["hub"]["cache_dir"]):
            assert f'"{v}"' in vols or f" {v}" in f" {vols}", f"no VOLUME {v}"
        entry = " ".join(r for i, r in final["ins"] if i == "ENTRYPOINT")
        assert "libreyolo-server" in entry, f"ENTRYPOINT {entry}"
        pod_uid = obj("base", "Deployment")["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        assert int(uid) == pod_uid, f"image uid {uid} != pod runAsUser {pod_uid}"
        ignore = read(os.path.join(ROOT, ".dockerignore")).split()
        assert ".git" in ignore and any(x.startswith("build") for x in ignore), ".dockerignore"
        lint = "hadolint not installed"
        if shutil.which("hadolint"):
            r = subprocess.run([shutil.which("hadolint"), os.path.join(ROOT, "Dockerfile")],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, f"hadolint: {r.stdout}{r.stderr}"
            lint = "hadolint clean"
        return (f"{len(stages)} stages, bases {sorted(bases)}, USER {users[-1]}, EXPOSE {' '.join(expose)}, "
                f"setup.sh + build-in-image.sh in the builders, runtimes cpu = cuda, {lint}")
    check("Dockerfile rules", dockerfile)


    # --- 10. KServe -----------------------------------------------------------------------------
    def kserve():
        (rt,) = load_all(os.path.join(DEPLOY, "kserve", "clusterservingruntime.yaml"))
        (isvc,) = load_all(os.path.join(DEPLOY, "kserve", "inferenceservice.yaml"))
        assert rt["kind"] == "ClusterServingRuntime" and rt["apiVersion"] == "serving.kserve.io/v1alpha1", rt["kind"]
        assert {"grpc-v2", "v2"} <= set(rt["spec"]["protocolVersions"]), rt["spec"]["protocolVersions"]
        formats = {f["name"] for f in rt["spec"]["supportedModelFormats"]}
        served = served_model_types()
        # Every model_type the daemon serves (detectors and, since the classifier work, ViT/Swin)
        # is advertised, and nothing it cannot load.
        assert formats == served, f"formats {formats}, loadable {served}"
        (c,) = rt["spec"]["containers"]
        assert c["name"] == "kserve-container", c["name"]
        assert [p["containerPort"] for p in c["ports"]] == [grpc_port] and c["ports"][0]["name"] == "h2c", c["ports"]
        assert c["args"][c["args"].index("--model-repository") + 1] == "/mnt/models", c["args"]
        assert c["readinessProbe"]["grpc"] == {"port": grpc_port, "service": "readiness"}, c["readinessProbe"]
        assert c["livenessProbe"]["grpc"] == {"port": grpc_port, "service": "liveness"}, c["livenessProbe"]
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False, sc
        assert rt["spec"]["annotations"]["prometheus.kserve.io/port"] == str(http_port), "metrics port annotation"
        m = isvc["spec"]["predictor"]["model"]
        assert m["runtime"] == rt["metadata"]["name"] and m["modelFormat"]["name"] in formats, m
        assert m["protocolVersion"] in rt["spec"]["protocolVersions"], m["protocolVersion"]
        grace = isvc["spec"]["predictor"]["terminationGracePeriodSeconds"]
        drain = yaml.safe_load(server_yaml("base"))["server"]["drain_seconds"]
        assert grace >= drain + longest_request_seconds(), \
            f"InferenceService terminationGracePeriodSeconds {grace} < drain {drain} + {longest_request_seconds()}"
        return f"formats {sorted(formats)} (loadable: {sorted(served)}), protocols {rt['spec']['protocolVersions']}"
    check("kserve runtime + inferenceservice", kserve)

    # --- 11. the dashboard is what its generator writes ----------------------------------------
    def dashboard():
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import make_dashboard
        committed = read(os.path.join(DEPLOY, "grafana", "libreyolo-server.json"))
        assert committed == make_dashboard.render(), \
            "deploy/grafana/libreyolo-server.json differs from tests/deploy/make_dashboard.py (re-run it)"
        d = json.loads(committed)
        titles = " | ".join(p["title"] for p in d["panels"] if p["type"] != "row").lower()
        for want in ("request rate", "p50 / p99", "batch size", "pending", "active implementation", "fallback"):
            assert want in titles, f"no panel about {want}"
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), "duplicate panel ids"
        return f"{len(d['panels'])} panels"
    check("grafana dashboard", dashboard)

    shutil.rmtree(work, ignore_errors=True)
    print(f"deploy checks took {time.time() - t0:.1f} s")
    line = f"{results['passed']} passed, {results['failed']} failed"
    if results["skipped"]:
        line += f", {results['skipped']} skipped"
    print(line)
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
