//! The chart as rendered (`helm/rendered/`, drift-checked against a fresh
//! render by `scripts/chart-test.py`): the cluster fixture's RBAC and
//! DaemonSet Pod templates (the `kube_ovn` module) and the lab's agent,
//! cleanup and controller processes are taken from it, so what the tests
//! exercise is what the chart deploys.
//!
//! A container becomes a [`Process`]: its command, its arguments and its
//! environment with the downward API resolved against a [`PodFields`], as
//! the kubelet would start it. A simulated node changes only what a
//! simulation must (where its namespaces, sockets and files are) with
//! [`Process::set`], which replaces the chart's flag rather than adding a
//! second one.

use std::path::Path;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Container;
use serde_json::Value;

/// The kube-ovn-cni DaemonSet's Pod template as the chart renders it
/// (SPEC §9). Defined beside the renderer it selects; the cluster fixture
/// (the `kube_ovn` module) applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// IPsec enabled: the `ipsec` agent container beside the CNI server.
    Ipsec,
    /// IPsec disabled after it was enabled: the `ipsec-cleanup` init
    /// container instead of the agent.
    Cleanup,
}

/// The default values' render: IPsec off with the previous state unknown
/// offline, so the `ipsec-cleanup` init container ([`Shape::Cleanup`]).
const DEFAULTS: &str = include_str!("../../helm/rendered/kube-ovn-ipsec.yaml");
/// The render with IPsec on (Kube-OVN v2 values): the `ipsec` container
/// ([`Shape::Ipsec`]).
const ENABLED: &str = include_str!("../../helm/rendered/kube-ovn-ipsec-enabled.yaml");

/// The agent's container in the DaemonSet.
pub const CONTAINER_AGENT: &str = "ipsec";
/// The one-shot cleanup init container in the DaemonSet.
pub const CONTAINER_CLEANUP: &str = "ipsec-cleanup";
/// The controller's container in its Deployment.
pub const CONTAINER_CONTROLLER: &str = "controller";

/// Why a render, or a container of it, cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChartError {
    /// The text is not a YAML stream of objects.
    #[error("the rendered chart is not a YAML stream of objects: {0}")]
    Yaml(String),
    /// An object or field the caller needs is not in the render.
    #[error("the rendered chart has no {0}")]
    Missing(String),
    /// Something in the render this module cannot turn into a process.
    #[error("{what}: {reason}")]
    Unsupported {
        /// Which container or field.
        what: String,
        /// Why.
        reason: String,
    },
}

/// One render of the chart: its objects in template order.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    objects: Vec<Value>,
}

/// The RBAC kinds [`Rendered::rbac`] returns, in the order they can be
/// created (subjects before bindings).
const RBAC_KINDS: [&str; 5] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

impl Rendered {
    /// Parses a multi-document render; empty documents (a template that
    /// rendered nothing) are skipped.
    pub fn parse(text: &str) -> Result<Self, ChartError> {
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(text).map_err(|e| ChartError::Yaml(e.to_string()))?;
        let objects: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
        for (i, o) in objects.iter().enumerate() {
            if o["kind"].as_str().is_none() || o["metadata"]["name"].as_str().is_none() {
                return Err(ChartError::Yaml(format!(
                    "document {} has no kind or metadata.name",
                    i + 1
                )));
            }
        }
        Ok(Self { objects })
    }

    /// The committed render of `shape`.
    pub fn of(shape: Shape) -> Result<&'static Rendered, ChartError> {
        static DEFAULTS_R: OnceLock<Result<Rendered, ChartError>> = OnceLock::new();
        static ENABLED_R: OnceLock<Result<Rendered, ChartError>> = OnceLock::new();
        let (cell, text) = match shape {
            Shape::Ipsec => (&ENABLED_R, ENABLED),
            Shape::Cleanup => (&DEFAULTS_R, DEFAULTS),
        };
        cell.get_or_init(|| Rendered::parse(text))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Every object, in template order.
    pub fn objects(&self) -> &[Value] {
        &self.objects
    }

    /// The object of `kind` named `name`.
    pub fn find(&self, kind: &str, name: &str) -> Result<&Value, ChartError> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .ok_or_else(|| ChartError::Missing(format!("{kind} {name}")))
    }

    /// The only object of `kind`.
    fn only(&self, kind: &str) -> Result<&Value, ChartError> {
        let mut all = self.objects.iter().filter(|o| o["kind"] == kind);
        match (all.next(), all.next()) {
            (Some(o), None) => Ok(o),
            (None, _) => Err(ChartError::Missing(kind.to_owned())),
            (Some(_), Some(_)) => Err(ChartError::Unsupported {
                what: kind.to_owned(),
                reason: "more than one in the render".into(),
            }),
        }
    }

    /// The ServiceAccounts, Roles, ClusterRoles and their bindings, in the
    /// order they can be created.
    pub fn rbac(&self) -> Vec<Value> {
        RBAC_KINDS
            .iter()
            .flat_map(|kind| self.objects.iter().filter(move |o| o["kind"] == *kind))
            .cloned()
            .collect()
    }

    /// The DaemonSet's Pod spec (`spec.template.spec`).
    pub fn daemon_set_pod_spec(&self) -> Result<&Value, ChartError> {
        let spec = &self.only("DaemonSet")?["spec"]["template"]["spec"];
        if spec.is_object() {
            Ok(spec)
        } else {
            Err(ChartError::Missing("DaemonSet spec.template.spec".into()))
        }
    }

    /// The DaemonSet's name.
    pub fn daemon_set_name(&self) -> Result<&str, ChartError> {
        name_of(self.only("DaemonSet")?)
    }

    /// The ServiceAccount the DaemonSet's Pods run as.
    pub fn daemon_set_service_account(&self) -> Result<&str, ChartError> {
        self.daemon_set_pod_spec()?["serviceAccountName"]
            .as_str()
            .ok_or_else(|| ChartError::Missing("DaemonSet serviceAccountName".into()))
    }

    /// The ServiceAccount the controller's Deployment runs as.
    pub fn controller_service_account(&self) -> Result<&str, ChartError> {
        self.only("Deployment")?["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .ok_or_else(|| ChartError::Missing("Deployment serviceAccountName".into()))
    }

    /// Container (or init container) `name` of the DaemonSet or the
    /// Deployment.
    pub fn container(&self, name: &str) -> Result<Container, ChartError> {
        for kind in ["DaemonSet", "Deployment"] {
            for o in self.objects.iter().filter(|o| o["kind"] == kind) {
                let spec = &o["spec"]["template"]["spec"];
                for list in ["initContainers", "containers"] {
                    let found = spec[list]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|c| c["name"] == name);
                    if let Some(c) = found {
                        return serde_json::from_value(c.clone()).map_err(|e| {
                            ChartError::Unsupported {
                                what: format!("container {name}"),
                                reason: e.to_string(),
                            }
                        });
                    }
                }
            }
        }
        Err(ChartError::Missing(format!("container {name}")))
    }
}

fn name_of(o: &Value) -> Result<&str, ChartError> {
    o["metadata"]["name"]
        .as_str()
        .ok_or_else(|| ChartError::Missing("metadata.name".into()))
}

/// What the downward API gives a container of a Pod.
#[derive(Debug, Clone, Copy)]
pub struct PodFields<'a> {
    /// `spec.nodeName`.
    pub node_name: &'a str,
    /// `metadata.name`.
    pub pod_name: &'a str,
    /// `metadata.namespace`.
    pub namespace: &'a str,
    /// `metadata.uid`.
    pub pod_uid: &'a str,
    /// `metadata.labels['controller-revision-hash']` (a DaemonSet Pod's
    /// template hash).
    pub template_hash: &'a str,
}

/// A container as a process of a simulated node: what the kubelet would
/// exec, with the environment it would set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// The container's command (its image path).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its environment, the downward API resolved.
    pub env: Vec<(String, String)>,
    /// The capabilities its securityContext adds.
    pub capabilities: Vec<String>,
}

impl Process {
    /// `container` started in a Pod with `pod`'s fields. Only what a
    /// process can be given here is accepted: literal values and the
    /// downward API's Pod fields; a Secret or ConfigMap reference, or a
    /// field this simulation has no value for, is an error naming it.
    pub fn of(container: &Container, pod: &PodFields<'_>) -> Result<Self, ChartError> {
        let what = |field: &str| format!("container {}: {field}", container.name);
        let program = match container.command.as_deref() {
            Some([one]) => one.clone(),
            _ => {
                return Err(ChartError::Unsupported {
                    what: what("command"),
                    reason: "expected exactly one element, the binary".into(),
                });
            }
        };
        let mut env = Vec::new();
        for e in container.env.iter().flatten() {
            let value = match (&e.value, &e.value_from) {
                (Some(v), None) => v.clone(),
                (None, Some(from)) => {
                    let path = from
                        .field_ref
                        .as_ref()
                        .map(|f| f.field_path.as_str())
                        .ok_or_else(|| ChartError::Unsupported {
                            what: what(&format!("env {}", e.name)),
                            reason: "only fieldRef sources can be resolved here".into(),
                        })?;
                    field(pod, path).ok_or_else(|| ChartError::Unsupported {
                        what: what(&format!("env {}", e.name)),
                        reason: format!("no value for the downward-API field {path}"),
                    })?
                }
                (None, None) => String::new(),
                (Some(_), Some(_)) => {
                    return Err(ChartError::Unsupported {
                        what: what(&format!("env {}", e.name)),
                        reason: "both value and valueFrom".into(),
                    });
                }
            };
            env.push((e.name.clone(), value));
        }
        let capabilities = container
            .security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.add.clone())
            .unwrap_or_default();
        Ok(Self {
            program,
            args: container.args.clone().unwrap_or_default(),
            env,
            capabilities,
        })
    }

    /// Sets `--flag` to `value` (`None`: a switch without a value),
    /// replacing the chart's `--flag=…` or `--flag` rather than adding a
    /// second one (which the binaries refuse).
    pub fn set(&mut self, flag: &str, value: Option<&str>) -> &mut Self {
        let name = format!("--{flag}");
        let with_value = format!("{name}=");
        self.args
            .retain(|a| a.as_str() != name && !a.starts_with(&with_value));
        self.args.push(match value {
            Some(v) => format!("{name}={v}"),
            None => name,
        });
        self
    }

    /// The value of environment variable `name`, as set.
    pub fn env_value(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The arguments alone that say what the arguments and the environment
    /// together say: each environment variable becomes the flag
    /// `flag_of(name)` names (`--flag=value`), after the chart's own
    /// arguments. A variable no flag reads is an error naming it: a
    /// binary's command line can be checked against the chart this way
    /// (a renamed flag or variable fails in a test, not on a node).
    pub fn as_arguments(
        &self,
        flag_of: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<String>, String> {
        let mut out = self.args.clone();
        for (name, value) in &self.env {
            let flag = flag_of(name)
                .ok_or_else(|| format!("the chart sets {name}, which no flag reads"))?;
            out.push(format!("--{flag}={value}"));
        }
        Ok(out)
    }

    /// [`Process::command`] under `setpriv`, with the capability bounding
    /// set cut to the container's capabilities and `extra`: a root process
    /// then has only those, as in the container (`drop: [ALL]`, `add:`),
    /// and so has every program it starts. `extra` is for what a
    /// simulation needs beyond the container (entering its namespaces).
    pub fn command_with_capabilities(
        &self,
        binary: &Path,
        extra: &[&str],
    ) -> std::process::Command {
        let keep: String = self
            .capabilities
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .map(|c| format!(",+{}", c.to_ascii_lowercase()))
            .collect();
        let mut cmd = std::process::Command::new("setpriv");
        cmd.arg(format!("--bounding-set=-all{keep}"))
            .arg("--")
            .arg(binary);
        self.pass_to(&mut cmd);
        cmd
    }

    /// A command running `binary` (this build's file for the image's
    /// [`Process::program`]) with the arguments and the environment.
    pub fn command(&self, binary: &Path) -> std::process::Command {
        let mut cmd = std::process::Command::new(binary);
        self.pass_to(&mut cmd);
        cmd
    }

    /// Appends the arguments and sets the environment on `cmd`.
    fn pass_to(&self, cmd: &mut std::process::Command) {
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    }
}

/// The downward-API field `path` of `pod`.
fn field(pod: &PodFields<'_>, path: &str) -> Option<String> {
    let v = match path {
        "spec.nodeName" => pod.node_name,
        "metadata.name" => pod.pod_name,
        "metadata.namespace" => pod.namespace,
        "metadata.uid" => pod.pod_uid,
        "metadata.labels['controller-revision-hash']" => pod.template_hash,
        _ => return None,
    };
    Some(v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_ovn::{CNI_SA, CONTROLLER_SA, DAEMON_SET, NS};

    const POD: PodFields<'static> = PodFields {
        node_name: "node-0",
        pod_name: "kube-ovn-cni-abc",
        namespace: NS,
        pod_uid: "0000-1111",
        template_hash: "6d8f9c7b5",
    };

    #[test]
    fn both_renders_parse_and_name_what_the_fixture_uses() {
        for shape in [Shape::Ipsec, Shape::Cleanup] {
            let r = Rendered::of(shape).unwrap();
            assert_eq!(r.daemon_set_name().unwrap(), DAEMON_SET);
            assert_eq!(r.daemon_set_service_account().unwrap(), CNI_SA);
            assert_eq!(r.controller_service_account().unwrap(), CONTROLLER_SA);
            let ds = r.find("DaemonSet", DAEMON_SET).unwrap();
            assert_eq!(ds["metadata"]["namespace"], NS);
            let rbac = r.rbac();
            let kinds: Vec<&str> = rbac.iter().map(|o| o["kind"].as_str().unwrap()).collect();
            assert!(kinds.contains(&"RoleBinding") && kinds.contains(&"ServiceAccount"));
        }
        let on = Rendered::of(Shape::Ipsec).unwrap();
        assert!(on.container(CONTAINER_AGENT).is_ok());
        assert!(on.container(CONTAINER_CLEANUP).is_err());
        let off = Rendered::of(Shape::Cleanup).unwrap();
        assert!(off.container(CONTAINER_CLEANUP).is_ok());
        assert!(off.container(CONTAINER_AGENT).is_err());
    }

    #[test]
    fn a_container_becomes_the_process_the_kubelet_would_start() {
        let on = Rendered::of(Shape::Ipsec).unwrap();
        let mut p = Process::of(&on.container(CONTAINER_AGENT).unwrap(), &POD).unwrap();
        assert_eq!(p.program, "/kube-ovn/kube-ovn-ipsec");
        assert_eq!(p.args.first().map(String::as_str), Some("run"));
        assert_eq!(p.env_value("NODE_NAME"), Some("node-0"));
        assert_eq!(p.env_value("POD_UID"), Some("0000-1111"));
        assert_eq!(p.env_value("POD_TEMPLATE_HASH"), Some("6d8f9c7b5"));
        assert!(p.capabilities.iter().any(|c| c == "NET_ADMIN"));
        // The chart writes its flags as `--flag=value`; a simulated node's
        // replaces the chart's instead of repeating it.
        for a in &p.args[1..] {
            assert!(a.starts_with("--") && a.contains('='), "{a}");
        }
        p.set("status-addr", Some("127.0.0.1:1"))
            .set("verbose", None);
        let status: Vec<&String> = p
            .args
            .iter()
            .filter(|a| a.starts_with("--status-addr"))
            .collect();
        assert_eq!(status, ["--status-addr=127.0.0.1:1"]);
        assert_eq!(p.args.last().map(String::as_str), Some("--verbose"));
        p.set("verbose", None);
        assert_eq!(p.args.iter().filter(|a| *a == "--verbose").count(), 1);

        let line = p
            .as_arguments(|name| (name != "POD_UID").then(|| name.to_lowercase()))
            .unwrap_err();
        assert!(line.contains("POD_UID"), "{line}");
        let line = p.as_arguments(|name| Some(name.to_lowercase())).unwrap();
        assert!(line.contains(&"--node_name=node-0".to_owned()), "{line:?}");
    }

    #[test]
    fn what_cannot_be_resolved_is_refused_by_name() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "x", "command": ["/bin/x"],
            "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
        }))
        .unwrap();
        let e = Process::of(&c, &POD).unwrap_err().to_string();
        assert!(e.contains("env IP") && e.contains("status.podIP"), "{e}");
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "x", "command": ["/bin/x"],
            "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
        }))
        .unwrap();
        assert!(
            Process::of(&c, &POD)
                .unwrap_err()
                .to_string()
                .contains("fieldRef")
        );
        let c: Container =
            serde_json::from_value(serde_json::json!({"name": "x", "command": ["sh", "-c", "x"]}))
                .unwrap();
        assert!(
            Process::of(&c, &POD)
                .unwrap_err()
                .to_string()
                .contains("command")
        );
        assert!(matches!(
            Rendered::parse("kind: [\n"),
            Err(ChartError::Yaml(_))
        ));
        assert!(matches!(
            Rendered::parse("---\napiVersion: v1\n"),
            Err(ChartError::Yaml(_))
        ));
    }
}
