// Validates each serving.knative.dev/v1 Service in the YAML files named on the command line with
// @kubernetes-models/knative: validators generated from Knative serving's Go API types
// (knative.dev/serving/pkg/apis/serving/v1, the embedded core PodSpec included). Types, formats
// (int32/int64), enums and required fields are checked.
//
// Knative's defaulting webhook fills in two fields before it validates, which the generated core
// PodSpec schema requires: a container's name ("user-container") and an HTTP/TCP probe's port
// (the serving port). They are filled in the same way here, so a manifest that leaves them out
// (as Knative's own docs do) is judged as Knative judges it; nothing else is changed.
//
// Prints one JSON line per Service: {"file", "name", "errors": [{"path", "message"}]}; exit 1 if
// any Service has errors or a file holds none.
import fs from "node:fs";
import yaml from "js-yaml";
import { Service } from "@kubernetes-models/knative/serving.knative.dev/v1/Service";

function knativeDefaults(doc) {
  const copy = structuredClone(doc);
  const spec = copy?.spec?.template?.spec;
  for (const container of spec?.containers ?? []) {
    container.name ??= "user-container";
    const port = container.ports?.[0]?.containerPort ?? 8080;
    for (const probe of [container.readinessProbe, container.livenessProbe, container.startupProbe]) {
      if (probe?.httpGet) probe.httpGet.port ??= port;
      if (probe?.tcpSocket) probe.tcpSocket.port ??= port;
    }
  }
  return copy;
}

let failed = false;
for (const file of process.argv.slice(2)) {
  const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter(Boolean);
  const services = docs.filter((d) => d.apiVersion === "serving.knative.dev/v1" && d.kind === "Service");
  if (services.length === 0) {
    console.log(JSON.stringify({ file, name: null, errors: [{ path: "", message: "no serving.knative.dev/v1 Service" }] }));
    failed = true;
  }
  for (const doc of services) {
    let errors = [];
    try {
      new Service(knativeDefaults(doc)).validate();
    } catch (e) {
      errors = (e.errors ?? [{ instancePath: "", message: String(e.message ?? e) }]).map((x) => ({
        path: x.instancePath, message: x.message,
      }));
    }
    failed ||= errors.length > 0;
    console.log(JSON.stringify({ file, name: doc.metadata?.name ?? null, errors }));
  }
}
process.exit(failed ? 1 : 0);
