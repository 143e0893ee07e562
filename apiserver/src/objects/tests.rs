use super::*;
use base64::engine::general_purpose::STANDARD;

fn def(i: usize) -> &'static ResourceDef {
    &RESOURCES[i]
}

fn csr_body() -> Value {
    json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": "c"},
        "spec": {"request": STANDARD.encode("-----BEGIN CERTIFICATE REQUEST-----\nx\n-----END CERTIFICATE REQUEST-----\n"),
                 "signerName": "kubeovn.io/signer", "usages": ["ipsec tunnel"],
                 "username": "forged", "groups": ["system:masters"]}})
}

#[test]
fn create_assigns_metadata_and_checks_type() {
    let pods = def(idx::PODS);
    let out = prepare_create(
        pods,
        "ns",
        json!({"metadata": {"generateName": "p-"}, "status": {"phase": "Running"}}),
        &Identity::admin(),
    )
    .unwrap();
    assert!(out["metadata"]["name"].as_str().unwrap().starts_with("p-"));
    assert_eq!(out["metadata"]["namespace"], "ns");
    assert_eq!(out["kind"], "Pod");
    assert_eq!(out["status"], json!({"phase": "Pending"}));
    assert_eq!(out["metadata"]["generation"], 1);
    let err = prepare_create(
        pods,
        "ns",
        json!({"kind": "Node", "metadata": {"name": "x"}}),
        &Identity::admin(),
    )
    .unwrap_err();
    assert_eq!(err.code, 400);
    let err = prepare_create(pods, "ns", json!({"metadata": {}}), &Identity::admin()).unwrap_err();
    assert_eq!(err.code, 422);
    let err = prepare_create(
        pods,
        "ns",
        json!({"metadata": {"name": "x", "namespace": "other"}}),
        &Identity::admin(),
    )
    .unwrap_err();
    assert_eq!(err.code, 400);
    let err = prepare_create(
        pods,
        "ns",
        json!({"metadata": {"name": "Bad_Name"}}),
        &Identity::admin(),
    )
    .unwrap_err();
    assert_eq!(err.code, 422);
    assert!(
        prepare_create(
            def(idx::CLUSTER_ROLES),
            "",
            json!({"metadata": {"name": "system:node"}}),
            &Identity::admin()
        )
        .is_ok()
    );
}

#[test]
fn csr_requester_is_stamped() {
    let id = Identity::service_account("kube-system", "kube-ovn-cni")
        .bound_to_pod("p", "pod-uid", "n1", "");
    let out = prepare_create(def(idx::CSRS), "", csr_body(), &id).unwrap();
    assert_eq!(
        out["spec"]["username"],
        "system:serviceaccount:kube-system:kube-ovn-cni"
    );
    assert!(
        !out["spec"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:masters"))
    );
    assert_eq!(
        out["spec"]["extra"]["authentication.kubernetes.io/pod-uid"],
        json!(["pod-uid"])
    );
    let mut bad = csr_body();
    bad["spec"]["request"] = json!("bm90IGEgY3Ny");
    assert_eq!(
        prepare_create(def(idx::CSRS), "", bad, &id)
            .unwrap_err()
            .code,
        422
    );
}

#[test]
fn update_conflicts_generation_and_status() {
    let ds = def(7);
    let old = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "d", "namespace": "ns", "uid": "u", "resourceVersion": "5", "generation": 1},
        "spec": {"x": 1}, "status": {"numberReady": 1}});
    let mut stale = old.clone();
    stale["metadata"]["resourceVersion"] = json!("4");
    assert_eq!(
        prepare_update(ds, None, "d", &old, stale).unwrap_err().code,
        409
    );
    let mut new = old.clone();
    new["spec"]["x"] = json!(2);
    new["status"]["numberReady"] = json!(9);
    new["metadata"]["uid"] = json!("forged");
    let Write::Put(out) = prepare_update(ds, None, "d", &old, new.clone()).unwrap() else {
        panic!()
    };
    assert_eq!(out["metadata"]["generation"], 2);
    assert_eq!(out["status"]["numberReady"], 1);
    assert_eq!(out["metadata"]["uid"], "u");
    let Write::Put(out) = prepare_update(ds, Some("status"), "d", &old, new).unwrap() else {
        panic!()
    };
    assert_eq!(out["spec"]["x"], 1);
    assert_eq!(out["status"]["numberReady"], 9);
    assert_eq!(out["metadata"]["generation"], 1);
    assert!(matches!(
        prepare_update(ds, None, "d", &old, old.clone()).unwrap(),
        Write::Unchanged
    ));
    let mut renamed = old.clone();
    renamed["metadata"]["name"] = json!("other");
    assert_eq!(
        prepare_update(ds, None, "d", &old, renamed)
            .unwrap_err()
            .code,
        400
    );
}

#[test]
fn finalizers_defer_delete() {
    let cm = def(3);
    let old =
        json!({"metadata": {"name": "c", "uid": "u", "resourceVersion": "1", "finalizers": ["x"]}});
    let Write::Put(marked) = prepare_delete(cm, "c", &old, &json!({})).unwrap() else {
        panic!()
    };
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    let mut cleared = marked.clone();
    cleared["metadata"]["finalizers"] = json!([]);
    assert!(matches!(
        prepare_update(cm, None, "c", &marked, cleared).unwrap(),
        Write::Delete
    ));
    assert_eq!(
        prepare_delete(cm, "c", &old, &json!({"preconditions": {"uid": "zz"}}))
            .unwrap_err()
            .code,
        409
    );
    let plain = json!({"metadata": {"name": "c"}});
    assert!(matches!(
        prepare_delete(cm, "c", &plain, &json!({})).unwrap(),
        Write::Delete
    ));
}

#[test]
fn csr_approval_and_certificate() {
    let csrs = def(idx::CSRS);
    let old = prepare_create(csrs, "", csr_body(), &Identity::admin()).unwrap();
    let cert = STANDARD.encode("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n");
    let mut with_cert = old.clone();
    with_cert["status"] = json!({"certificate": cert});
    assert_eq!(
        prepare_update(csrs, Some("status"), "c", &old, with_cert.clone())
            .unwrap_err()
            .code,
        422
    );
    let mut approve = old.clone();
    approve["status"] =
        json!({"conditions": [{"type": "Approved", "status": "True", "reason": "ok"}]});
    let Write::Put(approved) = prepare_update(csrs, Some("approval"), "c", &old, approve).unwrap()
    else {
        panic!()
    };
    assert_eq!(approved["status"]["conditions"][0]["type"], "Approved");
    // /status cannot approve or deny.
    let mut deny = approved.clone();
    deny["status"]["conditions"] = json!([{"type": "Denied", "status": "True"}]);
    assert!(matches!(
        prepare_update(csrs, Some("status"), "c", &approved, deny).unwrap(),
        Write::Unchanged
    ));
    with_cert["status"]["conditions"] = approved["status"]["conditions"].clone();
    let Write::Put(signed) =
        prepare_update(csrs, Some("status"), "c", &approved, with_cert).unwrap()
    else {
        panic!()
    };
    assert_eq!(signed["status"]["certificate"], json!(cert));
    let mut both = approved.clone();
    both["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "Denied", "status": "True"}));
    assert_eq!(
        prepare_update(csrs, Some("approval"), "c", &approved, both)
            .unwrap_err()
            .code,
        422
    );
}

#[test]
fn equal_except_ignores_only_the_named_fields() {
    let a = json!({"metadata": {"rv": "1"}, "status": {"x": 1}, "spec": {"a": 1}});
    let b = json!({"metadata": {"rv": "2"}, "spec": {"a": 1}});
    assert!(equal_except(&a, &b, &["metadata", "status"]));
    assert!(!equal_except(&a, &b, &["metadata"]));
    let c = json!({"metadata": {}, "spec": {"a": 2}});
    assert!(!equal_except(&a, &c, &["metadata", "status"]));
    let d = json!({"metadata": {}, "spec": {"a": 1}, "data": {}});
    assert!(
        !equal_except(&a, &d, &["metadata", "status"]),
        "a key only in one"
    );
    assert!(
        !equal_except(&d, &a, &["metadata", "status"]),
        "a key only in one"
    );
}

#[test]
fn now_is_rfc3339_seconds_and_current() {
    let text = now();
    let parsed = chrono::DateTime::parse_from_rfc3339(&text).unwrap();
    assert!(text.ends_with('Z') && text.len() == 20, "{text}");
    let age = chrono::Utc::now().signed_duration_since(parsed);
    assert!(age >= chrono::TimeDelta::zero() && age < chrono::TimeDelta::seconds(2));
}

#[test]
fn generation_only_on_the_kinds_that_have_one() {
    let by_kind = |kind: &str| RESOURCES.iter().find(|d| d.kind == kind).unwrap();
    for (kind, tracked) in [
        ("ConfigMap", false),
        ("Lease", false),
        ("DaemonSet", true),
        ("CertificateRequest", true),
    ] {
        let d = by_kind(kind);
        // A client-sent generation is never kept.
        let created = prepare_create(
            d,
            "ns",
            json!({"metadata": {"name": "x", "generation": 7}, "spec": {"a": 1}}),
            &Identity::admin(),
        )
        .unwrap();
        let want = if tracked { json!(1) } else { Value::Null };
        assert_eq!(created["metadata"]["generation"], want, "{kind} on create");
        let mut changed = created.clone();
        changed["spec"] = json!({"a": 2});
        let Write::Put(updated) = prepare_update(d, None, "x", &created, changed).unwrap() else {
            panic!("{kind}: a spec change is a write");
        };
        let want = if tracked { json!(2) } else { Value::Null };
        assert_eq!(updated["metadata"]["generation"], want, "{kind} on update");
    }
}
