// validate.mjs - checks rendered Kubernetes manifests offline:
//   node validate.mjs FILE.yaml
// 1. every object against the Kubernetes API schema (kubernetes-models),
//    and no field the API does not know (a typo such as `replica:` would
//    otherwise pass: the API server drops unknown fields silently);
// 2. the cross-references a schema cannot see: Service selectors and
//    NetworkPolicy pod selectors select pods of a workload here, named
//    ports exist on those pods, a StatefulSet's service exists, secret
//    volumes name a Secret here, every volumeMount names a volume, probe
//    ports are container ports, workload selectors match their template's
//    labels, and every tcp://NAME[.NS.svc...]:PORT argument names a Service
//    here and one of its ports.
// Prints the HTTP paths the probes and scrape annotations use, one per
// line ("probe /healthz"), for check_k8s.sh to ask a real coordinator;
// exits 1 with every problem listed.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import yaml from "js-yaml";

// The schemas kubernetes-models registers, by id ("io.k8s.api.apps.v1.
// StatefulSetSpec"), read from its _schemas files: each holds one JSON
// object and the register() call naming it.
function loadSchemas() {
  const require = createRequire(import.meta.url);
  const dirs = [
    path.join(path.dirname(require.resolve("kubernetes-models/package.json")), "_schemas"),
    path.join(path.dirname(require.resolve("@kubernetes-models/apimachinery/package.json")), "_schemas"),
  ];
  const byId = new Map();
  for (const dir of dirs)
    for (const f of fs.readdirSync(dir).filter((f) => f.endsWith(".mjs"))) {
      const text = fs.readFileSync(path.join(dir, f), "utf8");
      const body = /const schema = (\{[\s\S]*?\n\});\n/.exec(text);
      const id = /register\("([^"]+)", schema\)/.exec(text);
      if (body && id) byId.set(id[1], JSON.parse(body[1]));
    }
  return byId;
}
const schemas = loadSchemas();
const deref = (s) => (s && s.$ref ? schemas.get(s.$ref.replace(/#$/, "")) : s);
// The schema that is not null among oneOf alternatives (nullable refs).
const pick = (s) => {
  s = deref(s);
  if (s && s.oneOf) s = deref(s.oneOf.find((x) => x.type !== "null"));
  return s;
};
function unknownFields(value, schema, where, out) {
  schema = pick(schema);
  if (!schema || value === null || typeof value !== "object") return;
  if (Array.isArray(value)) {
    value.forEach((v, i) => unknownFields(v, schema.items, `${where}[${i}]`, out));
    return;
  }
  if (!schema.properties) return; // a map (labels, data) or free-form
  for (const [k, v] of Object.entries(value)) {
    if (!(k in schema.properties)) out.push(`${where}.${k} is no field of the API`);
    else unknownFields(v, schema.properties[k], `${where}.${k}`, out);
  }
}
// "apps/v1" StatefulSet -> io.k8s.api.apps.v1.StatefulSet; "v1" is core
function kindSchemaId(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  return `io.k8s.api.${group ? group.split(".")[0] : "core"}.${version}.${kind}`;
}

const file = process.argv[2];
const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter(Boolean);
const problems = [];
const bad = (obj, msg) => problems.push(`${obj.kind}/${obj.metadata?.name}: ${msg}`);

// ---- 1. schema
for (const o of docs) {
  const mod = `kubernetes-models/${o.apiVersion}/${o.kind}`;
  let Model;
  try {
    Model = (await import(mod))[o.kind];
  } catch (e) {
    bad(o, `no schema for ${o.apiVersion} ${o.kind}`);
    continue;
  }
  try {
    new Model(o).validate();
  } catch (e) {
    bad(o, `does not validate: ${e.message}`);
  }
  const id = kindSchemaId(o.apiVersion, o.kind);
  if (!schemas.has(id)) { bad(o, `no schema ${id} to check its fields against`); continue; }
  const unknown = [];
  unknownFields(o, schemas.get(id), "", unknown);
  for (const u of unknown) bad(o, u);
}

// ---- 2. cross-references
const ns = (o) => o.metadata?.namespace ?? "default";
const workloads = docs.filter((o) => ["Deployment", "StatefulSet", "DaemonSet", "Job"].includes(o.kind));
const podsOf = (w) => w.spec.template;
const matches = (sel, labels) => Object.entries(sel ?? {}).every(([k, v]) => labels?.[k] === v);
const portNames = (pod) => new Set(pod.spec.containers.flatMap((c) => (c.ports ?? []).map((p) => p.name)));
const portNumbers = (pod) => new Set(pod.spec.containers.flatMap((c) => (c.ports ?? []).map((p) => p.containerPort)));
const services = docs.filter((o) => o.kind === "Service");
const secrets = new Set(docs.filter((o) => o.kind === "Secret").map((o) => `${ns(o)}/${o.metadata.name}`));
const paths = [];

for (const w of workloads) {
  const pod = podsOf(w);
  if (w.kind !== "Job" && !matches(w.spec.selector?.matchLabels, pod.metadata?.labels))
    bad(w, "its selector does not match its pod template's labels");
  const vols = new Set((pod.spec.volumes ?? []).map((v) => v.name));
  for (const t of w.spec.volumeClaimTemplates ?? []) vols.add(t.metadata.name);
  for (const v of pod.spec.volumes ?? [])
    if (v.secret && !secrets.has(`${ns(w)}/${v.secret.secretName}`))
      bad(w, `volume ${v.name} names Secret ${v.secret.secretName}, which is not here`);
  for (const c of pod.spec.containers) {
    for (const m of c.volumeMounts ?? [])
      if (!vols.has(m.name)) bad(w, `container ${c.name} mounts ${m.name}, which is no volume`);
    for (const probe of [c.readinessProbe, c.livenessProbe, c.startupProbe].filter(Boolean)) {
      const g = probe.httpGet;
      if (!g) continue;
      const ok = typeof g.port === "string" ? portNames(pod).has(g.port) : portNumbers(pod).has(g.port);
      if (!ok) bad(w, `a probe uses port ${g.port}, which container ${c.name} does not have`);
      paths.push(`probe ${g.path}`);
    }
    for (const arg of c.args ?? []) {
      const m = /tcp:\/\/([a-z0-9-]+)(?:\.([a-z0-9-]+))?(?:\.svc[.a-z]*)?:(\d+)/.exec(arg);
      if (!m) continue;
      const [, name, space, port] = m;
      const svc = services.find((s) => s.metadata.name === name && ns(s) === (space ?? ns(w)));
      if (!svc) bad(w, `argument ${arg} names Service ${name}${space ? "." + space : ""}, which is not here`);
      else if (!svc.spec.ports.some((p) => p.port === Number(port)))
        bad(w, `argument ${arg}: Service ${name} has no port ${port}`);
    }
  }
  const ann = pod.metadata?.annotations ?? {};
  if (ann["prometheus.io/scrape"] === "true") {
    if (!portNumbers(pod).has(Number(ann["prometheus.io/port"])))
      bad(w, `prometheus.io/port ${ann["prometheus.io/port"]} is no container port`);
    paths.push(`scrape ${ann["prometheus.io/path"] ?? "/metrics"}`);
  }
  if (w.kind === "StatefulSet" && !services.some((s) => s.metadata.name === w.spec.serviceName && ns(s) === ns(w)))
    bad(w, `serviceName ${w.spec.serviceName} is not a Service here`);
}

for (const s of services) {
  const chosen = workloads.filter((w) => ns(w) === ns(s) && matches(s.spec.selector, podsOf(w).metadata?.labels));
  if (!chosen.length) { bad(s, "its selector matches no pod here"); continue; }
  for (const p of s.spec.ports)
    if (typeof p.targetPort === "string" && !chosen.some((w) => portNames(podsOf(w)).has(p.targetPort)))
      bad(s, `targetPort ${p.targetPort} is no named port of the pods it selects`);
}

for (const np of docs.filter((o) => o.kind === "NetworkPolicy")) {
  const chosen = workloads.filter((w) => ns(w) === ns(np) && matches(np.spec.podSelector?.matchLabels, podsOf(w).metadata?.labels));
  if (!chosen.length) { bad(np, "its podSelector matches no pod here"); continue; }
  for (const rule of np.spec.ingress ?? [])
    for (const p of rule.ports ?? [])
      if (typeof p.port === "string" && !chosen.some((w) => portNames(podsOf(w)).has(p.port)))
        bad(np, `port ${p.port} is no named port of the pods it selects`);
}

for (const p of [...new Set(paths)]) console.log(p);
console.error(`${docs.length} objects: ${docs.map((o) => o.kind).join(", ")}`);
if (problems.length) {
  for (const p of problems) console.error("PROBLEM " + p);
  process.exit(1);
}
