//! Issue 25, item 6: deploy/kubernetes as a cluster would take it. No cluster runs here, so
//! every manifest is validated offline against the Kubernetes OpenAPI schemas
//! (kubernetes-validate, installed by scripts/setup.sh), and a manifest broken on purpose must
//! fail the same check; the fields the design rests on are read back (Indexed, backoffLimit 0,
//! parallelism = completions = AGENTS, the barrier Service matching the agents' --barrier);
//! and the containers' exact command lines, with the environment and volumes their pods would
//! get, run in lab namespaces against a real barrier and echo (`run`).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{stderr, stdout};
use serde_json::Value;

mod run;

/// Where scripts/setup.sh installs kubernetes-validate (a venv of its own).
const KUBEVAL_VENV: &str = "/opt/tcpkit-kubernetes-validate";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// Every manifest in deploy/kubernetes, in name order.
fn manifest_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .expect("deploy/kubernetes")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no manifests in deploy/kubernetes");
    v
}

fn venv_bin(name: &str) -> PathBuf {
    let p = Path::new(KUBEVAL_VENV).join("bin").join(name);
    assert!(
        p.exists(),
        "{} is not installed: run scripts/setup.sh",
        p.display()
    );
    p
}

/// `kubernetes-validate --strict FILES`: unknown fields are errors too, not only wrong types.
fn validate(files: &[PathBuf]) -> Output {
    Command::new(venv_bin("kubernetes-validate"))
        .arg("--strict")
        .args(files)
        .output()
        .expect("run kubernetes-validate")
}

/// Every document of every manifest, as JSON (read by the PyYAML kubernetes-validate brings:
/// the workspace has no YAML parser, and this one is the validator's own reading).
fn documents() -> Vec<Value> {
    let o = Command::new(venv_bin("python"))
        .args([
            "-c",
            "import json, sys, yaml\n\
             json.dump([d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f))], sys.stdout)",
        ])
        .args(manifest_files())
        .output()
        .expect("run python");
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

/// The manifests' documents, found by kind and name.
struct Manifests(Vec<Value>);

impl Manifests {
    fn load() -> Manifests {
        Manifests(documents())
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.0
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
    }

    /// The fleet's ConfigMap value `key`.
    fn config(&self, key: &str) -> String {
        self.get("ConfigMap", "tcpkit-fleet")["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("ConfigMap tcpkit-fleet has no {key}"))
            .to_string()
    }
}

/// A workload's pod spec (a Job's or a Deployment's template).
fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

/// A pod's one container.
fn container(workload: &Value) -> &Value {
    let cs = pod(workload)["containers"].as_array().expect("containers");
    assert_eq!(cs.len(), 1, "one container: {workload:#}");
    &cs[0]
}

#[test]
fn every_manifest_validates_against_the_kubernetes_schemas_and_a_broken_one_does_not() {
    let files = manifest_files();
    let o = validate(&files);
    let out = format!("{}{}", stdout(&o), stderr(&o));
    assert!(o.status.success(), "{out}");
    // Each resource was checked, not skipped: one "passed" line per document.
    let passed = out.lines().filter(|l| l.contains(" passed for ")).count();
    assert_eq!(passed, documents().len(), "{out}");

    // The validator is real: the agents' Job with a misspelt field, and with a count written
    // as a string, is refused, each error named.
    let dir = tempfile::tempdir().unwrap();
    let agents = std::fs::read_to_string(deploy_dir().join("agents.yaml")).unwrap();
    let breaks = [
        (
            "completionMode:",
            "completionMod:",
            "'completionMod' was unexpected",
        ),
        (
            "backoffLimit: 0",
            "backoffLimit: \"0\"",
            "spec.backoffLimit: '0' is not of type",
        ),
    ];
    let mut broken = Vec::new();
    for (i, (from, to, _)) in breaks.iter().enumerate() {
        assert!(agents.contains(from), "agents.yaml has no {from}");
        let p = dir.path().join(format!("broken-{i}.yaml"));
        std::fs::write(&p, agents.replacen(from, to, 1)).unwrap();
        broken.push(p);
    }
    let o = validate(&broken);
    let out = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(1), "{out}");
    for (_, _, why) in breaks {
        assert!(out.contains(why), "{why}: {out}");
    }
}

#[test]
fn the_fields_the_design_rests_on_hold() {
    let m = Manifests::load();
    let agents_n: u64 = m.config("AGENTS").parse().expect("AGENTS is a number");
    let agents = m.get("Job", "tcpkit-agents");
    let spec = &agents["spec"];
    // Completion index I is shard I+1 of AGENTS, every shard once, all at once, never retried.
    assert_eq!(spec["completionMode"], "Indexed", "{spec:#}");
    assert_eq!(spec["completions"], agents_n, "completions = AGENTS");
    assert_eq!(spec["parallelism"], agents_n, "parallelism = AGENTS");
    assert_eq!(spec["backoffLimit"], 0, "{spec:#}");
    for job in ["tcpkit-agents", "tcpkit-barrier", "tcpkit-merge"] {
        let j = m.get("Job", job);
        assert_eq!(j["spec"]["backoffLimit"], 0, "{job}");
        // OnFailure would restart a container in place: a second run of one shard.
        assert_eq!(pod(j)["restartPolicy"], "Never", "{job}");
    }

    // The agents reach the barrier by its Service: BARRIER is its name and port, the port
    // leads to the barrier container's port, and the Service selects the barrier's pod only.
    let barrier_job = m.get("Job", "tcpkit-barrier");
    let svc = m.get("Service", "tcpkit-barrier");
    let port = &svc["spec"]["ports"][0];
    assert_eq!(
        m.config("BARRIER"),
        format!(
            "{}:{}",
            svc["metadata"]["name"].as_str().unwrap(),
            port["port"]
        )
    );
    let cport = container(barrier_job)["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port["targetPort"])
        .unwrap_or_else(|| panic!("no container port {}", port["targetPort"]));
    // One number throughout, so the run below (no kube-proxy) reaches it as the Service does.
    assert_eq!(cport["containerPort"], port["port"]);
    let selects = |w: &Value| {
        let labels = &w["spec"]["template"]["metadata"]["labels"];
        svc["spec"]["selector"]
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| &labels[k] == v)
    };
    assert!(selects(barrier_job));
    assert!(!selects(agents) && !selects(m.get("Job", "tcpkit-merge")));

    // The same Secret for the barrier and the agents, the same reports volume for the agents
    // and the merge, the same ConfigMap for all.
    let secret = |w: &Value| -> String {
        let vs = pod(w)["volumes"].as_array().unwrap();
        let v = vs.iter().find(|v| v["secret"].is_object()).expect("secret");
        v["secret"]["secretName"].as_str().unwrap().into()
    };
    assert_eq!(secret(agents), secret(barrier_job));
    let claim = |w: &Value| -> String {
        let vs = pod(w)["volumes"].as_array().unwrap();
        let v = vs.iter().find(|v| v["persistentVolumeClaim"].is_object());
        v.expect("reports volume")["persistentVolumeClaim"]["claimName"]
            .as_str()
            .unwrap()
            .into()
    };
    let pvc = m.get("PersistentVolumeClaim", "tcpkit-reports");
    assert_eq!(claim(agents), pvc["metadata"]["name"]);
    assert_eq!(claim(m.get("Job", "tcpkit-merge")), pvc["metadata"]["name"]);
    let workloads = [
        agents,
        barrier_job,
        m.get("Job", "tcpkit-merge"),
        m.get("Deployment", "tcpkit-echo"),
    ];
    for w in workloads {
        let c = container(w);
        if let Some(from) = c["envFrom"].as_array() {
            assert_eq!(from[0]["configMapRef"]["name"], "tcpkit-fleet");
        }
        // No privilege anywhere: load, echo, the barrier and merge need none.
        let sc = &c["securityContext"];
        assert_eq!(pod(w)["securityContext"]["runAsNonRoot"], true);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert!(sc["privileged"].is_null() && sc["capabilities"]["add"].is_null());
        assert_eq!(pod(w)["automountServiceAccountToken"], false);
    }
    // The reference server is the one TARGET names.
    let echo = m.get("Service", "tcpkit-echo");
    assert_eq!(
        m.config("TARGET"),
        format!(
            "{}:{}",
            echo["metadata"]["name"].as_str().unwrap(),
            echo["spec"]["ports"][0]["port"]
        )
    );
}
