//! The manifests' containers run as their pods would, in lab namespaces instead of pods: each
//! container's exact `command` + `args`, with only the environment its pod gets (the
//! ConfigMap's data, JOB_COMPLETION_INDEX for an Indexed Job's pod, the image's PATH), as the
//! user and groups of its securityContext, on a read-only root with its volumes mounted where
//! its volumeMounts say (the Secret's file root-owned and group-readable as the kubelet writes
//! it under fsGroup, an emptyDir, the shared reports volume), its own host name, and the
//! Services' names resolved to the namespaces that stand for them. Only sizes are changed
//! (connections, rate, duration, limits), never a command. So a typo in a command line, a
//! path no volume backs, a key the key-file rule refuses or a shard expression off by one
//! fails here.

use super::{container, pod, Manifests};
use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::peer::{listening, u};
use serde_json::Value;
use tcpkit_lab::{Host, KillOnDrop, Lab};

/// The volume a container's mount `mount` names, in its pod.
fn volume_of<'a>(workload: &'a Value, mount: &Value) -> &'a Value {
    pod(workload)["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {} in {workload:#}", mount["name"]))
}

/// The run's sizes: small, so the whole fleet run takes about a second.
const SIZES: [(&str, &str); 4] = [
    ("CONNECTIONS", "30"),
    ("RATE", "600"),
    ("DURATION", "1s"),
    ("MERGE_LIMITS", "--max-errors 0 --min-answered-rate 100"),
];

/// The image's PATH (Debian's), with the directory of the binary under test first, where the
/// image has /usr/bin/tcpkit.
fn image_path() -> String {
    let bin = Path::new(common::tcpkit()).parent().unwrap();
    format!(
        "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        bin.display()
    )
}

/// Where the lab's pods are: the host standing for each, the /etc/hosts that resolves the
/// Services' names, the host directories behind the volumes, the fleet's environment.
struct Cluster {
    dir: tempfile::TempDir,
    hosts_file: PathBuf,
    reports: PathBuf,
    key: Vec<u8>,
    env: BTreeMap<String, String>,
}

impl Cluster {
    /// The command that runs `workload`'s container in `host` as pod `name`, `extra` added to
    /// its environment; stdout and stderr to files of the pod's own.
    fn pod(
        &self,
        m: &Manifests,
        workload: &str,
        host: &Host,
        name: &str,
        extra: &[(&str, String)],
    ) -> Command {
        let kind = if workload == "tcpkit-echo" {
            "Deployment"
        } else {
            "Job"
        };
        let w = m.get(kind, workload);
        let c = container(w);
        let sc = &pod(w)["securityContext"];
        let id = |k: &str| {
            sc[k]
                .as_u64()
                .unwrap_or_else(|| panic!("{workload}: no {k}"))
        };
        let (uid, gid) = (id("runAsUser"), id("runAsGroup"));
        let fs_group = sc["fsGroup"].as_u64();
        // Volumes, as the kubelet makes them.
        let mut mounts = String::new();
        for vm in c["volumeMounts"].as_array().into_iter().flatten() {
            let v = volume_of(w, vm);
            let at = vm["mountPath"].as_str().unwrap();
            let src = if v["secret"].is_object() {
                let d = self.dir.path().join(format!("{name}-secret"));
                std::fs::create_dir_all(&d).unwrap();
                // `kubectl create secret generic ... --from-file=key=FILE` (README).
                let f = d.join("key");
                std::fs::write(&f, &self.key).unwrap();
                let mode = v["secret"]["defaultMode"].as_u64().unwrap_or(0o644) as u32;
                // Under fsGroup the kubelet makes the files root:fsGroup and group-readable.
                let (mode, group) = match fs_group {
                    Some(g) => (mode | 0o440, g as u32),
                    None => (mode, 0),
                };
                std::os::unix::fs::chown(&f, Some(0), Some(group)).unwrap();
                std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
                d
            } else if v["emptyDir"].is_object() {
                let d = self
                    .dir
                    .path()
                    .join(format!("{name}-{}", vm["name"].as_str().unwrap()));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
                d
            } else if v["persistentVolumeClaim"].is_object() {
                self.reports.clone()
            } else {
                panic!("{workload}: a volume the run does not make: {v:#}")
            };
            let ro = if vm["readOnly"] == true { " -o ro" } else { "" };
            mounts.push_str(&format!(
                "mkdir -p '{at}' && mount --bind{ro} '{}' '{at}'\n",
                src.display()
            ));
        }
        // `ip netns exec` gives the shell a mount namespace of its own: the mounts below are
        // this pod's alone. The pod's /run is a tmpfs (the volumes are mounted under it), its
        // root read-only (readOnlyRootFilesystem), its host name its own.
        let setup = format!(
            "set -e\n\
             mount -t tmpfs -o mode=755 tmpfs /run\n\
             {mounts}\
             mount --bind '{hosts}' /etc/hosts\n\
             mount -o remount,bind,ro /\n\
             exec unshare --uts sh -c 'hostname \"$0\" && exec \"$@\"' '{name}' \
               setpriv --reuid {uid} --regid {gid} --groups {groups} -- \"$@\"",
            hosts = self.hosts_file.display(),
            groups = fs_group.unwrap_or(gid),
        );
        let argv: Vec<String> = c["command"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(c["args"].as_array().into_iter().flatten())
            .map(|s| s.as_str().unwrap().to_string())
            .collect();
        let mut cmd = host.command(&["sh", "-c", &setup, "pod"]);
        cmd.args(&argv);
        cmd.env_clear()
            .env("PATH", image_path())
            .env("HOSTNAME", name);
        if c["envFrom"].is_array() {
            cmd.envs(&self.env);
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let log =
            |s: &str| std::fs::File::create(self.dir.path().join(format!("{name}.{s}"))).unwrap();
        cmd.stdin(Stdio::null())
            .stdout(log("out"))
            .stderr(log("err"));
        cmd
    }

    fn log(&self, name: &str, stream: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.{stream}")))
            .unwrap_or_default()
    }

    /// Waits for pod `name` at most `limit`; killed past it, and the test fails.
    fn wait(&self, name: &str, child: &mut Child, limit: Duration) -> i32 {
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st.code().unwrap_or(-1);
            }
            if t0.elapsed() > limit {
                let _ = child.kill();
                panic!("{name} ran past {limit:?}: {}", self.log(name, "err"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn the_containers_command_lines_run_a_fleet_as_their_pods_would() {
    let _turn = common::timing_turn();
    let m = Manifests::load();
    let n: u32 = m.config("AGENTS").parse().unwrap();
    // The agents reach the barrier by BARRIER's name and port, as in the cluster (the port is
    // the Service's, which is the container's: the design test checks that).
    let barrier_name = m.config("BARRIER").split_once(':').unwrap().0.to_string();
    let (echo_name, echo_port) = m
        .config("TARGET")
        .split_once(':')
        .map(|(h, p)| (h.to_string(), p.parse::<u16>().unwrap()))
        .unwrap();

    let mut lab = Lab::new("k8s").unwrap_or_else(|e| panic!("{e}"));
    let barrier = lab.host("barrier").unwrap();
    let server = lab.host("server").unwrap();
    let agents: Vec<Host> = (0..n)
        .map(|i| lab.host(&format!("agent{i}")).unwrap())
        .collect();
    let mut all = vec![&barrier, &server];
    all.extend(agents.iter());
    let addrs = lab.lan(&all).unwrap_or_else(|e| panic!("{e}"));

    let dir = tempfile::tempdir().unwrap();
    let hosts_file = dir.path().join("hosts");
    std::fs::write(
        &hosts_file,
        format!(
            "127.0.0.1 localhost\n{} {barrier_name}\n{} {echo_name}\n",
            addrs[0], addrs[1]
        ),
    )
    .unwrap();
    // The reports volume as the kubelet leaves it under fsGroup: group-owned, group-writable.
    let reports = dir.path().join("reports");
    std::fs::create_dir(&reports).unwrap();
    let mut env: BTreeMap<String, String> = m.get("ConfigMap", "tcpkit-fleet")["data"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    for (k, v) in SIZES {
        assert!(env.contains_key(k), "ConfigMap tcpkit-fleet has no {k}");
        env.insert(k.into(), v.into());
    }
    let cl = Cluster {
        dir,
        hosts_file,
        reports: reports.clone(),
        key: b"an example key of 32 bytes, no more\n".to_vec(),
        env,
    };
    let fs_group = pod(m.get("Job", "tcpkit-agents"))["securityContext"]["fsGroup"]
        .as_u64()
        .unwrap() as u32;
    std::os::unix::fs::chown(&reports, Some(0), Some(fs_group)).unwrap();
    std::fs::set_permissions(&reports, std::fs::Permissions::from_mode(0o2775)).unwrap();
    let run = m.config("RUN");

    // The kubelet sets a pod's sysctls in its network namespace.
    for a in &agents {
        for s in pod(m.get("Job", "tcpkit-agents"))["securityContext"]["sysctls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            a.sysctl(s["name"].as_str().unwrap(), s["value"].as_str().unwrap())
                .unwrap();
        }
    }

    let echo = KillOnDrop(
        cl.pod(&m, "tcpkit-echo", &server, "echo", &[])
            .spawn()
            .unwrap(),
    );
    assert!(
        listening(&agents[0], (addrs[1], echo_port).into()),
        "echo: {}",
        cl.log("echo", "err")
    );
    let mut barrier_pod = KillOnDrop(
        cl.pod(&m, "tcpkit-barrier", &barrier, "barrier", &[])
            .spawn()
            .unwrap(),
    );
    let t0 = Instant::now();
    let mut pods: Vec<KillOnDrop> = agents
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let name = format!("tcpkit-agents-{i}");
            KillOnDrop(
                cl.pod(
                    &m,
                    "tcpkit-agents",
                    h,
                    &name,
                    &[("JOB_COMPLETION_INDEX", i.to_string())],
                )
                .spawn()
                .unwrap(),
            )
        })
        .collect();
    for (i, p) in pods.iter_mut().enumerate() {
        let name = format!("tcpkit-agents-{i}");
        let code = cl.wait(&name, &mut p.0, Duration::from_secs(20));
        assert_eq!(code, 0, "{name}: {}", cl.log(&name, "err"));
    }
    let code = cl.wait("barrier", &mut barrier_pod.0, Duration::from_secs(5));
    let blog = cl.log("barrier", "err");
    assert_eq!(code, 0, "barrier: {blog}");
    assert!(
        blog.contains(&format!("tcpkit barrier: all {n} agents ready, start at ")),
        "{blog}"
    );
    let took = t0.elapsed();

    // Each report whole, under its shard's name; index I ran shard I+1 of N, all in one run.
    let dir = reports.join(&run);
    let mut answered = 0;
    let mut run_ids = Vec::new();
    for i in 0..n {
        let k = i + 1;
        assert!(!dir.join(format!("shard-{k}.json.part")).exists());
        let f = dir.join(format!("shard-{k}.json"));
        let r: Value = serde_json::from_slice(
            &std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display())),
        )
        .unwrap();
        assert_eq!(r["shard"]["index"], k, "{r:#}");
        assert_eq!(r["shard"]["count"], n, "{r:#}");
        assert_eq!(r["fleet"]["host"], format!("tcpkit-agents-{i}"));
        // Owner-only, as the umask in the command makes it.
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o077, 0);
        run_ids.push(r["fleet"]["run_id"].clone());
        answered += u(&r, "queries.answered");
    }
    run_ids.dedup();
    assert_eq!(run_ids.len(), 1, "one fleet run: {run_ids:?}");
    assert!(answered > 0);

    // Echo's own count (its summary on SIGTERM, as `kubectl logs` shows it) is the agents'.
    // SAFETY: kill(2) on our own child (the exec chain ends in tcpkit echo itself).
    unsafe { libc::kill(echo.0.id() as i32, libc::SIGTERM) };
    let mut echo = echo;
    assert_eq!(cl.wait("echo", &mut echo.0, Duration::from_secs(10)), 0);
    let elog = cl.log("echo", "out");
    let served: u64 = elog
        .lines()
        .find_map(|l| l.strip_prefix("DNS: ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("echo's summary: {elog}"));
    assert_eq!(served, answered);

    // The merge Job: its exit status is the verdict, its merged report the echo's count.
    let merge = |limits: &str| -> (i32, String) {
        let mut c = cl.pod(
            &m,
            "tcpkit-merge",
            &barrier,
            "merge",
            &[("MERGE_LIMITS", limits.to_string())],
        );
        let mut child = c.spawn().unwrap();
        (
            cl.wait("merge", &mut child, Duration::from_secs(10)),
            cl.log("merge", "err"),
        )
    };
    let (code, err) = merge(SIZES[3].1);
    assert_eq!(code, 0, "{err}");
    let merged: Value =
        serde_json::from_slice(&std::fs::read(dir.join("merged.json")).unwrap()).unwrap();
    assert_eq!(u(&merged, "queries.answered"), served, "{merged:#}");
    assert!(dir.join("fleet.svg").exists());
    let (code, err) = merge("--min-answered-rate 10000000");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.trim_end().lines().last().unwrap().contains("answered"),
        "{err}"
    );
    eprintln!("fleet of {n} from the manifests' command lines: {took:?}");
}
