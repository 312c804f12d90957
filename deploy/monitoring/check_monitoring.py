"""Checks deploy/monitoring offline: the Grafana dashboard's shape, every PromQL expression of
the dashboard and the alert rules through `promtool check rules` (the dashboard's as recording
rules in a scratch file), and every metric they name against a live scrape of the service.

Usage: check_monitoring.py ROOT WORKDIR METRICS_TEXT_FILE
"""
import json
import os
import re
import subprocess
import sys

import yaml

root, work, scrape_file = sys.argv[1:4]
errors = []
monitoring = os.path.join(root, "deploy/monitoring")

with open(os.path.join(monitoring, "grafana-dashboard.json")) as f:
    dashboard = json.load(f)
for key in ("title", "uid", "panels", "schemaVersion"):
    if key not in dashboard:
        errors.append(f"dashboard: no {key}")
exprs = []
ids = set()
for panel in dashboard.get("panels", []):
    if panel["id"] in ids:
        errors.append(f"dashboard: panel id {panel['id']} twice")
    ids.add(panel["id"])
    if not panel.get("targets"):
        errors.append(f"dashboard: panel {panel['title']!r} has no query")
    exprs += [t["expr"] for t in panel.get("targets", [])]
exprs += [a["expr"] for a in dashboard.get("annotations", {}).get("list", []) if "expr" in a]

scratch = os.path.join(work, "dashboard-rules.yaml")
with open(scratch, "w") as f:
    yaml.safe_dump(
        {"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:expr{i}", "expr": e} for i, e in enumerate(exprs)]}]},
        f,
    )
alerts = os.path.join(monitoring, "coloc-alerts.yaml")
for path in (alerts, scratch):
    result = subprocess.run(["promtool", "check", "rules", path], capture_output=True, text=True)
    if result.returncode != 0:
        errors.append(f"promtool check rules {path}:\n{result.stdout}{result.stderr}")
with open(alerts) as f:
    exprs += [r["expr"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]]

# Every metric named must be one the service exports: seen in a live scrape, or registered in
# src/metrics.rs (a labelled metric shows in a scrape only once it has a value, e.g. per GPU
# model once a model exists), or Prometheus' own `up`.
with open(scrape_file) as f:
    exported = {line.split("{")[0].split(" ")[0] for line in f if line.strip() and not line.startswith("#")}
with open(os.path.join(root, "src/metrics.rs")) as f:
    registered = set(re.findall(r'"((?:coloc|grpc_server)_[a-z_]+)"', f.read()))
suffixed = {name + suffix for name in registered for suffix in ("_bucket", "_sum", "_count")}
if not any(name.startswith("grpc_server_handled_total") for name in exported):
    errors.append("the live scrape has no grpc_server_handled_total: was it taken from coloc?")
known = exported | registered | suffixed | {"up"}
functions = {"sum", "rate", "increase", "histogram_quantile", "changes", "by", "on", "and",
             "or", "unless", "without", "le", "max", "min", "avg", "count", "humanizePercentage"}
for expr in exprs:
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    without_groupings = re.sub(r"\b(by|on|without)\s*\([^)]*\)", "", without_ranges)
    for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_groupings):
        if name in functions or name in known:
            continue
        errors.append(f"{expr!r} names {name}, which the service does not export")

for e in errors:
    print(f"ERROR {e}", file=sys.stderr)
if not errors:
    print(f"  dashboard: {len(dashboard['panels'])} panels; {len(exprs)} expressions pass promtool "
          f"and name only exported metrics")
sys.exit(1 if errors else 0)
