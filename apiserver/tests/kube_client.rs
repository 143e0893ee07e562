//! kube-rs against the embedded API server: CRUD, patches, conflicts, watches,
//! reflectors across a forced 410, CSR approval and signing, RBAC, identity stamping.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use apiserver::{ADMIN_TOKEN, EXTRA_POD_UID, Identity};
use common::{certificate, csr, eventually, server};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{ObjectMeta, Status};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([("app".to_string(), "lab".to_string())])),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn api_err(e: kube::Error) -> Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn crud_and_selectors() {
    let s = server(false, &[]).await;
    let client = s.client(ADMIN_TOKEN).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = cms
        .create(&PostParams::default(), &cm("a", &[("k", "v")]))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, None, "ConfigMaps have no generation");
    let got = cms.get("a").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v");

    let mut gen_named = cm("", &[]);
    gen_named.metadata.name = None;
    gen_named.metadata.generate_name = Some("gen-".into());
    gen_named.metadata.labels = None;
    let g = cms
        .create(&PostParams::default(), &gen_named)
        .await
        .unwrap();
    assert!(g.metadata.name.unwrap().starts_with("gen-"));

    assert_eq!(
        cms.list(&ListParams::default().labels("app=lab"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        cms.list(&ListParams::default().labels("app!=lab"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        cms.list(&ListParams::default().fields("metadata.name=a"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let all: Api<ConfigMap> = Api::all(client.clone());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );

    let mut replaced = got_again(&cms).await;
    replaced.data = Some(BTreeMap::from([("k".to_string(), "v2".to_string())]));
    let r = cms
        .replace("a", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(r.data.unwrap()["k"], "v2");

    // A stale resourceVersion is a 409 Conflict.
    let err = api_err(
        cms.replace("a", &PostParams::default(), &replaced)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));

    cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_err(cms.get("a").await.unwrap_err()).code, 404);
    s.shutdown().await;
}

async fn got_again(cms: &Api<ConfigMap>) -> ConfigMap {
    cms.get("a").await.unwrap()
}

#[tokio::test]
async fn list_at_exact_resource_version() {
    let s = server(false, &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    let a = cms
        .create(&PostParams::default(), &cm("a", &[("k", "1")]))
        .await
        .unwrap();
    let rv = a.metadata.resource_version.clone().unwrap();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    cms.create(&PostParams::default(), &cm("b", &[]))
        .await
        .unwrap();
    let old = cms
        .list(
            &ListParams::default()
                .at(&rv)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await
        .unwrap();
    assert_eq!(old.items.len(), 1);
    assert_eq!(old.items[0].data.as_ref().unwrap()["k"], "1");
    s.store().compact();
    let err = api_err(
        cms.list(
            &ListParams::default()
                .at(&rv)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn patches_merge_json_strategic_and_status() {
    let s = server(false, &[]).await;
    let pods: Api<Pod> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "labels": {"a": "1"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c1", "image": "i1"}, {"name": "c2", "image": "i2"}]},
        "status": {"phase": "Running"}
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(
        created.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "create resets status"
    );

    let pp = PatchParams::default();
    let p = pods
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"b": "2", "a": null}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        p.metadata.labels.unwrap(),
        BTreeMap::from([("b".to_string(), "2".to_string())])
    );

    let p = pods
        .patch(
            "p",
            &pp,
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "c2", "image": "i2b"}]}})),
        )
        .await
        .unwrap();
    let images: Vec<_> = p
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.image.unwrap())
        .collect();
    assert_eq!(
        images,
        ["i1", "i2b"],
        "strategic merge keeps c1, merges c2 by name"
    );
    assert_eq!(p.metadata.generation, Some(2));

    let jp: json_patch::Patch = serde_json::from_value(json!([
        {"op": "replace", "path": "/spec/containers/0/image", "value": "i1c"}
    ]))
    .unwrap();
    let p = pods.patch("p", &pp, &Patch::<()>::Json(jp)).await.unwrap();
    assert_eq!(p.spec.unwrap().containers[0].image.as_deref(), Some("i1c"));

    // Main writes never touch status; /status writes touch only status.
    let p = pods
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    let p = pods
        .patch_status(
            "p",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Running"}, "spec": {"nodeName": "n2"}})),
        )
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(p.spec.unwrap().node_name.as_deref(), Some("n1"));

    // A resourceVersion in a patch is a precondition.
    let err = api_err(
        pods.patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1", "labels": {"c": "3"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    s.shutdown().await;
}

#[tokio::test]
async fn finalizers_defer_deletion() {
    let s = server(false, &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    let mut c = cm("f", &[]);
    c.metadata.finalizers = Some(vec!["lab/keep".into()]);
    cms.create(&PostParams::default(), &c).await.unwrap();
    cms.delete("f", &DeleteParams::default()).await.unwrap();
    let marked = cms.get("f").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    cms.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_err(cms.get("f").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn watch_events_and_bookmarks() {
    let s = apiserver::ApiServer::builder()
        .bookmark_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    let list = cms.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut stream = cms
        .watch(&WatchParams::default().labels("app=lab").timeout(2), &rv)
        .await
        .unwrap()
        .boxed();
    cms.create(&PostParams::default(), &cm("w", &[]))
        .await
        .unwrap();
    cms.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "y"}})),
    )
    .await
    .unwrap();
    cms.delete("w", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = stream.try_next().await.unwrap() {
        seen.push(match ev {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Modified(_) => "MODIFIED",
            WatchEvent::Deleted(_) => "DELETED",
            WatchEvent::Bookmark(_) => "BOOKMARK",
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        });
    }
    let changes: Vec<_> = seen.iter().copied().filter(|t| *t != "BOOKMARK").collect();
    assert_eq!(changes, ["ADDED", "MODIFIED", "DELETED"]);
    assert!(
        seen.iter().filter(|t| **t == "BOOKMARK").count() >= 2,
        "periodic and final bookmarks: {seen:?}"
    );
    assert_eq!(seen.last(), Some(&"BOOKMARK"));

    // Watching from a compacted resourceVersion: 200 with an ERROR 410 event.
    s.store().compact();
    let mut stream = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn reflector_survives_forced_410() {
    let s = server(false, &[]).await;
    let client = s.client(ADMIN_TOKEN).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("before", &[]))
        .await
        .unwrap();
    let (reader, writer) = reflector::store::<ConfigMap>();
    let errors = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let errs = errors.clone();
    let stream = reflector(
        writer,
        watcher(cms.clone(), watcher::Config::default().timeout(2)),
    )
    .default_backoff()
    .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if item.is_err() {
                errs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let names = |r: &reflector::Store<ConfigMap>| {
        let mut v: Vec<String> = r
            .state()
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        v.sort();
        v
    };
    reader.wait_until_ready().await.unwrap();
    eventually("initial object", || names(&reader) == ["before"]).await;

    s.store().compact();
    cms.delete("before", &DeleteParams::default())
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("after", &[]))
        .await
        .unwrap();
    eventually("relisted state", || names(&reader) == ["after"]).await;
    // Survives more writes and watch timeouts (re-watch from its bookmark).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    cms.create(&PostParams::default(), &cm("later", &[]))
        .await
        .unwrap();
    eventually("later object", || names(&reader) == ["after", "later"]).await;
    let n = errors.load(std::sync::atomic::Ordering::SeqCst);
    assert!(n <= 1, "one 410 at most, no error loop ({n} errors)");
    task.abort();
}

#[tokio::test]
async fn csr_identity_approval_and_signing() {
    let cni = Identity::service_account("kube-system", "kube-ovn-cni").bound_to_pod(
        "cni-x",
        "pod-uid-1",
        "node1",
        "node-uid-1",
    );
    let approver_only = Identity::user("approver-no-signer");
    let controller = Identity::service_account("kube-system", "ovn-ipsec-controller");
    let s = server(
        true,
        &[("cni", cni), ("weak", approver_only), ("ctl", controller)],
    )
    .await;
    let admin = s.client(ADMIN_TOKEN).await.unwrap();
    let rbac = json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "csr-create"},
         "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["create", "get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "cni-csr"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "csr-create"},
         "subjects": [{"kind": "ServiceAccount", "name": "kube-ovn-cni", "namespace": "kube-system"}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "csr-approval"},
         "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval", "certificatesigningrequests/status"], "verbs": ["update", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "signer"},
         "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "resourceNames": ["kubeovn.io/signer"], "verbs": ["approve", "sign"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "approval"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "csr-approval"},
         "subjects": [{"kind": "User", "name": "approver-no-signer"},
                      {"kind": "ServiceAccount", "name": "ovn-ipsec-controller", "namespace": "kube-system"}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "signer"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "signer"},
         "subjects": [{"kind": "ServiceAccount", "name": "ovn-ipsec-controller", "namespace": "kube-system"}]}
    ]);
    for obj in rbac.as_array().unwrap() {
        let gvk: kube::core::GroupVersionKind = kube::core::GroupVersionKind::gvk(
            "rbac.authorization.k8s.io",
            "v1",
            obj["kind"].as_str().unwrap(),
        );
        let ar = kube::core::ApiResource::from_gvk(&gvk);
        let api: Api<kube::core::DynamicObject> = Api::all_with(admin.clone(), &ar);
        api.create(
            &PostParams::default(),
            &serde_json::from_value(obj.clone()).unwrap(),
        )
        .await
        .unwrap();
    }

    // The requester is stamped from the token; a forged username is ignored.
    let cni_csrs: Api<CertificateSigningRequest> = Api::all(s.client("cni").await.unwrap());
    let mut body = csr("node1-ipsec", "node1");
    body["spec"]["username"] = json!("system:admin");
    body["spec"]["groups"] = json!(["system:masters"]);
    let created = cni_csrs
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    let spec = created.spec;
    assert_eq!(
        spec.username.as_deref(),
        Some("system:serviceaccount:kube-system:kube-ovn-cni")
    );
    assert!(!spec.groups.unwrap().contains(&"system:masters".to_string()));
    assert_eq!(
        spec.extra.unwrap()[EXTRA_POD_UID],
        vec!["pod-uid-1".to_string()]
    );
    // The CNI may not approve its own request.
    let approve = json!({"status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Test", "message": "ok"}]}});
    let err = api_err(
        cni_csrs
            .patch_approval(
                "node1-ipsec",
                &PatchParams::default(),
                &Patch::Merge(approve.clone()),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 403);

    // update on /approval without `approve` on the signer: forbidden, like the real admission plugin.
    let weak: Api<CertificateSigningRequest> = Api::all(s.client("weak").await.unwrap());
    let err = api_err(
        weak.patch_approval(
            "node1-ipsec",
            &PatchParams::default(),
            &Patch::Merge(approve.clone()),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 403);
    assert!(err.message.contains("kubeovn.io/signer"), "{}", err.message);

    // A certificate before approval is invalid.
    let ctl: Api<CertificateSigningRequest> = Api::all(s.client("ctl").await.unwrap());
    let cert = json!({"status": {"certificate": certificate("node1")}});
    let err = api_err(
        ctl.patch_status(
            "node1-ipsec",
            &PatchParams::default(),
            &Patch::Merge(cert.clone()),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);

    let approved = ctl
        .patch_approval(
            "node1-ipsec",
            &PatchParams::default(),
            &Patch::Merge(approve),
        )
        .await
        .unwrap();
    let conds = approved.status.unwrap().conditions.unwrap();
    assert_eq!(conds[0].type_, "Approved");
    // The weak approver cannot sign either.
    let err = api_err(
        weak.patch_status(
            "node1-ipsec",
            &PatchParams::default(),
            &Patch::Merge(cert.clone()),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 403);
    let signed = ctl
        .patch_status("node1-ipsec", &PatchParams::default(), &Patch::Merge(cert))
        .await
        .unwrap();
    assert!(signed.status.unwrap().certificate.is_some());

    // Deny path on another request.
    cni_csrs
        .create(
            &PostParams::default(),
            &serde_json::from_value(csr("node1-other", "node1")).unwrap(),
        )
        .await
        .unwrap();
    let deny = json!({"status": {"conditions": [{"type": "Denied", "status": "True", "reason": "Bad", "message": "no"}]}});
    let denied = ctl
        .patch_approval("node1-other", &PatchParams::default(), &Patch::Merge(deny))
        .await
        .unwrap();
    assert_eq!(
        denied.status.unwrap().conditions.unwrap()[0].type_,
        "Denied"
    );
    let err = api_err(
        ctl.patch_status(
            "node1-other",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"certificate": certificate("x")}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    s.shutdown().await;
}

#[tokio::test]
async fn rbac_allows_and_denies() {
    let reader = Identity::service_account("kube-system", "reader");
    let s = server(
        true,
        &[("reader", reader), ("nobody", Identity::user("nobody"))],
    )
    .await;
    let admin = s.client(ADMIN_TOKEN).await.unwrap();
    let roles: Api<k8s_openapi::api::rbac::v1::Role> =
        Api::namespaced(admin.clone(), "kube-system");
    roles
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "cm-read"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"], "resourceNames": []}]})).unwrap())
        .await
        .unwrap();
    let rbs: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(admin.clone(), "kube-system");
    rbs.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "cm-read"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-read"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "kube-system"}]})).unwrap())
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &cm("c", &[]))
        .await
        .unwrap();

    let as_reader = s.client("reader").await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(as_reader.clone(), "kube-system");
    cms.get("c").await.unwrap();
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let err = api_err(cms.delete("c", &DeleteParams::default()).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (403, "Forbidden"));
    assert!(
        err.message
            .contains("cannot delete resource \"configmaps\""),
        "{}",
        err.message
    );
    let err = api_err(
        Api::<ConfigMap>::namespaced(as_reader.clone(), "default")
            .get("x")
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 403);
    let err = api_err(
        Api::<Node>::all(as_reader)
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 403);
    // Authenticated users may read /version and discovery.
    s.client("nobody")
        .await
        .unwrap()
        .apiserver_version()
        .await
        .unwrap();
    let nobody = s.client("nobody").await.unwrap();
    s.remove_token("nobody");
    let err = api_err(nobody.apiserver_version().await.unwrap_err());
    assert_eq!(err.code, 401, "a removed token is unauthenticated");
    assert!(
        s.client("nobody").await.is_err(),
        "kubeconfig for an unknown token is refused"
    );
}

#[tokio::test]
async fn kube_discovery_and_streaming_lists() {
    let s = server(false, &[]).await;
    let client = s.client(ADMIN_TOKEN).await.unwrap();
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    let mut kinds = Vec::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            kinds.push((
                ar.kind.clone(),
                caps.scope == kube::discovery::Scope::Namespaced,
            ));
        }
    }
    for want in [
        ("CertificateSigningRequest", false),
        ("DaemonSet", true),
        ("Lease", true),
        ("ClusterIssuer", false),
        ("Pod", true),
    ] {
        assert!(
            kinds.contains(&(want.0.to_string(), want.1)),
            "{want:?} missing from {kinds:?}"
        );
    }

    // kube-runtime's streaming list (sendInitialEvents + initial-events-end bookmark).
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("s1", &[]))
        .await
        .unwrap();
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(
        writer,
        watcher(cms.clone(), watcher::Config::default().streaming_lists()),
    )
    .default_backoff()
    .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            item.unwrap();
        }
    });
    reader.wait_until_ready().await.unwrap();
    cms.create(&PostParams::default(), &cm("s2", &[]))
        .await
        .unwrap();
    eventually("streamed objects", || reader.state().len() == 2).await;
    task.abort();
}

#[tokio::test]
async fn shutdown_ends_open_watches() {
    let s = server(false, &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    let mut stream = cms
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let started = std::time::Instant::now();
    s.shutdown().await;
    let end = tokio::time::timeout(Duration::from_secs(3), async {
        while let Ok(Some(_)) = stream.try_next().await {}
    })
    .await;
    assert!(end.is_ok(), "the watch stream did not end on shutdown");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn pod_bound_token_is_stamped_on_csr() {
    let s = server(false, &[]).await;
    let admin = s.client(ADMIN_TOKEN).await.unwrap();
    let node = Api::<Node>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node1"}})).unwrap(),
        )
        .await
        .unwrap();
    let pod = Api::<Pod>::namespaced(admin, "kube-system")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "kube-ovn-cni-x"},
                "spec": {"nodeName": "node1", "serviceAccountName": "kube-ovn-cni", "containers": [{"name": "c", "image": "i"}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let token = s.token_for_pod("kube-system", "kube-ovn-cni-x").unwrap();
    assert!(s.token_for_pod("kube-system", "missing").is_err());
    let csrs: Api<CertificateSigningRequest> = Api::all(s.client(&token).await.unwrap());
    let created = csrs
        .create(
            &PostParams::default(),
            &serde_json::from_value(csr("c1", "node1")).unwrap(),
        )
        .await
        .unwrap();
    let extra = created.spec.extra.unwrap();
    assert_eq!(
        created.spec.username.as_deref(),
        Some("system:serviceaccount:kube-system:kube-ovn-cni")
    );
    assert_eq!(extra[EXTRA_POD_UID], vec![pod.metadata.uid.unwrap()]);
    assert_eq!(extra[apiserver::EXTRA_NODE_NAME], vec!["node1".to_string()]);
    assert_eq!(
        extra[apiserver::EXTRA_NODE_UID],
        vec![node.metadata.uid.unwrap()]
    );
}

/// cert-manager's webhook stamps the requester on a CertificateRequest
/// create; the embedded server does the same, so what a client writes into
/// `spec.username/uid/groups/extra` never survives.
#[tokio::test]
async fn certificate_request_requester_is_stamped_from_the_caller() {
    let mut ovn = Identity::service_account("kube-system", "ovn");
    ovn.extra.insert(
        apiserver::EXTRA_CREDENTIAL_ID.into(),
        vec!["JTI=ovn".into()],
    );
    let s = server(false, &[("ovn", ovn.clone())]).await;
    let gvk = kube::api::GroupVersionKind::gvk("cert-manager.io", "v1", "CertificateRequest");
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "certificaterequests");
    let crs: Api<kube::api::DynamicObject> =
        Api::namespaced_with(s.client("ovn").await.unwrap(), "kube-system", &ar);
    let forged: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cert-manager.io/v1", "kind": "CertificateRequest",
        "metadata": {"name": "forged"},
        "spec": {"request": common::csr_request("chassis-0"),
                 "issuerRef": {"name": "kube-ovn", "kind": "ClusterIssuer", "group": "cert-manager.io"},
                 "username": "system:admin", "uid": "forged-uid",
                 "groups": ["system:masters"], "extra": {"k": ["v"]}}
    }))
    .unwrap();
    let created = crs.create(&PostParams::default(), &forged).await.unwrap();
    let stored = crs.get("forged").await.unwrap();
    for (what, obj) in [("create answer", &created), ("stored", &stored)] {
        let spec = &obj.data["spec"];
        assert_eq!(
            spec["username"], "system:serviceaccount:kube-system:ovn",
            "{what}"
        );
        assert_eq!(spec["uid"], json!(ovn.uid), "{what}");
        assert_eq!(spec["groups"], json!(ovn.effective_groups()), "{what}");
        assert_eq!(spec["extra"], json!(ovn.extra), "{what}");
        assert_eq!(
            spec["issuerRef"]["name"], "kube-ovn",
            "{what}: rest of spec"
        );
    }
    // Without a spec at all the requester is still recorded; an identity
    // without extras leaves none.
    let admin: Api<kube::api::DynamicObject> =
        Api::namespaced_with(s.client(ADMIN_TOKEN).await.unwrap(), "kube-system", &ar);
    let bare: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cert-manager.io/v1", "kind": "CertificateRequest",
        "metadata": {"name": "bare"}
    }))
    .unwrap();
    let created = admin.create(&PostParams::default(), &bare).await.unwrap();
    assert_eq!(created.data["spec"]["username"], "kubernetes-admin");
    assert!(created.data["spec"].get("extra").is_none());
    s.shutdown().await;
}

#[tokio::test]
async fn large_updates_stay_within_the_history_bytes_and_expire_what_they_evict() {
    const BOUND: usize = 8 << 20;
    let s = apiserver::ApiServer::builder()
        .history_bytes(BOUND)
        .start()
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    let big = "x".repeat(700_000);
    let first = cms
        .create(&PostParams::default(), &cm("big", &[("v", &big)]))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    // Thirty versions of 700 kB: five times the bound.
    for i in 0..30 {
        cms.patch(
            "big",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": format!("{i}{big}")}})),
        )
        .await
        .unwrap();
        let held = s.store().history_bytes();
        assert!(held <= BOUND, "{held} bytes held after {i} updates");
    }
    assert!(s.store().history_len() < 10, "{}", s.store().history_len());

    // The first version fell out of the bound: a watch from it gets the
    // watch cache's 200 + ERROR 410 Expired, an exact list a 410.
    let mut stream = cms
        .watch(&WatchParams::default(), &first)
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
    let err = api_err(
        cms.list(
            &ListParams::default()
                .at(&first)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (410, "Expired"));
    // The newest version is still a starting point.
    let newest = s.store().resource_version() - 1;
    let events: Vec<_> = cms
        .watch(&WatchParams::default().timeout(1), &newest.to_string())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(
        matches!(
            events.as_slice(),
            [WatchEvent::Modified(_), WatchEvent::Bookmark(_)]
        ),
        "{events:?}"
    );
    s.shutdown().await;
}
