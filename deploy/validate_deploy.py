#!/usr/bin/env python3
"""Consistency checks of deploy/ that no schema can express; run by deploy/validate.sh.

usage: validate_deploy.py REPO_ROOT RENDERED_DIR
  RENDERED_DIR holds one `kubectl kustomize` output per kustomization, named
  base.yaml and <overlay>.yaml (the overlay folder's name).

Checks:
  * deploy/coloc.example.toml has exactly the keys of the built-in defaults in
    src/settings/mod.rs (DEFAULTS), with the same values;
  * every rendered object has apiVersion, kind, metadata.name;
  * the Deployment: 1 replica, Recreate (the replicas overlay: 3 replicas on PostgreSQL,
    RollingUpdate with maxUnavailable 0, readiness on the health service coloc.v1.Ready, the
    database URL from a rendered Secret, no PVC, a PodDisruptionBudget selecting the pod),
    gRPC startup/liveness/readiness probes on 50051,
    non-root, read-only root filesystem, every volume mount backed by a volume and every
    ConfigMap/Secret/PVC it names rendered alongside, the data volume is the PVC,
    terminationGracePeriodSeconds above server.shutdown_grace_secs;
  * the ConfigMap's coloc.toml parses, uses only known keys, listens on the network only with
    auth on, points auth.tokens_file into the Secret's mount and database.url onto the PVC;
  * the Service selects the pod and exposes 50051 (grpc) and 50052 (metrics);
  * the gpu-profiler overlay: nvidia.com/gpu: 1, a GPU nodeSelector and toleration,
    COLOC__PROFILER__BACKEND=nvml and absolute COLOC__PROFILER__ALLOWED_PROGRAMS; the base
    asks for no GPU;
  * the scheduler-extender overlay: the KubeSchedulerConfiguration in the second
    scheduler's ConfigMap (known ExtenderConfig fields only, ignorable, nodeCacheCapable
    with coloc's watcher on, the verbs and URL coloc serves: the Service's extender port,
    extender.url_prefix, HTTPS iff extender TLS), the scheduler Deployment mounting it, the
    advisor's ServiceAccount with get/list/watch on pods and nodes only, and the extender
    port open only to the scheduler's pods;
  * the binding-hami and binding-dra overlays: extender.binding as the overlay says, the
    extender over HTTPS with its certificate from a mounted Secret, the watcher on with
    get/list/watch rights only (ResourceSlices too under DRA), one MutatingWebhookConfiguration
    (failurePolicy Ignore, no side effects on dry runs, AdmissionReview v1, a short timeout, the
    Service's extender port and <url_prefix>/mutate, Pod creates under hami, ResourceClaim
    creates under dra, coloc's namespace left out), and under hami HAMi's scheduler
    configuration listing coloc's filter (ignorable, HTTPS, coloc's URL) BEFORE HAMi's extender.
"""

import ipaddress
import os
import re
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib
import yaml

errors = []


def fail(where, message):
    errors.append(f"{where}: {message}")


def flat(table, prefix=""):
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_example_toml(root):
    settings = open(os.path.join(root, "src/settings/mod.rs"), encoding="utf-8").read()
    match = re.search(r'const DEFAULTS: &str = r#"(.*?)"#;', settings, re.S)
    if not match:
        fail("src/settings/mod.rs", "DEFAULTS block not found; cannot compare the example")
        return None
    defaults = flat(tomllib.loads(match.group(1)))
    path = "deploy/coloc.example.toml"
    with open(os.path.join(root, path), "rb") as f:
        example_doc = tomllib.load(f)
    example = flat(example_doc)
    for key in sorted(defaults.keys() - example.keys()):
        fail(path, f"missing key {key} (default {defaults[key]!r})")
    for key in sorted(example.keys() - defaults.keys()):
        fail(path, f"key {key} is not a setting in src/settings/mod.rs (the service would refuse it)")
    for key in sorted(defaults.keys() & example.keys()):
        if example[key] != defaults[key] or type(example[key]) is not type(defaults[key]):
            fail(path, f"{key} = {example[key]!r}, but the default is {defaults[key]!r}")
    order = ["server", "database", "model", "profiler", "agents", "trainer", "leader", "observer", "metrics", "extender", "policy", "auth", "log"]
    if list(example_doc) != order:
        fail(path, f"sections {list(example_doc)}, expected {order}")
    # Every key needs its one-line comment right above it.
    lines = open(os.path.join(root, path), encoding="utf-8").read().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[a-z_]+\s*=", line) and not (i and lines[i - 1].startswith("#")):
            fail(path, f"line {i + 1} ({line.split('=')[0].strip()}) has no comment above it")
    return defaults


def is_loopback(listen):
    host = listen.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_render(name, path, defaults):
    where = f"rendered {name}"
    docs = [d for d in yaml.safe_load_all(open(path, encoding="utf-8")) if d is not None]
    by_kind = {}
    for d in docs:
        for field in ("apiVersion", "kind"):
            if not d.get(field):
                fail(where, f"an object without {field}: {str(d)[:80]}")
        if not (d.get("metadata") or {}).get("name"):
            fail(where, f"a {d.get('kind')} without metadata.name")
        by_kind.setdefault(d.get("kind"), []).append(d)

    deployments = [d for d in by_kind.get("Deployment", []) if d["metadata"]["name"] == "coloc"]
    others = [d for d in by_kind.get("Deployment", []) if d["metadata"]["name"] != "coloc"]
    if len(deployments) != 1:
        fail(where, f"{len(deployments)} Deployments named coloc, expected exactly 1")
        return
    if others and name != "scheduler-extender":
        fail(where, f"Deployments {[d['metadata']['name'] for d in others]} besides coloc")
    dep = deployments[0]
    spec = dep["spec"]
    replicated = name == "replicas"
    if replicated:
        check_replicas(where, spec, by_kind)
    else:
        if spec.get("replicas") != 1:
            fail(where, f"Deployment replicas = {spec.get('replicas')}, must be 1 (SQLite)")
        if (spec.get("strategy") or {}).get("type") != "Recreate":
            fail(where, "Deployment strategy must be Recreate (never two pods on one SQLite file)")
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"].get("labels", {})
    containers = {c["name"]: c for c in pod["containers"]}
    c = containers.get("coloc")
    if c is None:
        fail(where, "no container named coloc")
        return
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        port = ((c.get(probe) or {}).get("grpc") or {}).get("port")
        if port != 50051:
            fail(where, f"{probe} must be a gRPC probe on port 50051 (found {c.get(probe)})")
    ports = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
    if ports.get(50051) != "grpc" or ports.get(50052) != "metrics":
        fail(where, f"container ports {ports}, expected 50051 grpc and 50052 metrics")
    psc, csc = pod.get("securityContext") or {}, c.get("securityContext") or {}
    if not (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")):
        fail(where, "runAsNonRoot is not set")
    if csc.get("readOnlyRootFilesystem") is not True:
        fail(where, "readOnlyRootFilesystem must be true")
    if csc.get("allowPrivilegeEscalation") is not False:
        fail(where, "allowPrivilegeEscalation must be false")
    if "ALL" not in ((csc.get("capabilities") or {}).get("drop") or []):
        fail(where, "capabilities must drop ALL")
    res = c.get("resources") or {}
    if not res.get("requests") or not res.get("limits"):
        fail(where, "the container needs resource requests and limits")

    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    for m in mounts.values():
        if m["name"] not in volumes:
            fail(where, f"volumeMount {m['name']} has no volume")
    names = {k: {d["metadata"]["name"] for d in v} for k, v in by_kind.items()}
    secret_mounts, pvc_mounts, config_name = {}, {}, None
    for path_, m in mounts.items():
        v = volumes.get(m["name"], {})
        if "configMap" in v:
            config_name = v["configMap"]["name"]
            if config_name not in names.get("ConfigMap", set()):
                fail(where, f"ConfigMap {config_name} is mounted but not rendered")
        if "secret" in v:
            secret_mounts[path_] = v["secret"]["secretName"]
            if v["secret"]["secretName"] not in names.get("Secret", set()):
                fail(where, f"Secret {v['secret']['secretName']} is mounted but not rendered")
        if "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"]["claimName"]
            pvc_mounts[path_] = claim
            if claim not in names.get("PersistentVolumeClaim", set()):
                fail(where, f"PVC {claim} is mounted but not rendered")
    if replicated:
        if pvc_mounts or by_kind.get("PersistentVolumeClaim"):
            fail(where, "replicas on PostgreSQL need no PVC")
    elif "/var/lib/coloc" not in pvc_mounts:
        fail(where, "/var/lib/coloc (the SQLite file) must be the PVC")
    for pvc in by_kind.get("PersistentVolumeClaim", []):
        if pvc["spec"].get("accessModes") != ["ReadWriteOnce"]:
            fail(where, f"PVC {pvc['metadata']['name']} should be ReadWriteOnce")

    # The config file the pod runs with.
    config = None
    for cm in by_kind.get("ConfigMap", []):
        if cm["metadata"]["name"] == config_name:
            text = (cm.get("data") or {}).get("coloc.toml")
            if text is None:
                fail(where, f"ConfigMap {config_name} has no coloc.toml")
                continue
            try:
                config = flat(tomllib.loads(text))
            except tomllib.TOMLDecodeError as e:
                fail(where, f"coloc.toml in ConfigMap {config_name} is not TOML: {e}")
    if "/etc/coloc/coloc.toml" not in mounts:
        fail(where, "coloc.toml is not mounted at /etc/coloc/coloc.toml")
    args = (c.get("command") or []) + (c.get("args") or [])
    if args[-3:] != ["serve", "--config", "/etc/coloc/coloc.toml"]:
        fail(where, f"the container does not run `coloc serve --config /etc/coloc/coloc.toml`: {args}")
    if config is not None:
        effective = dict(defaults or {})
        effective.update(config)
        if defaults:
            for key in sorted(config.keys() - defaults.keys()):
                fail(where, f"coloc.toml key {key} is not a setting")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        for k, v in env.items():
            if k.startswith("COLOC__"):
                key = k[len("COLOC__"):].lower().replace("__", ".")
                if defaults and key not in defaults:
                    fail(where, f"env {k} names no setting ({key})")
                effective[key] = v
        listen = effective.get("server.listen", "")
        tokens = effective.get("auth.tokens_file", "")
        if not is_loopback(listen):
            if not tokens and not effective.get("server.allow_unauthenticated_non_loopback"):
                fail(where, f"listen {listen} without auth: the service would refuse to start")
        if not listen.endswith(":50051"):
            fail(where, f"server.listen {listen} is not on port 50051 (the probes' port)")
        if tokens and os.path.dirname(tokens) not in secret_mounts:
            fail(where, f"auth.tokens_file {tokens} is not inside a mounted Secret {secret_mounts}")
        url = effective.get("database.url", "")
        if replicated:
            url_env = [e for e in c.get("env", []) if e["name"] == "COLOC__DATABASE__URL"]
            ref = ((url_env[0].get("valueFrom") or {}).get("secretKeyRef") or {}) if url_env else {}
            if ref.get("name") not in names.get("Secret", set()) or not ref.get("key"):
                fail(where, f"COLOC__DATABASE__URL must come from a rendered Secret ({url_env})")
            for secret in by_kind.get("Secret", []):
                if secret["metadata"]["name"] == ref.get("name"):
                    import base64
                    value = base64.b64decode((secret.get("data") or {}).get(ref.get("key"), "")).decode()
                    if not value.startswith(("postgres://", "postgresql://")):
                        fail(where, f"Secret {ref.get('name')} holds no postgres:// URL")
        elif not url.startswith("sqlite:///var/lib/coloc/"):
            fail(where, f"database.url {url} is not on the PVC at /var/lib/coloc")
        if effective.get("metrics.listen", "") != "0.0.0.0:50052":
            fail(where, "metrics.listen should be 0.0.0.0:50052 (the Service's metrics port)")
        grace = int(effective.get("server.shutdown_grace_secs", 20))
        if pod.get("terminationGracePeriodSeconds", 30) <= grace:
            fail(where, f"terminationGracePeriodSeconds must exceed shutdown_grace_secs ({grace})")
        if effective.get("server.tls_cert_file"):
            fail(where, "TLS is on but Kubernetes gRPC probes are plaintext")

    services = by_kind.get("Service", [])
    if len(services) != 1:
        fail(where, f"{len(services)} Services, expected 1")
    for svc in services:
        sel = svc["spec"].get("selector") or {}
        if not sel or any(pod_labels.get(k) != v for k, v in sel.items()):
            fail(where, f"Service selector {sel} does not select the pod ({pod_labels})")
        sports = {p["port"]: p.get("name") for p in svc["spec"].get("ports", [])}
        if sports.get(50051) != "grpc" or sports.get(50052) != "metrics":
            fail(where, f"Service ports {sports}, expected 50051 grpc and 50052 metrics")

    policies = by_kind.get("NetworkPolicy", [])
    if len(policies) != 1:
        fail(where, f"{len(policies)} NetworkPolicies, expected 1")
    for policy in policies:
        sel = (policy["spec"].get("podSelector") or {}).get("matchLabels") or {}
        if not sel or any(pod_labels.get(k) != v for k, v in sel.items()):
            fail(where, f"NetworkPolicy selector {sel} does not select the pod")
        if policy["spec"].get("policyTypes") != ["Ingress"]:
            fail(where, "the NetworkPolicy should restrict Ingress only")
        allowed = [p.get("port") for rule in policy["spec"].get("ingress", []) for p in rule.get("ports", [])]
        expected_ports = ["grpc", "metrics"] + (["extender"] if name in EXTENDER_OVERLAYS else [])
        if sorted(map(str, allowed)) != sorted(expected_ports):
            fail(where, f"NetworkPolicy opens ports {allowed}, expected exactly {expected_ports}")

    gpu = str(((res.get("limits") or {}).get("nvidia.com/gpu")) or "")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    if name == "gpu-profiler":
        if gpu != "1":
            fail(where, f"limits nvidia.com/gpu = {gpu!r}, expected 1")
        if not any(k.startswith("nvidia.com/gpu") for k in (pod.get("nodeSelector") or {})):
            fail(where, "no nvidia.com/gpu nodeSelector")
        if not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations") or []):
            fail(where, "no toleration for nvidia.com/gpu")
        if env.get("COLOC__PROFILER__BACKEND") != "nvml":
            fail(where, "COLOC__PROFILER__BACKEND must be nvml")
        programs = [p for p in (env.get("COLOC__PROFILER__ALLOWED_PROGRAMS") or "").split(",") if p]
        if not programs or not all(p.startswith("/") for p in programs):
            fail(where, f"COLOC__PROFILER__ALLOWED_PROGRAMS must be absolute globs: {programs}")
    elif name in ("base", "agents") and gpu:
        fail(where, f"the advisor asks for a GPU in {name}; only the gpu-profiler overlay should")
    daemonsets = by_kind.get("DaemonSet", [])
    if name == "agents":
        check_agents(where, daemonsets, defaults, effective if config is not None else {})
    elif daemonsets:
        fail(where, "a DaemonSet outside the agents overlay")
    if name == "scheduler-extender":
        check_scheduler_extender(where, by_kind, dep, others, effective if config is not None else {})
    elif name in BINDING_OVERLAYS:
        check_binding(where, name, by_kind, dep, effective if config is not None else {}, secret_mounts)
    elif (effective if config is not None else {}).get("extender.listen"):
        fail(where, "the extender is on outside the scheduler-extender overlay")
    print(f"  {name}: {len(docs)} objects ({', '.join(sorted(by_kind))}) checked")


def check_replicas(where, spec, by_kind):
    """The replicas overlay: 3 pods rolled one at a time, Ready once a champion is served,
    and a PodDisruptionBudget over them."""
    if spec.get("replicas") != 3:
        fail(where, f"Deployment replicas = {spec.get('replicas')}, expected 3")
    strategy = spec.get("strategy") or {}
    rolling = strategy.get("rollingUpdate") or {}
    if strategy.get("type") != "RollingUpdate" or rolling.get("maxUnavailable") != 0:
        fail(where, f"strategy {strategy}: expected RollingUpdate with maxUnavailable 0")
    container = {c["name"]: c for c in spec["template"]["spec"]["containers"]}.get("coloc", {})
    ready = (container.get("readinessProbe") or {}).get("grpc") or {}
    if ready.get("service") != "coloc.v1.Ready":
        fail(where, f"readinessProbe {ready}: expected the health service coloc.v1.Ready")
    pod_labels = spec["template"]["metadata"].get("labels", {})
    budgets = by_kind.get("PodDisruptionBudget", [])
    if len(budgets) != 1:
        fail(where, f"{len(budgets)} PodDisruptionBudgets, expected 1")
    for pdb in budgets:
        sel = (pdb["spec"].get("selector") or {}).get("matchLabels") or {}
        if not sel or any(pod_labels.get(k) != v for k, v in sel.items()):
            fail(where, f"PodDisruptionBudget selector {sel} does not select the pod")
        if pdb["spec"].get("maxUnavailable") != 1 and pdb["spec"].get("minAvailable") != 2:
            fail(where, "the PodDisruptionBudget should keep 2 of 3 pods")


def check_agents(where, daemonsets, defaults, advisor_settings):
    """The agents overlay: a DaemonSet running `coloc agent` on GPU nodes with one GPU each
    and the NVIDIA runtime, talking to the advisor's Service; the advisor without a GPU and
    without an in-process profiler."""
    if len(daemonsets) != 1:
        fail(where, f"{len(daemonsets)} DaemonSets, expected the agents' 1")
        return
    pod = daemonsets[0]["spec"]["template"]["spec"]
    containers = pod.get("containers", [])
    if len(containers) != 1:
        fail(where, "the agent pod should run one container")
        return
    c = containers[0]
    args = (c.get("command") or []) + (c.get("args") or [])
    if args[:2] != ["coloc", "agent"]:
        fail(where, f"the DaemonSet does not run `coloc agent`: {args}")
    limits = (c.get("resources") or {}).get("limits") or {}
    if str(limits.get("nvidia.com/gpu", "")) != "1":
        fail(where, "the agent must ask for nvidia.com/gpu: 1")
    if not any(k.startswith("nvidia.com/gpu") for k in (pod.get("nodeSelector") or {})):
        fail(where, "the agent has no nvidia.com/gpu nodeSelector")
    if not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations") or []):
        fail(where, "the agent has no toleration for nvidia.com/gpu")
    if pod.get("runtimeClassName") != "nvidia":
        fail(where, "the agent must run with runtimeClassName: nvidia")
    csc = c.get("securityContext") or {}
    if csc.get("readOnlyRootFilesystem") is not True or csc.get("allowPrivilegeEscalation") is not False:
        fail(where, "the agent container must be read-only and without privilege escalation")
    env = {e["name"]: e for e in c.get("env", [])}
    if not (env.get("COLOC_ADDR") or {}).get("value", "").endswith(":50051"):
        fail(where, "COLOC_ADDR must name the advisor's gRPC port")
    if "secretKeyRef" not in ((env.get("COLOC_TOKEN") or {}).get("valueFrom") or {}):
        fail(where, "COLOC_TOKEN must come from a Secret")
    for k, e in env.items():
        if k.startswith("COLOC__"):
            key = k[len("COLOC__"):].lower().replace("__", ".")
            if defaults and key not in defaults:
                fail(where, f"agent env {k} names no setting ({key})")
    if (env.get("COLOC__PROFILER__BACKEND") or {}).get("value") != "nvml":
        fail(where, "the agent's COLOC__PROFILER__BACKEND must be nvml")
    if advisor_settings.get("profiler.backend", "off") != "off":
        fail(where, "the advisor profiles in-process beside agents; its backend should be off")


# k8s.io/kube-scheduler/config/v1 Extender: its JSON fields.
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
    "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
    "ignorable",
}


def check_scheduler_extender(where, by_kind, advisor, others, effective):
    """The second scheduler and its extender block against what coloc serves."""
    pod = advisor["spec"]["template"]["spec"]
    coloc = {c["name"]: c for c in pod["containers"]}["coloc"]
    listen = str(effective.get("extender.listen", ""))
    if not listen:
        return fail(where, "extender.listen is not set: the extender is off")
    port = int(listen.rsplit(":", 1)[1])
    ports = {p.get("name"): p["containerPort"] for p in coloc.get("ports", [])}
    if ports.get("extender") != port:
        fail(where, f"container port extender {ports.get('extender')} != extender.listen port {port}")
    if not is_loopback(listen) and not (
        effective.get("extender.tls_client_ca_file") or effective.get("extender.require_token")
        or str(effective.get("server.allow_unauthenticated_non_loopback")).lower() == "true"
    ):
        fail(where, f"extender.listen {listen} unauthenticated: the service would refuse to start")
    watching = str(effective.get("extender.watch_cluster")).lower() == "true"
    # The watcher's identity and rights.
    account = pod.get("serviceAccountName")
    if watching:
        if account != "coloc" or pod.get("automountServiceAccountToken") is not True:
            fail(where, "the watcher needs serviceAccountName coloc with its token mounted")
        roles = {r["metadata"]["name"]: r for r in by_kind.get("ClusterRole", [])}
        bound = [
            b for b in by_kind.get("ClusterRoleBinding", [])
            if any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   and s.get("namespace") == advisor["metadata"].get("namespace")
                   for s in b.get("subjects", []))
        ]
        if len(bound) != 1 or bound[0]["roleRef"]["name"] not in roles:
            fail(where, f"the ServiceAccount {account} should be bound to one rendered ClusterRole")
        else:
            rules = roles[bound[0]["roleRef"]["name"]].get("rules", [])
            for rule in rules:
                if rule.get("apiGroups") != [""] or not set(rule.get("resources", [])) <= {"pods", "nodes"} \
                        or not set(rule.get("verbs", [])) <= {"get", "list", "watch"}:
                    fail(where, f"the watcher's role grants more than get/list/watch pods, nodes: {rule}")
            granted = {r for rule in rules for r in rule.get("resources", [])}
            if granted != {"pods", "nodes"}:
                fail(where, f"the watcher's role covers {sorted(granted)}, expected pods and nodes")
    # The scheduler and its configuration.
    schedulers = [d for d in others if d["metadata"]["name"] == "coloc-scheduler"]
    if len(schedulers) != 1 or len(others) != 1:
        return fail(where, "expected exactly one other Deployment, coloc-scheduler")
    spod = schedulers[0]["spec"]["template"]["spec"]
    container = spod["containers"][0]
    args = (container.get("command") or []) + (container.get("args") or [])
    config_path = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    if not config_path:
        return fail(where, f"kube-scheduler runs without --config: {args}")
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in spod.get("volumes", [])}
    directory, file_name = config_path.rsplit("/", 1)
    volume = volumes.get(mounts.get(directory, ""), {})
    cm_name = (volume.get("configMap") or {}).get("name")
    cms = {c["metadata"]["name"]: c for c in by_kind.get("ConfigMap", [])}
    text = (cms.get(cm_name, {}).get("data") or {}).get(file_name)
    if text is None:
        return fail(where, f"--config {config_path} is not a file of a rendered ConfigMap")
    config = yaml.safe_load(text)
    if (config.get("apiVersion"), config.get("kind")) != ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration"):
        fail(where, f"{config.get('apiVersion')}/{config.get('kind')} is not a v1 KubeSchedulerConfiguration")
    names = [p.get("schedulerName") for p in config.get("profiles", [])]
    if names != ["coloc-scheduler"]:
        fail(where, f"profiles {names}, expected one named coloc-scheduler")
    extenders = config.get("extenders") or []
    if len(extenders) != 1:
        return fail(where, f"{len(extenders)} extenders, expected coloc alone")
    ext = extenders[0]
    unknown = set(ext) - EXTENDER_FIELDS
    if unknown:
        fail(where, f"extender fields {sorted(unknown)} are not kube-scheduler's")
    if ext.get("ignorable") is not True:
        fail(where, "the extender must be ignorable: coloc may never stop scheduling")
    if ext.get("nodeCacheCapable") is True and not watching:
        fail(where, "nodeCacheCapable sends node names only: coloc needs extender.watch_cluster")
    if (ext.get("filterVerb"), ext.get("prioritizeVerb")) != ("filter", "prioritize"):
        fail(where, f"verbs {ext.get('filterVerb')}/{ext.get('prioritizeVerb')}, coloc serves filter/prioritize")
    if not isinstance(ext.get("weight"), int) or ext["weight"] < 1:
        fail(where, f"weight {ext.get('weight')} must be a positive integer")
    https = bool(effective.get("extender.tls_cert_file"))
    if bool(ext.get("enableHTTPS")) != https:
        fail(where, f"enableHTTPS {ext.get('enableHTTPS')} but coloc's extender TLS is {'on' if https else 'off'}")
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    service = services.get("coloc")
    sport = next((p["port"] for p in (service or {}).get("spec", {}).get("ports", []) if p.get("name") == "extender"), None)
    namespace = advisor["metadata"].get("namespace")
    url = f"{'https' if https else 'http'}://coloc.{namespace}.svc:{sport}{effective.get('extender.url_prefix', '')}"
    if ext.get("urlPrefix") != url:
        fail(where, f"urlPrefix {ext.get('urlPrefix')}, coloc's extender is at {url}")
    # Only the scheduler's pods may reach the extender port.
    scheduler_labels = schedulers[0]["spec"]["template"]["metadata"]["labels"]
    for policy in by_kind.get("NetworkPolicy", []):
        for rule in policy["spec"].get("ingress", []):
            if any(p.get("port") == "extender" for p in rule.get("ports", [])):
                sources = rule.get("from") or []
                ok = sources and all(
                    set(((src.get("podSelector") or {}).get("matchLabels") or {}).items()) <= set(scheduler_labels.items())
                    and (src.get("podSelector") or {}).get("matchLabels") and "namespaceSelector" not in src
                    for src in sources
                )
                if not ok:
                    fail(where, f"the extender port is open beyond the scheduler's pods: {sources}")


EXTENDER_OVERLAYS = ("scheduler-extender", "binding-hami", "binding-dra")
BINDING_OVERLAYS = {"binding-hami": "hami", "binding-dra": "dra"}


def check_binding(where, name, by_kind, advisor, effective, secret_mounts):
    """A binding overlay: the webhook (and under HAMi the scheduler's extender order)
    against what coloc serves."""
    mode = BINDING_OVERLAYS[name]
    if effective.get("extender.binding") != mode:
        fail(where, f"extender.binding is {effective.get('extender.binding')!r}, the overlay is {mode!r}")
    listen = str(effective.get("extender.listen", ""))
    if not listen:
        return fail(where, "extender.listen is not set: no webhook is served")
    pod = advisor["spec"]["template"]["spec"]
    coloc = {c["name"]: c for c in pod["containers"]}["coloc"]
    port = int(listen.rsplit(":", 1)[1])
    ports = {p.get("name"): p["containerPort"] for p in coloc.get("ports", [])}
    if ports.get("extender") != port:
        fail(where, f"container port extender {ports.get('extender')} != extender.listen port {port}")
    if not is_loopback(listen) and not (
        effective.get("extender.tls_client_ca_file") or effective.get("extender.require_token")
        or str(effective.get("server.allow_unauthenticated_non_loopback")).lower() == "true"
    ):
        fail(where, f"extender.listen {listen} unauthenticated: the service would refuse to start")
    cert, key = effective.get("extender.tls_cert_file"), effective.get("extender.tls_key_file")
    if not (cert and key):
        fail(where, "the API server calls webhooks over HTTPS only: set extender.tls_cert_file and _key_file")
    for file in (cert, key):
        if file and os.path.dirname(file) not in secret_mounts:
            fail(where, f"{file} is not inside a mounted Secret {secret_mounts}")
    if str(effective.get("extender.watch_cluster")).lower() != "true":
        fail(where, "the webhook decides over the cluster's GPUs: extender.watch_cluster must be on")
    if pod.get("serviceAccountName") != "coloc" or pod.get("automountServiceAccountToken") is not True:
        fail(where, "the watchers need serviceAccountName coloc with its token mounted")
    wanted = {("", "pods"), ("", "nodes")} | ({("resource.k8s.io", "resourceslices"), ("resource.k8s.io", "resourceclaims")} if mode == "dra" else set())
    granted = set()
    for role in by_kind.get("ClusterRole", []):
        for rule in role.get("rules", []):
            if not set(rule.get("verbs", [])) <= {"get", "list", "watch"}:
                fail(where, f"the watcher's role grants more than get/list/watch: {rule}")
            granted |= {(g, r) for g in rule.get("apiGroups", []) for r in rule.get("resources", [])}
    if granted != wanted:
        fail(where, f"the watcher's role covers {sorted(granted)}, expected {sorted(wanted)}")
    # The webhook.
    configs = by_kind.get("MutatingWebhookConfiguration", [])
    hooks = [h for c in configs for h in c.get("webhooks", [])]
    if len(hooks) != 1:
        return fail(where, f"{len(hooks)} mutating webhooks, expected coloc's 1")
    hook = hooks[0]
    if hook.get("failurePolicy") != "Ignore":
        fail(where, "failurePolicy must be Ignore: coloc may never block a create")
    if hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
        fail(where, f"sideEffects {hook.get('sideEffects')}: coloc takes no hold on a dry run (NoneOnDryRun)")
    if "v1" not in (hook.get("admissionReviewVersions") or []):
        fail(where, "coloc answers AdmissionReview v1 only")
    if not 1 <= int(hook.get("timeoutSeconds", 10)) <= 5:
        fail(where, f"timeoutSeconds {hook.get('timeoutSeconds')}: keep pod creation fast (1..5)")
    namespace = advisor["metadata"].get("namespace")
    service = (hook.get("clientConfig") or {}).get("service") or {}
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    sport = next((p["port"] for p in services.get("coloc", {}).get("spec", {}).get("ports", [])
                  if p.get("name") == "extender"), None)
    path = f"{effective.get('extender.url_prefix', '')}/mutate"
    if (service.get("namespace"), service.get("name"), service.get("port"), service.get("path")) != (namespace, "coloc", sport, path):
        fail(where, f"clientConfig.service {service}, coloc's webhook is {namespace}/coloc:{sport}{path}")
    rules = hook.get("rules") or []
    group, resource = ("", "pods") if mode == "hami" else ("resource.k8s.io", "resourceclaims")
    if [(r.get("apiGroups"), r.get("apiVersions"), r.get("resources"), r.get("operations")) for r in rules] \
            != [([group], ["v1"], [resource], ["CREATE"])]:
        fail(where, f"rules {rules}, expected CREATE of {group or 'core'}/v1 {resource} only")
    excluded = [v for e in (hook.get("namespaceSelector") or {}).get("matchExpressions", [])
                if e.get("key") == "kubernetes.io/metadata.name" and e.get("operator") == "NotIn"
                for v in e.get("values", [])]
    if namespace not in excluded:
        fail(where, f"the webhook should leave coloc's own namespace ({namespace}) out")
    for policy in by_kind.get("NetworkPolicy", []):
        for rule in policy["spec"].get("ingress", []):
            if any(p.get("port") == "extender" for p in rule.get("ports", [])) and not rule.get("from"):
                fail(where, "the extender port is open to every source")
    # HAMi's scheduler: coloc's filter before HAMi's extender.
    hami_cms = [c for c in by_kind.get("ConfigMap", []) if c["metadata"]["name"] == "hami-scheduler-newversion"]
    if mode == "dra":
        if hami_cms:
            fail(where, "the DRA overlay changes no scheduler configuration")
        return
    if len(hami_cms) != 1 or hami_cms[0]["metadata"].get("namespace") != "kube-system":
        return fail(where, "expected HAMi's ConfigMap hami-scheduler-newversion in kube-system")
    config = yaml.safe_load((hami_cms[0].get("data") or {}).get("config.yaml", "")) or {}
    if (config.get("apiVersion"), config.get("kind")) != ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration"):
        fail(where, "HAMi's config.yaml is not a v1 KubeSchedulerConfiguration")
    if [p.get("schedulerName") for p in config.get("profiles", [])] != ["hami-scheduler"]:
        fail(where, "HAMi's profile must stay hami-scheduler (the name HAMi's webhook writes)")
    extenders = config.get("extenders") or []
    url = f"https://coloc.{namespace}.svc:{sport}{effective.get('extender.url_prefix', '')}"
    ours = [i for i, e in enumerate(extenders) if e.get("urlPrefix") == url]
    hami = [i for i, e in enumerate(extenders) if e.get("bindVerb") == "bind"]
    if len(ours) != 1 or len(hami) != 1:
        return fail(where, f"expected coloc's extender at {url} and HAMi's (bindVerb bind): {extenders}")
    if ours[0] > hami[0]:
        fail(where, "coloc's filter must come BEFORE HAMi's extender (kube-scheduler calls them in order)")
    ext = extenders[ours[0]]
    if set(ext) - EXTENDER_FIELDS:
        fail(where, f"extender fields {sorted(set(ext) - EXTENDER_FIELDS)} are not kube-scheduler's")
    if ext.get("filterVerb") != "filter" or ext.get("bindVerb") or ext.get("ignorable") is not True:
        fail(where, "coloc's extender: filterVerb filter, no bindVerb, ignorable true")
    if ext.get("enableHTTPS") is not True:
        fail(where, "coloc's extender is HTTPS in this overlay: enableHTTPS true")
    managed = {m.get("name"): m.get("ignoredByScheduler") for m in extenders[hami[0]].get("managedResources", [])}
    if managed.get("nvidia.com/gpu") is not True:
        fail(where, "HAMi's extender must manage nvidia.com/gpu (ignoredByScheduler true)")


def check_service_monitor(root):
    """The ServiceMonitor (a CRD no bundled schema covers): its shape, and that it selects
    the advisor's Service and scrapes its metrics port."""
    path = os.path.join(root, "deploy/monitoring/servicemonitor.yaml")
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    if len(docs) != 1:
        return fail(path, f"{len(docs)} objects, expected one ServiceMonitor")
    doc = docs[0]
    if (doc.get("apiVersion"), doc.get("kind")) != ("monitoring.coreos.com/v1", "ServiceMonitor"):
        fail(path, f"{doc.get('apiVersion')}/{doc.get('kind')} is not monitoring.coreos.com/v1 ServiceMonitor")
    spec = doc.get("spec") or {}
    with open(os.path.join(root, "deploy/kubernetes/base/service.yaml")) as f:
        service = yaml.safe_load(f)
    labels = service["metadata"]["labels"]
    wanted = (spec.get("selector") or {}).get("matchLabels") or {}
    if not wanted or any(labels.get(k) != v for k, v in wanted.items()):
        fail(path, f"selector {wanted} does not select the Service ({labels})")
    if (spec.get("namespaceSelector") or {}).get("matchNames") != ["coloc"]:
        fail(path, "namespaceSelector should name the coloc namespace")
    ports = [e.get("port") for e in spec.get("endpoints") or []]
    if ports != ["metrics"] or spec["endpoints"][0].get("path") != "/metrics":
        fail(path, f"endpoints {spec.get('endpoints')}, expected the metrics port at /metrics")
    print("  monitoring/servicemonitor.yaml: selects the Service, scrapes metrics")


def main():
    root, rendered = sys.argv[1], sys.argv[2]
    check_service_monitor(root)
    defaults = check_example_toml(root)
    if defaults:
        print(f"  coloc.example.toml: {len(defaults)} keys, same as src/settings/mod.rs DEFAULTS")
    for file in sorted(os.listdir(rendered)):
        if file.endswith(".yaml"):
            check_render(file[: -len(".yaml")], os.path.join(rendered, file), defaults)
    for e in errors:
        print(f"ERROR {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
